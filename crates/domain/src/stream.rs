//! Stream names, in one place: every writer and reader of the log builds and
//! parses them here.
//!
//! - `payment-{pay_…}`: a payment and the entries its facts post;
//! - `transfer-{tr_…}`: a transfer and its entry;
//! - `account-{tenant}:{account}:{currency}`: the debit guard of an account
//!   that must not go negative;
//! - `exception-{exc_…}`: a reconciliation exception;
//! - `payout-{provider}:{po_…}`: a provider's payout and the entries that move it to the bank;
//! - `webhook_endpoint-{we_…}`: what a merchant is told about its webhook endpoint;
//! - `balance_monitor-{bm_…}`: a balance monitor's creation and deletion.

use crate::account::AccountName;
use crate::exception::ExceptionId;
use crate::ids::{PaymentId, ProviderName, TenantId, TransferId};
use crate::money::Currency;
use crate::payout::PayoutId;

pub const PAYMENT_PREFIX: &str = "payment-";
pub const TRANSFER_PREFIX: &str = "transfer-";
pub const GUARD_PREFIX: &str = "account-";
pub const EXCEPTION_PREFIX: &str = "exception-";
pub const PAYOUT_PREFIX: &str = "payout-";
pub const ENDPOINT_PREFIX: &str = "webhook_endpoint-";
pub const MONITOR_PREFIX: &str = "balance_monitor-";

/// The stream of a balance monitor (`crate::monitor`); None for a malformed id.
#[must_use]
pub fn monitor_stream(id: &str) -> Option<String> {
    crate::monitor::is_monitor_id(id).then(|| format!("{MONITOR_PREFIX}{id}"))
}

/// The stream of a webhook endpoint (`crate::endpoint`); None for a malformed id.
#[must_use]
pub fn endpoint_stream(id: &str) -> Option<String> {
    crate::endpoint::is_endpoint_id(id).then(|| format!("{ENDPOINT_PREFIX}{id}"))
}

#[must_use]
pub fn payment_stream(id: PaymentId) -> String {
    format!("{PAYMENT_PREFIX}{id}")
}

#[must_use]
pub fn transfer_stream(id: TransferId) -> String {
    format!("{TRANSFER_PREFIX}{id}")
}

#[must_use]
pub fn exception_stream(id: ExceptionId) -> String {
    format!("{EXCEPTION_PREFIX}{id}")
}

#[must_use]
pub fn payout_stream(provider: &ProviderName, payout: &PayoutId) -> String {
    format!("{PAYOUT_PREFIX}{provider}:{payout}")
}

#[must_use]
pub fn guard_stream(tenant: &TenantId, account: &AccountName, currency: Currency) -> String {
    format!("{GUARD_PREFIX}{tenant}:{account}:{currency}")
}

/// A parsed stream name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamKind {
    Payment(PaymentId),
    Transfer(TransferId),
    Guard {
        tenant: TenantId,
        account: AccountName,
        currency: Currency,
    },
    Exception(ExceptionId),
    Payout {
        provider: ProviderName,
        payout: PayoutId,
    },
    /// A webhook endpoint, by its `we_…` id.
    WebhookEndpoint(String),
    /// A balance monitor, by its `bm_…` id.
    BalanceMonitor(String),
}

