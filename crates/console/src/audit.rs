//! The console's audit trail: every action taken in it, who took it (the name typed at sign-in
//! and the key's fingerprint), on what, and what the command answered. Rows are appended, never
//! changed; a tenant reads its own, the platform operator reads the platform's.

use asiento_eventstore::Database;

use crate::error::ConsoleError;
use crate::session::Session;

/// What was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    SignIn,
    SignOut,
    Capture,
    Refund,
    Cancel,
    ResolveException,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SignIn => "sign_in",
            Action::SignOut => "sign_out",
            Action::Capture => "capture",
            Action::Refund => "refund",
            Action::Cancel => "cancel",
            Action::ResolveException => "resolve_exception",
        }
    }
}

/// One line of the trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub at_ms: i64,
    pub operator: String,
    pub key_fingerprint: String,
    pub action: String,
    pub subject: Option<String>,
    pub detail: String,
    pub outcome: String,
}

/// The rows a page shows at most.
pub const AUDIT_PAGE_MAX: i64 = 200;

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

/// Appends one action of `session`.
pub async fn record(
    database: &Database,
    session: &Session,
    at_ms: i64,
    action: Action,
    subject: Option<&str>,
    detail: &str,
    outcome: &str,
) -> Result<(), ConsoleError> {
    let sql = "insert into console_audit \
               (at_ms, tenant, operator, key_fingerprint, action, subject, detail, outcome) \
               values ($1, $2, $3, $4, $5, $6, $7, $8)";
    let tenant = session.tenant_column();
    match database {
        Database::Postgres(pool) => {
            sqlx::query(sql)
                .bind(at_ms)
                .bind(tenant)
                .bind(&session.operator)
                .bind(&session.key_fingerprint)
                .bind(action.as_str())
                .bind(subject)
                .bind(detail)
                .bind(outcome)
                .execute(pool)
                .await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query(&sqlite(sql))
                .bind(at_ms)
                .bind(tenant)
                .bind(&session.operator)
                .bind(&session.key_fingerprint)
                .bind(action.as_str())
                .bind(subject)
                .bind(detail)
                .bind(outcome)
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}

type Row = (i64, String, String, String, Option<String>, String, String);

/// The newest actions of `session`'s scope first, at most [`AUDIT_PAGE_MAX`]; `subject` keeps
/// those about one payment or exception.
pub async fn list(
    database: &Database,
    session: &Session,
    subject: Option<&str>,
) -> Result<Vec<AuditRow>, ConsoleError> {
    let sql = "select at_ms, operator, key_fingerprint, action, subject, detail, outcome \
               from console_audit \
               where ((tenant is null and $1 is null) or tenant = $1) \
                 and ($2 is null or subject = $2) \
               order by id desc limit $3";
    let tenant = session.tenant_column();
    let rows: Vec<Row> = match database {
        Database::Postgres(pool) => {
            let sql = sql
                .replace("$1 is null", "$1::text is null")
                .replace("$2 is null", "$2::text is null");
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(subject)
                .bind(AUDIT_PAGE_MAX)
                .fetch_all(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(&sqlite(sql))
                .bind(tenant)
                .bind(subject)
                .bind(AUDIT_PAGE_MAX)
                .fetch_all(pool)
                .await?
        }
    };
    Ok(rows
        .into_iter()
        .map(
            |(at_ms, operator, key_fingerprint, action, subject, detail, outcome)| AuditRow {
                at_ms,
                operator,
                key_fingerprint,
                action,
                subject,
                detail,
                outcome,
            },
        )
        .collect())
}
