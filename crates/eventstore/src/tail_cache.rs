//! The newest stretch of the log, as `read_all` last read it, kept in memory so that the readers
//! of one process share one database read.
//!
//! A process follows the log with several readers at once: each projection's subscription, the
//! sealer, the reconciler's watch list. They all read the same few new events a moment apart, and
//! without this each of them would fetch and decode those rows itself. The cache holds one window
//! of the log, `(start, end]`, with every event in it; a read from a cursor inside the window is
//! answered from memory, a read from the window's end goes to the database (one reader at a time;
//! the others then find the new events in the window), and a read from before the window (a
//! reader catching up) goes to the database, the window keeping what it read past its end.
//!
//! Why this is exact: `read_all` is gap-free. Once it has returned the events up to a cursor, no
//! event can ever appear before that cursor, so the window, built only from consecutive reads
//! that each started where the last one ended, is the log itself between its two cursors.
//! And an empty answer, the one that tells a subscriber it is caught up and may wait for a
//! wake-up, always comes from a database read that began during the call: a read from the end
//! is never answered from memory alone.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Mutex;

use crate::{Cursor, RecordedEvent, StoreError};

/// Events the window keeps; the oldest go first. A few seconds of a busy log: enough for every
/// live reader of a process to find what the first of them read.
pub(crate) const TAIL_CACHE_EVENTS_MAX: usize = 8_192;

/// See the module docs. One per store (clones of a store share it).
#[derive(Debug, Default)]
pub(crate) struct TailCache {
    window: Mutex<Option<Window>>,
    /// Held while reading from the window's end, so that readers arriving together make one read.
    refill: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Window {
    /// The cursor the window's first read started after.
    start: Cursor,
    /// Every event after `start`, in log order, up to the last one read.
    events: VecDeque<RecordedEvent>,
}

impl Window {
    fn end(&self) -> Cursor {
        self.events.back().map_or(self.start, |event| event.cursor)
    }

    /// The events after `after`, if the window holds any of them and all that precede them.
    fn serve(&self, after: Cursor, limit: usize) -> Option<Vec<RecordedEvent>> {
        if after < self.start || after >= self.end() {
            return None;
        }
        let first = self.events.partition_point(|event| event.cursor <= after);
        Some(self.events.range(first..).take(limit).cloned().collect())
    }

    fn extend(&mut self, events: &[RecordedEvent]) {
        self.events.extend(events.iter().cloned());
        while self.events.len() > TAIL_CACHE_EVENTS_MAX {
            if let Some(dropped) = self.events.pop_front() {
                self.start = dropped.cursor;
            }
        }
    }
}

/// Whether a read from `after` may start (or continue) the window.
enum Fit {
    /// From the window's end (or there is no window yet, or the window is behind).
    End,
    /// From before the window: a reader catching up.
    Before,
}

impl TailCache {
    /// `read_all(after, limit)` through the window; `read` is the database read.
    pub(crate) async fn read_all<F, Fut>(
        &self,
        after: Cursor,
        limit: usize,
        read: F,
    ) -> Result<Vec<RecordedEvent>, StoreError>
    where
        F: FnOnce(Cursor, usize) -> Fut,
        Fut: Future<Output = Result<Vec<RecordedEvent>, StoreError>>,
    {
        let limit = limit.clamp(1, crate::READ_BATCH_MAX);
        match self.look(after, limit) {
            (Some(events), _) => return Ok(events),
            (None, Fit::Before) => return self.read_and_keep(after, limit, read).await,
            (None, Fit::End) => {}
        }
        let _refilling = self.refill.lock().await;
        // Another reader may have extended the window while this one waited.
        match self.look(after, limit) {
            (Some(events), _) => Ok(events),
            _ => self.read_and_keep(after, limit, read).await,
        }
    }

    /// A database read, whose events the window then keeps as far as they continue it.
    async fn read_and_keep<F, Fut>(
        &self,
        after: Cursor,
        limit: usize,
        read: F,
    ) -> Result<Vec<RecordedEvent>, StoreError>
    where
        F: FnOnce(Cursor, usize) -> Fut,
        Fut: Future<Output = Result<Vec<RecordedEvent>, StoreError>>,
    {
        let events = read(after, limit).await?;
        let mut window = self.lock();
        match window.as_mut() {
            // The read covers everything from `after` to its last event, so the part past the
            // window's end continues the window (a reader catching up arrives there too).
            Some(window) if after <= window.end() => {
                let end = window.end();
                let past = events.partition_point(|event| event.cursor <= end);
                window.extend(&events[past..]);
            }
            // No window yet, or one every reader has left behind: start afresh here.
            _ => {
                let mut fresh = Window {
                    start: after,
                    events: VecDeque::new(),
                };
                fresh.extend(&events);
                *window = Some(fresh);
            }
        }
        Ok(events)
    }

