//! The `cell` label: a process that serves several tenant cells runs the same projectors, workers
//! and routes once per cell, and their metrics (a projection's lag, open exceptions, invariant
//! violations) would overwrite each other. Each cell's tasks and requests run inside
//! [`in_cell`]; the process's recorder adds `cell="…"` to every metric registered there. Outside
//! a cell (a process of one database) nothing is added.

use std::future::Future;
use std::sync::Arc;

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString, Unit,
};

tokio::task_local! {
    static CELL: Arc<str>;
}

/// `future` with its metrics labelled `cell`.
pub fn in_cell<F: Future>(cell: Arc<str>, future: F) -> impl Future<Output = F::Output> {
    CELL.scope(cell, future)
}

/// A recorder that adds the current cell's label before handing a metric to `inner`.
pub struct CellLabelled<R>(pub R);

impl<R> CellLabelled<R> {
    fn key(key: &Key) -> Option<Key> {
        let cell = CELL.try_with(Arc::clone).ok()?;
        let labels: Vec<Label> = key
            .labels()
            .cloned()
            .chain(std::iter::once(Label::new("cell", cell)))
            .collect();
        Some(Key::from_parts(key.name().to_owned(), labels))
    }
}

impl<R: Recorder> Recorder for CellLabelled<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        match Self::key(key) {
            Some(labelled) => self.0.register_counter(&labelled, metadata),
            None => self.0.register_counter(key, metadata),
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        match Self::key(key) {
            Some(labelled) => self.0.register_gauge(&labelled, metadata),
            None => self.0.register_gauge(key, metadata),
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        match Self::key(key) {
            Some(labelled) => self.0.register_histogram(&labelled, metadata),
            None => self.0.register_histogram(key, metadata),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn metrics_registered_in_a_cell_carry_its_label_and_others_do_not() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let labelled = CellLabelled(recorder);
        let key = Key::from_parts("lag", vec![Label::new("projection", "payments")]);
        let metadata = Metadata::new(module_path!(), metrics::Level::INFO, None);
        labelled.register_gauge(&key, &metadata).set(1.0);
        in_cell(Arc::from("eu2"), async {
            labelled.register_gauge(&key, &metadata).set(2.0);
        })
        .await;
        let text = handle.render();
        assert!(text.contains("lag{projection=\"payments\"} 1"), "{text}");
        assert!(
            text.contains("lag{projection=\"payments\",cell=\"eu2\"} 2"),
            "{text}"
        );
    }
}
