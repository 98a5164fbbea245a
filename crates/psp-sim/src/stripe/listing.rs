//! Stripe's listings: newest first, within a `created` window, `limit` objects a page, after
//! (`starting_after`, older than) or before (`ending_before`, newer than) a cursor object, in
//! the `{"object": "list", …}` envelope.

use super::params::Params;
use super::render::{self, StripeError};
use crate::state::Reply;

/// What a listing request asked for.
pub(crate) struct Listing {
    from: i64,
    to: i64,
    limit: usize,
    starting_after: Option<String>,
    ending_before: Option<String>,
}

impl Listing {
    pub fn read(params: &mut Params) -> Result<Listing, StripeError> {
        let (from, to) = params.created()?;
        Ok(Listing {
            from,
            to,
            limit: params.limit()?,
            starting_after: params.text("starting_after")?,
            ending_before: params.text("ending_before")?,
        })
    }

    /// Whether an object created at `created` is in the window.
    pub fn created(&self, created: i64) -> bool {
        (self.from..=self.to).contains(&created)
    }

    /// The page of `items` (newest first, named by `id`) the cursors ask for, each rendered by
    /// `render`, in Stripe's list envelope for `url`.
    pub fn answer<T>(
        &self,
        url: &str,
        items: &[&T],
        id: impl Fn(&T) -> &str,
        render: impl Fn(&T) -> serde_json::Value,
    ) -> Result<Reply, StripeError> {
        let position = |cursor: &str, param: &str| {
            items
                .iter()
                .position(|item| id(item) == cursor)
                .ok_or_else(|| {
                    StripeError::invalid_param(param, format!("No such object: '{cursor}'"))
                        .with_code("resource_missing")
                })
        };
        let (page, has_more) =
            match (&self.starting_after, &self.ending_before) {
                (Some(_), Some(_)) => return Err(StripeError::invalid(
                    "You may only specify one of these parameters: starting_after, ending_before.",
                )),
                (Some(cursor), None) => {
                    let rest = &items[position(cursor, "starting_after")? + 1..];
                    (&rest[..rest.len().min(self.limit)], rest.len() > self.limit)
                }
                (None, Some(cursor)) => {
                    let before = &items[..position(cursor, "ending_before")?];
                    let skip = before.len().saturating_sub(self.limit);
                    (&before[skip..], skip > 0)
                }
                (None, None) => (
                    &items[..items.len().min(self.limit)],
                    items.len() > self.limit,
                ),
            };
        let data = page.iter().map(|item| render(item)).collect();
        Ok(super::ok(&render::list(url, data, has_more)))
    }
}