    fn look(&self, after: Cursor, limit: usize) -> (Option<Vec<RecordedEvent>>, Fit) {
        let window = self.lock();
        match window.as_ref() {
            Some(window) if after < window.start => (None, Fit::Before),
            Some(window) => (window.serve(after, limit), Fit::End),
            None => (None, Fit::End),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Window>> {
        // The window is only ever replaced whole or extended by owned values; a panic elsewhere
        // cannot leave it half-changed, so a poisoned lock is still a good one.
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{EventData, Metadata};

    fn event(position: i64) -> RecordedEvent {
        RecordedEvent {
            position,
            cursor: Cursor::new(0, position),
            stream_id: format!("s-{position}"),
            version: 1,
            event_id: uuid::Uuid::new_v4(),
            event_type: "Test".to_owned(),
            schema: 1,
            data: EventData::from(serde_json::json!({ "n": position })),
            metadata: Metadata::default(),
            recorded_at: chrono::Utc::now(),
        }
    }

    /// A log of `len` events and a counter of the database reads made against it.
    struct Log {
        events: Vec<RecordedEvent>,
        reads: AtomicUsize,
    }

    impl Log {
        fn new(len: i64) -> Log {
            Log {
                events: (1..=len).map(event).collect(),
                reads: AtomicUsize::new(0),
            }
        }

        async fn read(
            &self,
            after: Cursor,
            limit: usize,
        ) -> Result<Vec<RecordedEvent>, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Ok(self
                .events
                .iter()
                .filter(|e| e.cursor > after)
                .take(limit)
                .cloned()
                .collect())
        }

        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    fn positions(events: &[RecordedEvent]) -> Vec<i64> {
        events.iter().map(|e| e.position).collect()
    }

    #[tokio::test]
    async fn readers_inside_the_window_share_one_read() {
        let log = Log::new(10);
        let cache = TailCache::default();
        let at = |p| Cursor::new(0, p);
        let first = cache
            .read_all(at(0), 100, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&first), (1..=10).collect::<Vec<_>>());
        assert_eq!(log.reads(), 1);
        // Every cursor inside the window, any limit: the same answer as the log, no read.
        for after in 0..10 {
            for limit in [1, 3, 100] {
                let got = cache
                    .read_all(at(after), limit, |a, l| log.read(a, l))
                    .await
                    .unwrap();
                let want = log.events.iter().filter(|e| e.position > after).take(limit);
                assert_eq!(
                    positions(&got),
                    positions(&want.cloned().collect::<Vec<_>>())
                );
            }
        }
        assert_eq!(log.reads(), 1);
    }

    #[tokio::test]
    async fn a_read_from_the_end_always_asks_the_database() {
        let log = Log::new(3);
        let cache = TailCache::default();
        let at = |p| Cursor::new(0, p);
        cache
            .read_all(at(0), 100, |a, l| log.read(a, l))
            .await
            .unwrap();
        // Caught up: the empty answer must be fresh, every time.
        for n in 0..3 {
            let got = cache
                .read_all(at(3), 100, |a, l| log.read(a, l))
                .await
                .unwrap();
            assert!(got.is_empty());
            assert_eq!(log.reads(), 2 + n);
        }
    }

    #[tokio::test]
    async fn a_reader_behind_the_window_reads_alone_and_leaves_it() {
        let log = Log::new(20);
        let cache = TailCache::default();
        let at = |p| Cursor::new(0, p);
        cache
            .read_all(at(10), 100, |a, l| log.read(a, l))
            .await
            .unwrap();
        let behind = cache
            .read_all(at(2), 4, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&behind), vec![3, 4, 5, 6]);
        assert_eq!(log.reads(), 2);
        // The window still starts at 10 and serves from memory.
        let inside = cache
            .read_all(at(15), 100, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&inside), (16..=20).collect::<Vec<_>>());
        assert_eq!(log.reads(), 2);
    }

    #[tokio::test]
    async fn a_reader_catching_up_past_the_end_extends_the_window() {
        let log = Log::new(20);
        let cache = TailCache::default();
        let at = |p| Cursor::new(0, p);
        cache
            .read_all(at(10), 5, |a, l| log.read(a, l))
            .await
            .unwrap();
        // From before the window to past its end (15): 16..=18 continue it.
        let caught_up = cache
            .read_all(at(2), 16, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&caught_up), (3..=18).collect::<Vec<_>>());
        assert_eq!(log.reads(), 2);
        let inside = cache
            .read_all(at(12), 100, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&inside), (13..=18).collect::<Vec<_>>());
        assert_eq!(log.reads(), 2);
    }

    #[tokio::test]
    async fn the_window_keeps_the_newest_events_only() {
        let total = i64::try_from(TAIL_CACHE_EVENTS_MAX).unwrap() + 100;
        let log = Log::new(total);
        let cache = TailCache::default();
        let at = |p| Cursor::new(0, p);
        let mut cursor = at(0);
        loop {
            let got = cache
                .read_all(cursor, 1_000, |a, l| log.read(a, l))
                .await
                .unwrap();
            let Some(last) = got.last() else { break };
            cursor = last.cursor;
        }
        let reads = log.reads();
        // The oldest 100 fell out: reading from there goes to the database.
        let old = cache
            .read_all(at(50), 10, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&old), (51..=60).collect::<Vec<_>>());
        assert_eq!(log.reads(), reads + 1);
        let kept = cache
            .read_all(at(150), 10, |a, l| log.read(a, l))
            .await
            .unwrap();
        assert_eq!(positions(&kept), (151..=160).collect::<Vec<_>>());
        assert_eq!(log.reads(), reads + 1);
    }
}
