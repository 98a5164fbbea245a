//! `GET /v1/payments` as CSV (`Accept: text/csv`): every payment the filters match, in the
//! list's order (newest first), streamed page by page
//! ([`asiento_payments_view::export_page`]), so that the server's memory stays flat however
//! many payments a period holds. The figures are minor units beside their currency; the
//! metadata is its JSON object, as one field.

use asiento_domain::TenantId;
use asiento_payments_view::{Page, PaymentFilter};
use axum::response::Response;

use crate::csv::field;
use crate::reads::ReadSide;

/// The header row: API.md "Payments as CSV" documents each column.
pub(crate) const CSV_COLUMNS: &str = "payment_id,status,amount_minor,currency,customer,provider,\
captured_minor,refunded_minor,fee_minor,created_at,updated_at,description,metadata";

fn rows(page: &Page) -> String {
    let mut out = String::new();
    for payment in &page.data {
        let metadata = serde_json::to_string(&payment.metadata).unwrap_or_else(|_| "{}".into());
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{}\r\n",
            payment.id,
            payment.status,
            payment.amount_minor,
            field(&payment.currency),
            field(&payment.customer),
            field(&payment.provider),
            payment.captured_minor,
            payment.refunded_minor,
            payment.fee_minor,
            asiento_objects::time(&payment.created_at),
            asiento_objects::time(&payment.updated_at),
            field(payment.description.as_deref().unwrap_or_default()),
            field(&metadata),
        ));
    }
    out
}

/// The header and `first` page's rows, then every later page as the client reads, from the
/// database that gave the first.
pub(crate) fn csv_response(
    side: ReadSide,
    tenant: TenantId,
    filter: PaymentFilter,
    first: Page,
) -> Response {
    let head = format!("{CSV_COLUMNS}\r\n{}", rows(&first));
    crate::csv::streamed(
        "payments.csv",
        head,
        first.next_cursor,
        None,
        move |cursor| {
            let (side, tenant) = (side.clone(), tenant.clone());
            let filter = PaymentFilter {
                cursor: Some(cursor),
                ..filter.clone()
            };
            async move {
                let page =
                    asiento_payments_view::export_page(&side.database, &tenant, filter).await?;
                let rows = rows(&page);
                Ok::<_, asiento_payments_view::ViewError>((rows, page.next_cursor))
            }
        },
    )
}
