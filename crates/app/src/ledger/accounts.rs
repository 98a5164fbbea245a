//! `POST /v1/accounts`: declaring a client account's policy for one currency (normal balance,
//! overdraft policy, frozen) with its metadata.
//!
//! A declaration is an [`AccountDeclared`] event on the account's debit guard stream, appended at
//! the version the guard was read at: a transfer decided against the previous policy conflicts
//! with it and is decided again under the new one. Accounts need no declaration (they come into
//! being on their first posting); declaring one again replaces its policy and metadata.

use asiento_domain::guard::{self, AccountDeclared, GuardEvent, GuardKey};
use asiento_domain::{AccountName, AccountPolicy, Currency, TenantId};
use asiento_eventstore::Metadata;
use serde_json::{Map, Value};

use super::{back_off, Decided, LedgerFlow, LEDGER_CONFLICT_RETRIES_MAX};
use crate::commit::GuardWrite;
use crate::log;
use crate::payments::{FlowError, Idempotent};
use crate::reply::{Answer, Rejected, Render, Reply};

/// A declaration, validated at the edge.
#[derive(Debug, Clone)]
pub struct AccountDeclaration {
    pub tenant: TenantId,
    pub account: AccountName,
    pub currency: Currency,
    pub policy: AccountPolicy,
    pub metadata: Map<String, Value>,
}

impl LedgerFlow {
    #[tracing::instrument(skip_all, fields(tenant = %declaration.tenant, account = %declaration.account))]
    pub async fn declare_account(
        &self,
        request: &Idempotent,
        declaration: AccountDeclaration,
    ) -> Result<Answer, FlowError> {
        let key = GuardKey {
            tenant: declaration.tenant.clone(),
            account: declaration.account.clone(),
            currency: declaration.currency,
        };
        let metadata = Metadata {
            tenant: Some(declaration.tenant.to_string()),
            correlation_id: request.correlation_id,
            causation_id: None,
            idempotency_key: Some(request.key.as_str().to_owned()),
        };
        let resource = format!("{}:{}", key.account, key.currency);
        for attempt in 0..LEDGER_CONFLICT_RETRIES_MAX {
            let current = log::load_guard(self.store.as_ref(), &key).await?;
            let decided = match guard::declare(
                key.clone(),
                &current,
                declaration.policy,
                declaration.metadata.clone(),
                self.clock.now(),
            ) {
                Err(rejection) => Decided::Refused(Rejected::Guard(rejection)),
                Ok(append) => {
                    let Some(GuardEvent::AccountDeclared(declared)) = append.events.first() else {
                        return Err(FlowError::Inconsistent(
                            "a declaration without its event".to_owned(),
                        ));
                    };
                    let declared: AccountDeclared = declared.clone();
                    let appends = log::guard_appends(std::slice::from_ref(&append), &metadata)?;
                    let key = key.clone();
                    let created = current.declared.is_none();
                    let touched = GuardWrite {
                        read: [(key.clone(), current)].into(),
                        appends: vec![append],
                    };
                    Decided::Append(appends, touched, move |render: &dyn Render, position| {
                        render.render(&Reply::Account {
                            key: &key,
                            declared: &declared,
                            created,
                            position,
                        })
                    })
                }
            };
            if let Some(answer) = self.commit(request, &resource, decided).await? {
                return Ok(answer);
            }
            back_off(attempt).await;
        }
        Err(FlowError::Contended(format!(
            "the declaration of {resource}"
        )))
    }
}
