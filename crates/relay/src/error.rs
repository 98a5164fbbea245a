//! What can end a relay's round (every one is retried from the stored cursor, `Config` aside),
//! and the `kind` label each is counted under.

use async_nats::jetstream;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("invalid events relay setting: {0}")]
    Config(String),
    #[error("connecting to NATS: {0}")]
    Connect(#[from] async_nats::ConnectError),
    #[error("creating or finding JetStream stream {stream}: {source}")]
    Stream {
        stream: String,
        source: jetstream::context::CreateStreamError,
    },
    #[error("publishing to JetStream: {0}")]
    Publish(#[from] jetstream::context::PublishError),
    #[error("JetStream stored the event in stream {actual}, not {expected}: another stream holds its subject")]
    WrongStream { expected: String, actual: String },
    #[error("reading the last message of JetStream stream {stream}: {detail}")]
    LastMessage { stream: String, detail: String },
    #[error(transparent)]
    Feed(#[from] asiento_merchant_events::FeedError),
    #[error("events relay database query failed: {0}")]
    Database(#[from] sqlx::Error),
}

impl RelayError {
    /// The `kind` label of `asiento_events_relay_errors_total`.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            RelayError::Config(_) => "config",
            RelayError::Connect(_) | RelayError::Publish(_) | RelayError::LastMessage { .. } => {
                "nats"
            }
            RelayError::Stream { .. } | RelayError::WrongStream { .. } => "stream",
            RelayError::Feed(_) | RelayError::Database(_) => "database",
        }
    }
}
