//! The campaign's knobs: every environment variable it reads, with its default and its bounds, so
//! that a run is sized and replayed from the shell (`scripts/chaos` sets them for its long form).
//! The seed is random unless `CHAOS_SEED` names one, and every run prints it.

use std::time::Duration;

use crate::common::Backend;

/// The least convergence time the Stripe and Adyen campaigns get (see `fault_campaign`).
pub const DIALECT_CONVERGE_S_MIN: u64 = 180;

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|raw| raw.trim().parse().ok())
        .unwrap_or(default)
}

#[derive(Clone)]
pub struct Knobs {
    pub kills: u32,
    pub clients: u32,
    pub seconds: f64,
    pub seed: u64,
    pub backend: Backend,
    pub converge: Duration,
    /// Stop PostgreSQL once mid-load (PostgreSQL only).
    pub pg_outage: bool,
    pub pg_down: Duration,
    pub recovery: Duration,
    /// What the app is known to do short of issue 19 fails the run: a reversed refund left to
    /// a manual exception.
    pub strict: bool,
    /// The wire format the simulator speaks: `sim`, `stripe` or `adyen`.
    pub dialect: String,
}

impl Knobs {
    pub fn from_env() -> Self {
        let seed = env_or("CHAOS_SEED", 0u64);
        let seed = if seed == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            (nanos ^ u64::from(std::process::id())) % 1_000_000_000 + 1
        } else {
            seed
        };
        let backend = match std::env::var("CHAOS_BACKEND").as_deref() {
            Ok("sqlite") => Backend::Sqlite,
            _ => Backend::Postgres,
        };
        let dialect = match std::env::var("CHAOS_DIALECT").as_deref() {
            Ok("stripe") => "stripe".to_owned(),
            Ok("adyen") => "adyen".to_owned(),
            _ => "sim".to_owned(),
        };
        let converge = Duration::from_secs(env_or("CHAOS_CONVERGE_SECONDS", 90));
        Self {
            kills: env_or("CHAOS_KILLS", 10),
            clients: env_or("CHAOS_CLIENTS", 4).max(1),
            seconds: env_or("CHAOS_SECONDS", 8.0f64).max(1.0),
            seed,
            backend,
            // A replay in one dialect converges as long as the run after the default one.
            converge: match dialect.as_str() {
                "sim" => converge,
                _ => converge.max(Duration::from_secs(DIALECT_CONVERGE_S_MIN)),
            },
            pg_outage: env_or("CHAOS_PG_OUTAGE", 1u32) != 0,
            pg_down: Duration::from_secs_f64(env_or("CHAOS_PG_DOWN_SECONDS", 3.0f64).max(0.0)),
            recovery: Duration::from_secs(env_or("CHAOS_RECOVERY_SECONDS", 30)),
            strict: env_or("CHAOS_STRICT", 0u32) == 1,
            dialect,
        }
    }
}

/// `CHAOS_SERVER_LOG` (`error`): the server's `ASIENTO_LOG`, read at each start of the server.
pub fn server_log() -> String {
    std::env::var("CHAOS_SERVER_LOG").unwrap_or("error".into())
}

/// `CHAOS_REQUIRE_SEALED` (0): with 1, `asiento verify` must also find every event sealed, read
/// when the books are verified.
pub fn require_sealed() -> bool {
    env_or("CHAOS_REQUIRE_SEALED", 0u32) == 1
}
