//! The process-wide metrics recorder drains its histograms on its own: a process that nobody
//! scrapes must not keep every sample it ever recorded.

#[test]
fn installing_the_recorder_starts_its_upkeep_thread() {
    let threads = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .expect("procfs")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    };
    assert!(!threads()
        .iter()
        .any(|name| name == asiento_api::METRICS_UPKEEP_THREAD));
    assert!(
        asiento_api::metrics_handle().is_some(),
        "the recorder installs"
    );
    assert!(
        threads()
            .iter()
            .any(|name| name == asiento_api::METRICS_UPKEEP_THREAD),
        "threads: {:?}",
        threads()
    );
    // Installed once: a second call starts no second thread.
    asiento_api::metrics_handle();
    let upkeep = threads()
        .into_iter()
        .filter(|name| name == asiento_api::METRICS_UPKEEP_THREAD)
        .count();
    assert_eq!(upkeep, 1);
}
