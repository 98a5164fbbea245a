//! The process-wide metrics recorder drains its histograms on its own: a process that nobody
//! scrapes must not keep every sample it ever recorded.

use std::time::{Duration, Instant};

/// The names of this process's threads (`comm`, at most 15 bytes).
fn threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("procfs")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}

fn upkeep_threads() -> usize {
    threads()
        .iter()
        .filter(|name| *name == asiento_api::METRICS_UPKEEP_THREAD)
        .count()
}

/// A new thread names itself once it runs: until then it shows its parent's name.
fn until_named() -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while upkeep_threads() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    upkeep_threads()
}

#[test]
fn installing_the_recorder_starts_its_upkeep_thread() {
    assert_eq!(upkeep_threads(), 0);
    assert!(
        asiento_api::metrics_handle().is_some(),
        "the recorder installs"
    );
    assert_eq!(until_named(), 1, "threads: {:?}", threads());
    let started = threads().len();
    // Installed once: a second call starts no second thread.
    asiento_api::metrics_handle();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(threads().len(), started, "threads: {:?}", threads());
    assert_eq!(upkeep_threads(), 1);
}
