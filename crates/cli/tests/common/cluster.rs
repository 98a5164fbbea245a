//! PostgreSQL clusters of a test's own: a primary made with the machine's `initdb`, standbys
//! copied from it with `pg_basebackup` that stream its WAL, each run by `pg_ctl` on a loopback
//! port of its own. Nothing is mocked: replication is PostgreSQL's own. A cluster is stopped
//! (immediately) and its directory removed when it is dropped.
//!
//! The binaries are found as `scripts/test` finds them: `ASIENTO_TEST_PG_BIN`, else the newest
//! `/usr/lib/postgresql/*/bin`, else `initdb` on the `PATH`; no binaries is a failure, never a
//! skip. `initdb` refuses to run as root, so as root every command runs as the machine's
//! `postgres` user (`runuser`), which owns the clusters' directories.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::free_port;

/// The database every cluster's tests use.
pub const DATABASE: &str = "asiento";

pub struct Cluster {
    /// Holds the data directory, the log and the socket; removed on drop.
    dir: tempfile::TempDir,
    pub port: u16,
    bin: PathBuf,
}

impl Cluster {
    /// A new primary, running, with the database [`DATABASE`].
    pub fn primary() -> Cluster {
        let cluster = Cluster::empty();
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        cluster.start();
        cluster.psql("postgres", &format!("CREATE DATABASE {DATABASE}"));
        cluster
    }

    /// A standby of this cluster, copied from it now and streaming its WAL from then on (hot: it
    /// answers reads), under `application_name` `name`.
    pub fn standby(&self, name: &str) -> Cluster {
        let standby = Cluster::empty();
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &standby.data(),
                "-X",
                "stream",
                "-c",
                "fast",
                "-R",
                "--no-sync",
            ],
        );
        // -R wrote primary_conninfo without a name; a later line of the same file wins.
        let auto_conf = Path::new(&standby.data()).join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto_conf).expect("postgresql.auto.conf");
        conf.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={name}'\n",
            self.port
        ));
        std::fs::write(&auto_conf, conf).expect("writing postgresql.auto.conf");
        standby.start();
        standby
    }

    /// Makes the standby named `name` synchronous: from then on a commit on this primary returns
    /// once that standby has its WAL (`synchronous_commit = on`, the default).
    pub fn synchronous_standby(&self, name: &str) {
        self.psql(
            "postgres",
            &format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"),
        );
        self.psql("postgres", "SELECT pg_reload_conf()");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.psql(
            "postgres",
            &format!(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
            ),
        ) != "sync"
        {
            assert!(
                std::time::Instant::now() < deadline,
                "standby {name} did not become synchronous"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// SIGKILLs the postmaster (its backends end as they find it gone): a machine that died.
    pub fn kill_postmaster(&self) {
        let pid_file = Path::new(&self.data()).join("postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file).expect("postmaster.pid");
        let pid = pid.lines().next().expect("a pid").trim().to_owned();
        let status = Command::new("kill")
            .args(["-9", &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -9 {pid} failed");
    }

    /// Promotes this standby to a primary and waits until it accepts writes.
    pub fn promote(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "promote"]);
    }

    /// `postgres://` URL of [`DATABASE`] on this cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// Runs `sql` in `database` with psql and returns what it printed (unaligned, tuples only).
    pub fn psql(&self, database: &str, sql: &str) -> String {
        self.run(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-Atc",
                sql,
            ],
        )
    }

    fn empty() -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("asiento-cluster-")
            .tempdir()
            .expect("a temporary directory");
        if as_root() {
            let status = Command::new("chown")
                .args(["postgres:postgres", &dir.path().to_string_lossy()])
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the cluster's directory failed");
        }
        Cluster {
            dir,
            port: free_port(),
            bin: binaries(),
        }
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    fn start(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off \
             -c max_connections=200 -c shared_buffers=32MB",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").to_string_lossy().into_owned();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
    }

    /// The cluster's server log, shown when a command fails.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let path = self.bin.join(program);
        let mut command = if as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        };
        let output = command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|error| panic!("running {}: {error}", path.display()));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let path = self.bin.join("pg_ctl");
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if as_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&path)
                .args(args)
                .output()
        } else {
            Command::new(&path).args(args).output()
        };
    }
}

fn as_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .map(|output| output.stdout.trim_ascii() == b"0")
            .unwrap_or(false)
    })
}

/// The directory of `initdb`, `pg_ctl`, `pg_basebackup` and `psql`.
fn binaries() -> PathBuf {
    if let Some(dir) = std::env::var_os("ASIENTO_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|version| version.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(newest) = versions.pop() {
        return newest;
    }
    let on_path = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
    match on_path.as_deref().map(Path::new).and_then(Path::parent) {
        Some(dir) => dir.to_path_buf(),
        None => panic!(
            "no PostgreSQL binaries (initdb, pg_ctl, pg_basebackup): install PostgreSQL or set \
             ASIENTO_TEST_PG_BIN"
        ),
    }
}
