//! A completion's response, rendered from the position of the last event its step appends, which
//! only the write knows.
//!
//! The one-statement batch (`statement`) stores such a response inside the database,
//! around the position the INSERT takes: it needs the response split at the position's decimal
//! text ([`Respond::split`]). Finding that split renders the response once, with a probe position
//! whose text must occur exactly once in it (a client's string that happens to hold it makes the
//! response unsplittable, and the batch takes the transaction path). That nothing else of a
//! response depends on the position is an invariant of the renderers, asserted in debug builds
//! (every test) by a second rendering. The split is found once per response and kept: a flow finds
//! it in its request's own task ([`Respond::prepare_for`]), off the writer's path that every
//! request of a batch waits for, and the answer given once the step is written is the split filled
//! in ([`Respond::at`]), not another rendering.

use std::sync::{Arc, OnceLock};

use asiento_eventstore::Backend;

use crate::idempotency::StoredResponse;

/// The position a response is rendered with to find where its position goes. Large, so that its
/// text is unlikely anywhere else in a response (if it is, the response does not split).
const PROBE: i64 = i64::MAX - 1;
/// Another position, rendered in debug builds to check the split against.
const CHECK: i64 = i64::MAX - 2;

/// A response split at its position: the response with the part before it as its body, and the
/// part after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub head: StoredResponse,
    pub tail: Vec<u8>,
}

impl Split {
    /// The response with `position` in its place.
    fn fill(&self, position: i64) -> StoredResponse {
        let position = position.to_string();
        let mut body = Vec::with_capacity(self.head.body.len() + position.len() + self.tail.len());
        body.extend_from_slice(&self.head.body);
        body.extend_from_slice(position.as_bytes());
        body.extend_from_slice(&self.tail);
        StoredResponse {
            status: self.head.status,
            body,
        }
    }
}

type Render = dyn Fn(Option<i64>) -> StoredResponse + Send + Sync;

/// Renders a completion's response from the position of the last event its step appended
/// (`None`: it appended none). Nothing else of the append may go into the response.
pub struct Respond {
    render: Box<Render>,
    split: OnceLock<Option<Split>>,
}

impl std::fmt::Debug for Respond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Respond")
            .field("split", &self.split.get())
            .finish_non_exhaustive()
    }
}

impl Respond {
    pub fn new(
        render: impl Fn(Option<i64>) -> StoredResponse + Send + Sync + 'static,
    ) -> Arc<Respond> {
        Arc::new(Respond {
            render: Box::new(render),
            split: OnceLock::new(),
        })
    }

    /// The response for a step whose last event is at `position`.
    pub fn at(&self, position: Option<i64>) -> StoredResponse {
        match (position, self.split.get()) {
            (Some(position), Some(Some(split))) => split.fill(position),
            _ => (self.render)(position),
        }
    }

    /// The response split at its position, if the position's decimal text is in exactly one
    /// place; found on first use.
    ///
    /// # Panics
    ///
    /// In debug builds, if something else of the response depends on the position: a renderer
    /// that breaks the invariant this type rests on.
    pub fn split(&self) -> Option<&Split> {
        self.split.get_or_init(|| self.find_split()).as_ref()
    }

    /// Finds the split now, in the caller's task, if `backend` writes a batch as one statement
    /// (PostgreSQL, which needs it), so that the writer finds it ready. Elsewhere the answer is
    /// rendered once, when the step is written.
    pub fn prepare_for(&self, backend: Backend) {
        if backend == Backend::Postgres {
            self.split();
        }
    }

    fn find_split(&self) -> Option<Split> {
        let rendered = (self.render)(Some(PROBE));
        let probe = PROBE.to_string();
        let mut found = memchr::memmem::find_iter(&rendered.body, probe.as_bytes());
        let (at, None) = (found.next()?, found.next()) else {
            return None;
        };
        let split = Split {
            head: StoredResponse {
                status: rendered.status,
                body: rendered.body[..at].to_vec(),
            },
            tail: rendered.body[at + probe.len()..].to_vec(),
        };
        debug_assert!(
            split.fill(CHECK) == (self.render)(Some(CHECK)),
            "a response depends on its position elsewhere than where the position is written"
        );
        Some(split)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn respond(render: impl Fn(Option<i64>) -> String + Send + Sync + 'static) -> Arc<Respond> {
        Respond::new(move |position| StoredResponse {
            status: 201,
            body: render(position).into_bytes(),
        })
    }

    #[test]
    fn a_response_splits_around_its_one_position() {
        let respond = respond(|p| format!("{{\"id\":\"a\",\"position\":{}}}", p.unwrap_or(0)));
        let split = respond.split().expect("one position");
        assert_eq!(split.head.body, b"{\"id\":\"a\",\"position\":");
        assert_eq!(split.tail, b"}");
        assert_eq!(split.head.status, 201);
    }

    #[test]
    fn a_response_that_does_not_split_cleanly_is_refused() {
        // The position twice.
        let twice = respond(|p| format!("[{0},{0}]", p.unwrap_or(0)));
        assert!(twice.split().is_none());
        // The probe's text also elsewhere (a client's string).
        let echo = respond(|p| format!("[\"{}\",{}]", i64::MAX - 1, p.unwrap_or(0)));
        assert!(echo.split().is_none());
        // No position at all.
        assert!(respond(|_| "{}".to_owned()).split().is_none());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "depends on its position elsewhere")]
    fn a_response_that_depends_on_its_position_elsewhere_is_a_bug() {
        let derived = respond(|p| format!("[{},{}]", p.unwrap_or(0), p.unwrap_or(0) % 7));
        let _ = derived.split();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "depends on its position elsewhere")]
    fn a_status_that_depends_on_the_position_is_a_bug() {
        let respond = Respond::new(|p: Option<i64>| StoredResponse {
            status: if p == Some(PROBE) { 201 } else { 200 },
            body: format!("{}", p.unwrap_or(0)).into_bytes(),
        });
        let _ = respond.split();
    }

    #[test]
    fn an_answer_is_the_rendering_whether_or_not_the_split_was_found() {
        let render = |p: Option<i64>| format!("{{\"position\":{},\"n\":7}}", p.unwrap_or(-1));
        for prepared in [false, true] {
            let respond = respond(render);
            respond.prepare_for(if prepared {
                Backend::Postgres
            } else {
                Backend::Sqlite
            });
            assert_eq!(respond.split.get().is_some(), prepared);
            for position in [None, Some(0), Some(42), Some(i64::MAX)] {
                assert_eq!(
                    respond.at(position).body,
                    render(position).into_bytes(),
                    "prepared: {prepared}, position: {position:?}"
                );
            }
        }
        // A response that does not split is rendered each time.
        let twice = |p: Option<i64>| format!("[{0},{0}]", p.unwrap_or(0));
        let respond = respond(twice);
        respond.prepare_for(Backend::Postgres);
        assert!(respond.split().is_none());
        assert_eq!(respond.at(Some(12)).body, twice(Some(12)).into_bytes());
    }
}
