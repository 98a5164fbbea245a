//! Receiving a batch of signed items (Adyen's standard notifications): the endpoint's basic auth
//! is checked, every item's own HMAC verified, and each item stored in the inbox as its own
//! event, deduplicated by its id, before the provider gets its `[accepted]`. A delivery with one
//! item that does not verify stores nothing; one whose storing fails is answered 500 and comes
//! again whole, its stored items then found as duplicates.

use asiento_psp::adyen::verify_batch;
use tokio::task::JoinSet;

use super::receive::{
    count_received, refused, InboxRow, ReceiveError, EVENT_ID_LEN_MAX, PAYMENT_REF_LEN_MAX,
    PROVIDER_ECHO_CHARS_MAX,
};
use super::{truncate, WebhookReceiver};
use crate::commit::{CommitError, Committed, Step};

/// What a stored batch held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchReceived {
    /// Items stored now.
    pub stored: usize,
    /// Items the provider sent before: nothing was changed for them.
    pub duplicates: usize,
}

impl WebhookReceiver {
    /// Verifies and stores one batch delivery of `provider`, whose `authorization` header must
    /// carry the configured basic credentials.
    #[tracing::instrument(skip_all, fields(provider = %truncate(provider, PROVIDER_ECHO_CHARS_MAX)))]
    pub async fn receive_batch(
        &self,
        provider: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<BatchReceived, ReceiveError> {
        let result = self
            .receive_batch_inner(provider, authorization, body)
            .await;
        match &result {
            Ok(received) => {
                count_received("stored", received.stored);
                count_received("duplicate", received.duplicates);
            }
            Err(error) => refused(error),
        }
        result
    }

    async fn receive_batch_inner(
        &self,
        provider: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<BatchReceived, ReceiveError> {
        let unknown = || ReceiveError::UnknownProvider(truncate(provider, PROVIDER_ECHO_CHARS_MAX));
        let (key, credentials) = self.secrets.batch_keys(provider).ok_or_else(unknown)?;
        if !credentials.accepts(authorization) {
            return Err(ReceiveError::Unauthorized);
        }
        let items = verify_batch(key, body).map_err(ReceiveError::BatchRefused)?;
        let now_ms = self.clock.now_ms();
        let mut rows = Vec::with_capacity(items.len());
        for item in items {
            if item.id.len() > EVENT_ID_LEN_MAX {
                return Err(ReceiveError::InvalidBody(format!(
                    "an item's id must be at most {EVENT_ID_LEN_MAX} bytes"
                )));
            }
            rows.push(InboxRow {
                provider: provider.to_owned(),
                event_id: item.id,
                event_type: item.event_code,
                payment_ref: Some(item.merchant_reference)
                    .filter(|reference| reference.len() <= PAYMENT_REF_LEN_MAX),
                payload: item.payload,
                now_ms,
            });
        }
        // Every item goes to the writer at once, so that they share its batches.
        let mut commits = JoinSet::new();
        for row in rows {
            let writer = std::sync::Arc::clone(&self.writer);
            commits.spawn(async move { writer.commit(Step::Inbox(row)).await });
        }
        let mut received = BatchReceived {
            stored: 0,
            duplicates: 0,
        };
        while let Some(joined) = commits.join_next().await {
            let committed =
                joined.map_err(|error| CommitError::Unexpected(format!("store task: {error}")))?;
            match committed? {
                Committed::Written(_) | Committed::Rebased(..) => received.stored += 1,
                Committed::NotFresh => received.duplicates += 1,
                other => {
                    return Err(ReceiveError::Store(CommitError::Unexpected(format!(
                        "{other:?}"
                    ))))
                }
            }
        }
        Ok(received)
    }
}
