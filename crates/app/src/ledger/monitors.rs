//! `POST /v1/balance_monitors` and `DELETE /v1/balance_monitors/{id}`: a balance monitor's
//! creation and deletion (`asiento_domain::monitor`), each one event on the monitor's own stream,
//! committed through the process's writer like every command. Whether a monitor fires is not
//! decided here: the merchant events projection decides it from the log, in log order.

use asiento_domain::monitor::{self, Monitor, MonitorCreated, MonitorEvent, Threshold};
use asiento_domain::{monitor_stream, AccountName, Currency, TenantId};
use asiento_eventstore::{Metadata, StreamAppend};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{back_off, Decided, LedgerFlow, LEDGER_CONFLICT_RETRIES_MAX};
use crate::commit::{Command, Committed, GuardWrite, Step};
use crate::log;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

/// A monitor, validated at the edge.
#[derive(Debug, Clone)]
pub struct NewMonitor {
    pub tenant: TenantId,
    pub account: AccountName,
    pub currency: Currency,
    pub threshold: Threshold,
    pub description: Option<String>,
}

/// A monitor as its stream leaves it, and the position of its last event.
#[derive(Debug, Clone)]
pub struct MonitorState {
    pub created: MonitorCreated,
    pub deleted_at: Option<DateTime<Utc>>,
    pub position: i64,
}

fn metadata(tenant: &TenantId, request: Option<&Idempotent>) -> Metadata {
    Metadata {
        tenant: Some(tenant.to_string()),
        correlation_id: request.and_then(|r| r.correlation_id),
        causation_id: None,
        idempotency_key: request.map(|r| r.key.as_str().to_owned()),
    }
}

fn stream_of(id: &str) -> Result<String, FlowError> {
    monitor_stream(id).ok_or_else(|| FlowError::Inconsistent(format!("{id:?} is not a monitor id")))
}

impl LedgerFlow {
    /// Creates a monitor under the request's key: 201 with the monitor, or 422 for a system
    /// account.
    #[tracing::instrument(skip_all, fields(tenant = %new.tenant, account = %new.account))]
    pub async fn create_monitor(
        &self,
        request: &Idempotent,
        new: NewMonitor,
    ) -> Result<Answer, FlowError> {
        let monitor_id = format!("bm_{}", Uuid::new_v4().simple());
        let metadata = metadata(&new.tenant, Some(request));
        let created = MonitorCreated {
            monitor_id: monitor_id.clone(),
            tenant: new.tenant,
            account: new.account,
            currency: new.currency,
            threshold: new.threshold,
            description: new.description,
            at: self.clock.now(),
        };
        let decided = match monitor::create(created) {
            Err(rejection) => Decided::Refused(Rejected::Guard(rejection)),
            Ok(created) => {
                let appends = vec![StreamAppend {
                    stream_id: stream_of(&monitor_id)?,
                    expected: log::expected(0),
                    events: log::encode(
                        [MonitorEvent::MonitorCreated(created.clone())].iter(),
                        &metadata,
                        log::monitor_codec,
                    )?,
                }];
                Decided::Append(
                    appends,
                    GuardWrite::default(),
                    move |render: &dyn Render, position| {
                        render.render(&Reply::Monitor {
                            created: &created,
                            deleted_at: None,
                            position,
                        })
                    },
                )
            }
        };
        // A new stream cannot lose a race: only a failed commit comes back without an answer.
        self.commit(request, &monitor_id, decided)
            .await?
            .ok_or_else(|| FlowError::Inconsistent("a new monitor's stream existed".to_owned()))
    }

    /// The tenant's monitor `id` from its own stream (never stale); None for an id it has not.
    pub async fn monitor(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<MonitorState>, FlowError> {
        let Some(stream_id) = monitor_stream(id) else {
            return Ok(None);
        };
        let loaded = log::load_monitor(self.store.as_ref(), &stream_id).await?;
        let position = loaded.events.last().map_or(0, |(raw, _)| raw.position);
        Ok(state_of(loaded.aggregate, tenant, position))
    }

    /// Deletes the tenant's monitor `id`: it watches no more. Deleting a deleted monitor answers
    /// it as it is; None for an id the tenant has not.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, monitor = %id))]
    pub async fn delete_monitor(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<MonitorState>, FlowError> {
        let Some(stream_id) = monitor_stream(id) else {
            return Ok(None);
        };
        for attempt in 0..LEDGER_CONFLICT_RETRIES_MAX {
            let loaded = log::load_monitor(self.store.as_ref(), &stream_id).await?;
            let position = loaded.events.last().map_or(0, |(raw, _)| raw.position);
            let current = loaded.aggregate;
            let Some(deleted) = monitor::delete(&current, self.clock.now()) else {
                return Ok(state_of(current, tenant, position));
            };
            if deleted.tenant != *tenant {
                return Ok(None);
            }
            let appends = vec![StreamAppend {
                stream_id: stream_id.clone(),
                expected: log::expected(current.version),
                events: log::encode(
                    [MonitorEvent::MonitorDeleted(deleted.clone())].iter(),
                    &metadata(tenant, None),
                    log::monitor_codec,
                )?,
            }];
            let step = Step::Command(Command {
                appends: appends.into(),
                guards: GuardWrite::default(),
                key: None,
            });
            match self.writer.commit(step).await? {
                Committed::Written(appended) => {
                    let Some(created) = current.created else {
                        unreachable!("a deletion is decided only for a created monitor");
                    };
                    return Ok(Some(MonitorState {
                        created,
                        deleted_at: Some(deleted.at),
                        position: appended.map_or(position, |a| a.last_position),
                    }));
                }
                Committed::Conflict => back_off(attempt).await,
                other => {
                    return Err(FlowError::Inconsistent(format!(
                        "a monitor's deletion ended {other:?}"
                    )))
                }
            }
        }
        Err(FlowError::Contended(format!("the deletion of {id}")))
    }
}

/// The monitor as the tenant may see it: None when it was never created or is another tenant's.
fn state_of(monitor: Monitor, tenant: &TenantId, position: i64) -> Option<MonitorState> {
    let created = monitor.created.filter(|c| c.tenant == *tenant)?;
    Some(MonitorState {
        created,
        deleted_at: monitor.deleted_at,
        position,
    })
}