impl StreamKind {
    #[must_use]
    pub fn parse(stream_id: &str) -> Option<StreamKind> {
        if let Some(id) = stream_id.strip_prefix(PAYMENT_PREFIX) {
            return PaymentId::parse(id).ok().map(StreamKind::Payment);
        }
        if let Some(id) = stream_id.strip_prefix(TRANSFER_PREFIX) {
            return TransferId::parse(id).ok().map(StreamKind::Transfer);
        }
        if let Some(id) = stream_id.strip_prefix(EXCEPTION_PREFIX) {
            return ExceptionId::parse(id).ok().map(StreamKind::Exception);
        }
        if let Some(id) = stream_id.strip_prefix(ENDPOINT_PREFIX) {
            return crate::endpoint::is_endpoint_id(id)
                .then(|| StreamKind::WebhookEndpoint(id.to_owned()));
        }
        if let Some(id) = stream_id.strip_prefix(MONITOR_PREFIX) {
            return crate::monitor::is_monitor_id(id)
                .then(|| StreamKind::BalanceMonitor(id.to_owned()));
        }
        if let Some(rest) = stream_id.strip_prefix(PAYOUT_PREFIX) {
            // A provider name has no ':' and a payout id none either.
            let (provider, payout) = rest.split_once(':')?;
            return Some(StreamKind::Payout {
                provider: ProviderName::parse(provider).ok()?,
                payout: PayoutId::parse(payout).ok()?,
            });
        }
        let rest = stream_id.strip_prefix(GUARD_PREFIX)?;
        // Segments cannot contain ':', so the tenant ends at the first one
        // and the currency starts after the last one.
        let (tenant, rest) = rest.split_once(':')?;
        let (account, currency) = rest.rsplit_once(':')?;
        Some(StreamKind::Guard {
            tenant: TenantId::parse(tenant).ok()?,
            account: AccountName::parse(account).ok()?,
            currency: Currency::parse(currency).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn stream_names_round_trip() {
        let pay = PaymentId::from_uuid(Uuid::from_u128(1));
        let tr = TransferId::from_uuid(Uuid::from_u128(2));
        let tenant = TenantId::parse("acme").unwrap();
        let account = AccountName::parse("customer:42:available").unwrap();
        let usd = Currency::parse("USD").unwrap();
        assert_eq!(
            payment_stream(pay),
            "payment-pay_00000000000000000000000000000001"
        );
        assert_eq!(
            StreamKind::parse(&payment_stream(pay)),
            Some(StreamKind::Payment(pay))
        );
        assert_eq!(
            StreamKind::parse(&transfer_stream(tr)),
            Some(StreamKind::Transfer(tr))
        );
        let guard = guard_stream(&tenant, &account, usd);
        assert_eq!(guard, "account-acme:customer:42:available:USD");
        assert_eq!(
            StreamKind::parse(&guard),
            Some(StreamKind::Guard {
                tenant,
                account,
                currency: usd
            })
        );
        let endpoint = endpoint_stream("we_0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(
            StreamKind::parse(&endpoint),
            Some(StreamKind::WebhookEndpoint(
                "we_0123456789abcdef0123456789abcdef".to_owned()
            ))
        );
        assert_eq!(endpoint_stream("we_nope"), None);
        let monitor = monitor_stream("bm_0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(
            StreamKind::parse(&monitor),
            Some(StreamKind::BalanceMonitor(
                "bm_0123456789abcdef0123456789abcdef".to_owned()
            ))
        );
        assert_eq!(monitor_stream("bm_nope"), None);
        let exc = ExceptionId::from_uuid(Uuid::from_u128(3));
        assert_eq!(
            exception_stream(exc),
            "exception-exc_00000000000000000000000000000003"
        );
        assert_eq!(
            StreamKind::parse(&exception_stream(exc)),
            Some(StreamKind::Exception(exc))
        );
        let stripe = ProviderName::parse("stripe").unwrap();
        let po = PayoutId::parse("po_1OaBc").unwrap();
        assert_eq!(payout_stream(&stripe, &po), "payout-stripe:po_1OaBc");
        assert_eq!(
            StreamKind::parse(&payout_stream(&stripe, &po)),
            Some(StreamKind::Payout {
                provider: stripe,
                payout: po
            })
        );
        assert_eq!(StreamKind::parse("payout-stripe:po:1"), None);
        assert_eq!(StreamKind::parse("webhook-1"), None);
        assert_eq!(StreamKind::parse("account-acme:USD"), None);
    }
}
