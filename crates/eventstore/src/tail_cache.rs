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

    fn extend(&mut self, events: &[RecordedEvent]) {
        self.events.extend(events.iter().cloned());
        while self.events.len() > TAIL_CACHE_EVENTS_MAX {
            if let Some(dropped) = self.events.pop_front() {
                self.start = dropped.cursor;
            }
        }
    }
}

/// What the window holds for a read from some cursor.
enum Look {
    /// The events after it (at least one).
    Hit(Vec<RecordedEvent>),
    /// Nothing: the cursor is before the window (a reader catching up).
    Before,
    /// Nothing: the cursor is at the window's end, past it, or there is no window yet.
    End,
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
        // Held through the read from the window's end, so that readers there make one read.
        let _refilling = match self.look(after, limit) {
            Look::Hit(events) => return Ok(events),
            Look::Before => None,
            Look::End => {
                let refilling = self.refill.lock().await;
                // Another reader may have extended the window while this one waited.
                if let Look::Hit(events) = self.look(after, limit) {
                    return Ok(events);
                }
                Some(refilling)
            }
        };
        let events = read(after, limit).await?;
        self.keep(after, &events);
        Ok(events)
    }

    /// Keeps what a database read from `after` returned, as far as it continues the window.
    fn keep(&self, after: Cursor, events: &[RecordedEvent]) {
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
                fresh.extend(events);
                *window = Some(fresh);
            }
        }
    }

    fn look(&self, after: Cursor, limit: usize) -> Look {
        let window = self.lock();
        match window.as_ref() {
            Some(window) if after < window.start => Look::Before,
            Some(window) if after < window.end() => {
                let first = window.events.partition_point(|event| event.cursor <= after);
                Look::Hit(window.events.range(first..).take(limit).cloned().collect())
            }
            _ => Look::End,
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

    /// A log of events at positions 1..=len, a cache in front of it, and a count of the reads
    /// that reached the log.
    struct Fixture {
        events: Vec<RecordedEvent>,
        cache: TailCache,
        reads: AtomicUsize,
    }

    impl Fixture {
        fn new(len: i64) -> Fixture {
            Fixture {
                events: (1..=len).map(event).collect(),
                cache: TailCache::default(),
                reads: AtomicUsize::new(0),
            }
        }

        /// `read_all(after, limit)` through the cache: the positions it returned.
        async fn read(&self, after: i64, limit: usize) -> Vec<i64> {
            let from_log = |after: Cursor, limit: usize| async move {
                self.reads.fetch_add(1, Ordering::SeqCst);
                Ok::<_, StoreError>(
                    self.events
                        .iter()
                        .filter(|e| e.cursor > after)
                        .take(limit)
                        .cloned()
                        .collect(),
                )
            };
            let events = self
                .cache
                .read_all(Cursor::new(0, after), limit, from_log)
                .await
                .unwrap();
            events.iter().map(|e| e.position).collect()
        }

        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn readers_inside_the_window_share_one_read() {
        let f = Fixture::new(10);
        assert_eq!(f.read(0, 100).await, (1..=10).collect::<Vec<_>>());
        assert_eq!(f.reads(), 1);
        // Every cursor inside the window, any limit: the same answer as the log, no read.
        for after in 0..10 {
            for limit in [1, 3, 100] {
                let want: Vec<i64> = (after + 1..=10).take(limit).collect();
                assert_eq!(f.read(after, limit).await, want);
            }
        }
        assert_eq!(f.reads(), 1);
    }

    #[tokio::test]
    async fn a_read_from_the_end_always_asks_the_database() {
        let f = Fixture::new(3);
        f.read(0, 100).await;
        // Caught up: the empty answer must be fresh, every time.
        for n in 0..3 {
            assert!(f.read(3, 100).await.is_empty());
            assert_eq!(f.reads(), 2 + n);
        }
    }

    #[tokio::test]
    async fn a_reader_behind_the_window_reads_alone_and_leaves_it() {
        let f = Fixture::new(20);
        f.read(10, 100).await;
        assert_eq!(f.read(2, 4).await, vec![3, 4, 5, 6]);
        assert_eq!(f.reads(), 2);
        // The window still starts at 10 and serves from memory.
        assert_eq!(f.read(15, 100).await, (16..=20).collect::<Vec<_>>());
        assert_eq!(f.reads(), 2);
    }

    #[tokio::test]
    async fn a_reader_catching_up_past_the_end_extends_the_window() {
        let f = Fixture::new(20);
        f.read(10, 5).await;
        // From before the window (11..=15) to past its end: 16..=18 continue it.
        assert_eq!(f.read(2, 16).await, (3..=18).collect::<Vec<_>>());
        assert_eq!(f.reads(), 2);
        assert_eq!(f.read(12, 100).await, (13..=18).collect::<Vec<_>>());
        assert_eq!(f.reads(), 2);
    }

    #[tokio::test]
    async fn the_window_keeps_the_newest_events_only() {
        let total = i64::try_from(TAIL_CACHE_EVENTS_MAX).unwrap() + 100;
        let f = Fixture::new(total);
        let mut after = 0;
        while let Some(&last) = f.read(after, 1_000).await.last() {
            after = last;
        }
        let reads = f.reads();
        // The oldest 100 fell out: reading from there goes to the database.
        assert_eq!(f.read(50, 10).await, (51..=60).collect::<Vec<_>>());
        assert_eq!(f.reads(), reads + 1);
        assert_eq!(f.read(150, 10).await, (151..=160).collect::<Vec<_>>());
        assert_eq!(f.reads(), reads + 1);
    }
}
