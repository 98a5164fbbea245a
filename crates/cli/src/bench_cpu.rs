//! CPU time for the benchmarks, read from procfs: this process's, another process's, and the
//! whole PostgreSQL server's when it runs on this machine. A benchmark reports CPU per operation
//! beside its rate, which tells a side that waits from a side that works.

use asiento_eventstore::Database;

const CLOCK_TICKS_PER_S: f64 = 100.0;

/// CPU seconds of this process and of the PostgreSQL server (if it runs here) at one moment.
#[derive(Debug, Clone, Copy)]
pub(super) struct CpuReading {
    pub process_s: f64,
    pub postgres_s: Option<f64>,
}

impl CpuReading {
    /// Now, with the server found by [`postmaster_pid`] (`None`: not on this machine).
    pub(super) fn now(postmaster: Option<&str>) -> CpuReading {
        CpuReading {
            process_s: cpu_s("self"),
            postgres_s: postmaster.map(postgres_cpu_s),
        }
    }

    /// What was used between `earlier` and this reading.
    pub(super) fn since(&self, earlier: &CpuReading) -> CpuReading {
        CpuReading {
            process_s: self.process_s - earlier.process_s,
            postgres_s: self.postgres_s.zip(earlier.postgres_s).map(|(a, b)| a - b),
        }
    }

    /// Nothing used yet: where a sum of [`CpuReading::since`] readings starts.
    pub(super) fn none() -> CpuReading {
        CpuReading {
            process_s: 0.0,
            postgres_s: Some(0.0),
        }
    }

    /// This and `more` together (the server's only where both know it).
    pub(super) fn plus(&self, more: &CpuReading) -> CpuReading {
        CpuReading {
            process_s: self.process_s + more.process_s,
            postgres_s: self.postgres_s.zip(more.postgres_s).map(|(a, b)| a + b),
        }
    }

    /// All of it: the process's and the server's.
    pub(super) fn total_s(&self) -> f64 {
        self.process_s + self.postgres_s.unwrap_or(0.0)
    }
}

/// CPU seconds (user + system) a process has used, from /proc/<pid>/stat
/// (clock ticks at the usual 100 Hz; 0 where there is no procfs).
pub(super) fn cpu_s(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the command name, which is in parentheses.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / CLOCK_TICKS_PER_S)
        })
        .unwrap_or(0.0)
}

/// The (user, system, children's user, children's system) CPU ticks and the parent pid of a
/// process, from /proc/<pid>/stat.
fn proc_stat(pid: &str) -> Option<([u64; 4], String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|t| t.parse::<u64>().ok());
    Some((
        [tick(11)?, tick(12)?, tick(13)?, tick(14)?],
        (*fields.get(1)?).to_owned(),
    ))
}

/// The PostgreSQL server's process (the postmaster), if it runs on this machine: the parent of
/// the backend serving `db`'s connection.
pub(super) async fn postmaster_pid(db: &Database) -> Option<String> {
    let Database::Postgres(pool) = db else {
        return None;
    };
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .ok()?;
    let (_, parent) = proc_stat(&backend.to_string())?;
    // A backend whose parent is not a postgres process is not the server's (another machine).
    let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).ok()?;
    comm.trim().starts_with("postgres").then_some(parent)
}

/// CPU seconds the whole PostgreSQL server has used: the postmaster's own, that of its children
/// it has reaped (backends that ended) and that of its children still running. Differences
/// between two readings count every backend, however short-lived.
pub(super) fn postgres_cpu_s(postmaster: &str) -> f64 {
    let Some((own, _)) = proc_stat(postmaster) else {
        return 0.0;
    };
    let mut ticks: u64 = own.iter().sum();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            if let Some(([user, system, _, _], parent)) = proc_stat(pid) {
                if parent == postmaster {
                    ticks += user + system;
                }
            }
        }
    }
    ticks as f64 / CLOCK_TICKS_PER_S
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Target;
    use super::*;

    /// The tests' PostgreSQL runs on this machine: its server process is found, and work done
    /// by a connection that then ends (its backend exits) is still counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_cpu_counts_backends_that_ended() {
        let target = Target::open(None, 2).await.unwrap();
        let postmaster = postmaster_pid(&target.db)
            .await
            .expect("the tests' PostgreSQL runs here");
        let before = postgres_cpu_s(&postmaster);
        let url = target.fresh_url.clone().unwrap();
        let busy = Database::connect_with_pool_size(&url, 1).await.unwrap();
        let Database::Postgres(pool) = &busy else {
            panic!("a PostgreSQL url")
        };
        let mut conn = pool.acquire().await.unwrap();
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        sqlx::query("SELECT count(*) FROM generate_series(1, 3000000)")
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::Connection::close(conn.detach()).await.unwrap();
        pool.close().await;
        // Measured once the backend has exited and the server has reaped it.
        for _ in 0..250 {
            if proc_stat(&backend.to_string()).is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            proc_stat(&backend.to_string()).is_none(),
            "the backend ended"
        );
        let after = postgres_cpu_s(&postmaster);
        assert!(after - before >= 0.05, "{before} -> {after}");
        assert!(postmaster_pid(&Database::Sqlite(
            sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap()
        ))
        .await
        .is_none());
        target.close().await;
    }
}
