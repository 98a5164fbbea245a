//! Subscriptions: catch up from a cursor in batches, then tail live.
//!
//! Both backends share the loop; they differ only in how a subscriber waits
//! for news ([`Tail`]). The loop holds one batch at a time and nothing else,
//! so memory stays flat however long the log is.
//!
//! Catching up reads ahead: one streaming query per [`READ_AHEAD_ROWS_MAX`]
//! rows, cut into batches by a producer task and handed over through a
//! channel of [`READ_AHEAD_BATCHES_MAX`] batches. Rows keep flowing while the
//! consumer works, instead of one round trip (and one idle gap) per batch,
//! and the channel's bound keeps memory flat.
//!
//! Wake-ups are hints, never the source of truth: every wake-up (or poll
//! tick) re-reads from the cursor through the gap-free `read_all`, so a lost
//! or early notification costs latency, not events. Once armed, a short
//! batch goes straight to waiting: what commits after its read announces
//! itself, so a confirming read would only ever find nothing.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;

use crate::{Cursor, RecordedEvent, StoreError};

/// Cuts a stream of rows into batches and sends them until the rows end,
/// an error is sent, or the subscriber is gone. Runs as the read-ahead task.
pub(crate) async fn send_batches<S>(
    mut rows: S,
    batch_size: usize,
    tx: tokio::sync::mpsc::Sender<Result<Vec<RecordedEvent>, StoreError>>,
) where
    S: futures::Stream<Item = Result<RecordedEvent, StoreError>> + Unpin,
{
    let batch_size = batch_size.clamp(1, crate::READ_BATCH_MAX);
    let mut batch = Vec::with_capacity(batch_size);
    while let Some(row) = rows.next().await {
        match row {
            Ok(event) => {
                batch.push(event);
                if batch.len() >= batch_size {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(batch_size));
                    if tx.send(Ok(full)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(Ok(batch)).await;
    }
}

/// Pause before reading again after a read failed.
const RETRY_DELAY_MS: u64 = 500;
/// Rows one catch-up query may stream; bounds how long it holds a snapshot.
pub(crate) const READ_AHEAD_ROWS_MAX: usize = 100_000;
/// Batches a catch-up producer may hold ready for the consumer.
pub(crate) const READ_AHEAD_BATCHES_MAX: usize = 2;

pub(crate) type Batches = tokio::sync::mpsc::Receiver<Result<Vec<RecordedEvent>, StoreError>>;

#[async_trait::async_trait]
pub(crate) trait Tail: Send + 'static {
    async fn read(&mut self, after: Cursor, limit: usize)
        -> Result<Vec<RecordedEvent>, StoreError>;
    /// Starts streaming up to [`READ_AHEAD_ROWS_MAX`] events after `after`
    /// in batches of `batch_size`; the channel closes after the last one.
    fn read_ahead(&self, after: Cursor, batch_size: usize) -> Batches;
    /// Starts listening for wake-ups. Called before the re-read that confirms
    /// the subscriber is caught up, so nothing committed after that read can
    /// go unannounced.
    async fn arm(&mut self) -> Result<(), StoreError>;
    /// Waits for a wake-up or the poll interval. False if wake-ups stopped
    /// working and `arm` should be called again.
    async fn wait(&mut self) -> bool;
}

struct State<T> {
    tail: T,
    cursor: Cursor,
    batch_size: usize,
    armed: bool,
    failed: bool,
    /// The last live read came back short while armed: the next read waits for a wake-up first.
    drained: bool,
    /// Behind the head: reading ahead rather than batch by batch.
    catching_up: bool,
    ahead: Option<Batches>,
    /// Rows the current read-ahead delivered; fewer than the maximum means
    /// it reached the readable end of the log.
    ahead_rows: usize,
}

pub(crate) fn subscribe<T: Tail>(
    tail: T,
    from: Cursor,
    batch_size: usize,
) -> BoxStream<'static, Result<Vec<RecordedEvent>, StoreError>> {
    let state = State {
        tail,
        cursor: from,
        batch_size,
        armed: false,
        failed: false,
        drained: false,
        catching_up: true,
        ahead: None,
        ahead_rows: 0,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.failed {
                s.failed = false;
                tokio::time::sleep(Duration::from_millis(RETRY_DELAY_MS)).await;
            }
            if s.catching_up {
                let ahead = match &mut s.ahead {
                    Some(ahead) => ahead,
                    None => {
                        s.ahead_rows = 0;
                        s.ahead.insert(s.tail.read_ahead(s.cursor, s.batch_size))
                    }
                };
                match ahead.recv().await {
                    Some(Ok(batch)) => {
                        if let Some(last) = batch.last() {
                            s.cursor = last.cursor;
                        }
                        s.ahead_rows += batch.len();
                        return Some((Ok(batch), s));
                    }
                    Some(Err(e)) => {
                        s.ahead = None;
                        s.failed = true;
                        return Some((Err(e), s));
                    }
                    None => {
                        s.ahead = None;
                        s.catching_up = s.ahead_rows >= READ_AHEAD_ROWS_MAX;
                        continue;
                    }
                }
            }
            if s.drained {
                // A short batch read while armed was all there was: whatever commits after that
                // read announces itself (a wake-up already queued returns at once), so there is
                // nothing to confirm with a read of our own. Events committed but not yet
                // readable then come with the next wake-up or poll tick, as they would anyway.
                s.drained = false;
                s.armed = s.tail.wait().await;
            }
            match s.tail.read(s.cursor, s.batch_size).await {
                Err(e) => {
                    s.failed = true;
                    return Some((Err(e), s));
                }
                Ok(batch) => {
                    if let Some(last) = batch.last() {
                        s.cursor = last.cursor;
                        // A full batch: the log is ahead of us again.
                        s.catching_up = batch.len() >= s.batch_size;
                        s.drained = s.armed && !s.catching_up;
                        return Some((Ok(batch), s));
                    }
                }
            }
            // Caught up.
            if !s.armed {
                match s.tail.arm().await {
                    Ok(()) => {
                        s.armed = true;
                        // Re-read: something may have landed before LISTEN.
                        continue;
                    }
                    Err(e) => {
                        // Polling alone still delivers everything; try to
                        // arm again after the next wait.
                        tracing::warn!(error = %e, "event subscription polls without wake-ups");
                    }
                }
            }
            s.armed = s.tail.wait().await;
        }
    })
    .boxed()
}
