//! A PostgreSQL URL that names several hosts (`postgres://user@db1:5432,db2:5432/asiento`), as
//! libpq's `target_session_attrs=read-write` reads it: connect to whichever host is the primary
//! (accepts writes), and follow the primary when a standby is promoted. sqlx connects to one
//! host, so the pool is pointed at the host found to be the primary, and a watcher looks at it
//! every [`PROBE_MS`]: when that host is gone or in recovery, the watcher finds the one that is
//! the primary now and points the pool there (`Pool::set_connect_options`). Connections to the
//! old primary fail on their next use and are closed; requests meanwhile answer 503 with
//! `Retry-After` (`Problem::server`), and writes resume on the new primary without a restart.
//!
//! Hosts listed rather than a name that moves: no DNS or virtual address to manage, the same
//! URL for libpq tools (`psql`, `pg_dump`) and for asiento, and each process finds the primary
//! itself. Fencing the old primary (it must not come back as a primary) is the operator's part:
//! docs/operations.md.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::StoreError;

/// How often the watcher checks that the pool's host is still the primary.
pub const PROBE_MS: u64 = 500;
/// How long a probe of one host may take (connect and ask) before it counts as down.
const PROBE_TIMEOUT_MS: u64 = 2_000;

/// The hosts of a URL that names several, each as a URL of its own (in the order given); `None`
/// for a URL with one host. A `target_session_attrs` other than `read-write` or `primary` is
/// refused: the pool carries writes.
pub(crate) fn hosts(url: &str) -> Result<Option<Vec<PgConnectOptions>>, StoreError> {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return Ok(None);
    };
    let after_scheme = &url[scheme_end..];
    let authority_end = after_scheme.find(['/', '?']).unwrap_or(after_scheme.len());
    let authority = &after_scheme[..authority_end];
    let (user, host_list) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if !host_list.contains(',') {
        return Ok(None);
    }
    let rest = without_session_attrs(&after_scheme[authority_end..])?;
    host_list
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(StoreError::UnsupportedUrl);
            }
            let single = format!("{}{user}{host}{rest}", &url[..scheme_end]);
            Ok(PgConnectOptions::from_str(&single)?)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The path and query with `target_session_attrs` taken out (it is what this module does).
fn without_session_attrs(path_and_query: &str) -> Result<String, StoreError> {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return Ok(path_and_query.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", "read-write" | "primary")) => {}
            Some(("target_session_attrs", _)) => return Err(StoreError::UnsupportedUrl),
            _ => kept.push(pair),
        }
    }
    Ok(if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    })
}

/// A connection of its own to one host, kept open between probes (a probe every
/// [`PROBE_MS`] must not start a server process each time), reopened after a failure.
#[derive(Default)]
struct Probe(Option<PgConnection>);

impl Probe {
    /// Whether `host` answers and is the primary (not in recovery).
    async fn is_primary(&mut self, host: &PgConnectOptions) -> bool {
        let asked = async {
            let connection = match &mut self.0 {
                Some(connection) => connection,
                None => self.0.insert(PgConnection::connect_with(host).await?),
            };
            let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(connection)
                .await?;
            Ok::<bool, sqlx::Error>(!in_recovery)
        };
        match tokio::time::timeout(Duration::from_millis(PROBE_TIMEOUT_MS), asked).await {
            Ok(Ok(primary)) => primary,
            _ => {
                self.0 = None;
                false
            }
        }
    }
}

/// The first of `hosts` that is the primary now, with the probe's connection left open to it.
async fn find_with(probe: &mut Probe, hosts: &[PgConnectOptions]) -> Option<usize> {
    for (index, host) in hosts.iter().enumerate() {
        probe.0 = None;
        if probe.is_primary(host).await {
            return Some(index);
        }
    }
    // Open to no host in particular: the next probe opens one to the host it asks.
    probe.0 = None;
    None
}

/// The first of `hosts` that is the primary now.
pub(crate) async fn find(hosts: &[PgConnectOptions]) -> Option<usize> {
    find_with(&mut Probe::default(), hosts).await
}

/// Keeps `pool` pointed at the primary among `hosts` (it starts at `current`) until the pool is
/// closed.
pub(crate) fn follow(pool: PgPool, hosts: Vec<PgConnectOptions>, mut current: usize) {
    tokio::spawn(async move {
        let mut probe = Probe::default();
        let mut ticks = tokio::time::interval(Duration::from_millis(PROBE_MS));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !pool.is_closed() {
            ticks.tick().await;
            if probe.is_primary(&hosts[current]).await {
                continue;
            }
            tracing::warn!(
                host = hosts[current].get_host(),
                port = hosts[current].get_port(),
                "the database primary is gone or in recovery: looking for the new one"
            );
            if let Some(found) = find_with(&mut probe, &hosts).await {
                current = found;
                pool.set_connect_options(hosts[current].clone());
                tracing::warn!(
                    host = hosts[current].get_host(),
                    port = hosts[current].get_port(),
                    "the database primary moved: new connections go there"
                );
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_several_hosts_becomes_one_url_per_host() {
        let hosts = hosts(
            "postgres://app:secret@db1:5433,db2/asiento?sslmode=disable&target_session_attrs=read-write",
        )
        .unwrap()
        .unwrap();
        let named: Vec<(String, u16, Option<String>)> = hosts
            .iter()
            .map(|host| {
                (
                    host.get_host().to_owned(),
                    host.get_port(),
                    host.get_database().map(str::to_owned),
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                ("db1".to_owned(), 5433, Some("asiento".to_owned())),
                ("db2".to_owned(), 5432, Some("asiento".to_owned())),
            ]
        );
        assert_eq!(hosts[1].get_username(), "app");
    }

    #[test]
    fn a_url_with_one_host_is_left_to_sqlx_and_other_session_attrs_are_refused() {
        assert!(hosts("postgres://app@db1:5432/asiento").unwrap().is_none());
        assert!(matches!(
            hosts("postgres://app@db1,db2/asiento?target_session_attrs=any"),
            Err(StoreError::UnsupportedUrl)
        ));
        assert!(matches!(
            hosts("postgres://app@db1,,db2/asiento"),
            Err(StoreError::UnsupportedUrl)
        ));
    }
}
