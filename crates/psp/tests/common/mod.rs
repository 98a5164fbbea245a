//! What the simulator's loopback tests share: a bound on every test, polling until a condition
//! holds, and the simulator served on 127.0.0.1:0 until it is shut down.
#![allow(clippy::unwrap_used, dead_code)]

pub mod adyen_schema;

use std::future::Future;
use std::time::{Duration, Instant};

use asiento_psp_sim::run;
use asiento_psp_sim::{SimConfig, Simulator};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// No loopback test runs longer than this.
pub const TEST_TIMEOUT_S: u64 = 30;

pub async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(TEST_TIMEOUT_S), test)
        .await
        .expect("test took too long");
}

/// Polls `check` until it holds or `timeout_ms` passes.
pub async fn eventually(timeout_ms: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// The simulator served over loopback until [`RunningSim::shutdown`].
pub struct RunningSim {
    pub base: String,
    pub sim: Simulator,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningSim {
    pub async fn start(config: SimConfig) -> RunningSim {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let sim = Simulator::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(listener, sim.clone(), async {
            let _ = stopped.await;
        }));
        RunningSim {
            base,
            sim,
            stop: Some(stop),
            task,
        }
    }

    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("simulator did not stop promptly")
            .unwrap()
            .unwrap();
    }
}
