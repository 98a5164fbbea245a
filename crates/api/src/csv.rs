//! CSV answers (statements, the journal, payments): fields quoted where RFC 4180 needs it, the `Accept`
//! that asks for CSV, and a body written page by page as the client reads it, so that the
//! server's memory stays flat however long the period.

use std::future::Future;
use std::sync::Arc;

use axum::{
    body::{Body, Bytes},
    http::{header, HeaderMap, HeaderValue},
    response::{IntoResponse, Response},
};

/// Rows read per page while streaming a CSV answer. Each page's allocations (its rows, its text)
/// stay under the allocator's mmap threshold (glibc's 128 KiB), so that page after page reuses
/// the same heap: with pages of a thousand entries the server's peak grew by a third over its
/// warm size, with these it stays within a tenth (`bench replay` W3-export).
pub(crate) const CSV_PAGE_ROWS: usize = 250;

/// One CSV field: quoted when it holds a comma, a quote or a line break.
pub(crate) fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// Whether the request's `Accept` names `text/csv`.
pub(crate) fn wants_csv(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| {
            accept
                .split(',')
                .any(|item| item.trim().split(';').next() == Some("text/csv"))
        })
}

/// A CSV answer: `head` (the header and the first page's rows), then the rows of each page
/// `next_page` reads from the cursor the one before named, then `tail`. An error after the
/// first byte is logged and ends the body without HTTP's last chunk, which clients report as an
/// error.
pub(crate) fn streamed<C, F, Fut, E>(
    filename: &str,
    head: String,
    next: Option<C>,
    tail: Option<String>,
    next_page: F,
) -> Response
where
    C: Send + 'static,
    F: Fn(C) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(String, Option<C>), E>> + Send + 'static,
    E: std::fmt::Display,
{
    let next_page = Arc::new(next_page);
    let chunks = futures::stream::unfold((Some(head), next, tail), move |(pending, next, tail)| {
        let next_page = Arc::clone(&next_page);
        async move {
            if let Some(rows) = pending {
                return Some((Ok(Bytes::from(rows)), (None, next, tail)));
            }
            let Some(cursor) = next else {
                return tail.map(|rows| (Ok(Bytes::from(rows)), (None, None, None)));
            };
            match next_page(cursor).await {
                Ok((rows, next)) => Some((Ok(Bytes::from(rows)), (None, next, tail))),
                Err(error) => {
                    tracing::error!(%error, "a CSV answer was cut short");
                    Some((
                        Err(std::io::Error::other(error.to_string())),
                        (None, None, None),
                    ))
                }
            }
        }
    });
    let mut response = Body::from_stream(chunks).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}
