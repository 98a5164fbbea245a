//! Strict reading of a Stripe request's parameters: each route takes the parameters it knows,
//! typed, and whatever is left is refused as Stripe refuses it ("Received unknown parameter"),
//! so a request the real API would refuse is refused here too.

use std::collections::BTreeMap;

use asiento_psp::stripe::form::{self, FormValue};

use super::render::StripeError;

/// What is left of a request while a route reads it.
pub(super) struct Params {
    values: BTreeMap<String, FormValue>,
}

impl Params {
    pub fn parse(body: &[u8]) -> Result<Params, StripeError> {
        let values = form::parse(body).map_err(|error| StripeError::invalid(error.to_string()))?;
        Ok(Params { values })
    }

    fn take(&mut self, name: &str) -> Option<FormValue> {
        self.values.remove(name)
    }

    pub fn text(&mut self, name: &str) -> Result<Option<String>, StripeError> {
        match self.take(name) {
            None => Ok(None),
            Some(FormValue::Text(text)) => Ok(Some(text)),
            Some(other) => Err(StripeError::invalid_param(
                name,
                format!("Invalid {name}: must be a string, not {}", other.kind()),
            )),
        }
    }

    pub fn required_text(&mut self, name: &str) -> Result<String, StripeError> {
        self.text(name)?.ok_or_else(|| StripeError::missing(name))
    }

    pub fn integer(&mut self, name: &str) -> Result<Option<i64>, StripeError> {
        let Some(text) = self.text(name)? else {
            return Ok(None);
        };
        text.parse::<i64>().map(Some).map_err(|_| {
            StripeError::invalid_param(name, format!("Invalid integer: {text}"))
                .with_code("parameter_invalid_integer")
        })
    }

    pub fn boolean(&mut self, name: &str) -> Result<Option<bool>, StripeError> {
        match self.text(name)?.as_deref() {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(StripeError::invalid_param(
                name,
                format!("Invalid boolean: {other}"),
            )),
        }
    }

    /// One of `allowed`, or `None`.
    pub fn one_of(
        &mut self,
        name: &str,
        allowed: &[&'static str],
    ) -> Result<Option<&'static str>, StripeError> {
        let Some(text) = self.text(name)? else {
            return Ok(None);
        };
        allowed
            .iter()
            .copied()
            .find(|value| *value == text)
            .map(Some)
            .ok_or_else(|| {
                StripeError::invalid_param(
                    name,
                    format!("Invalid {name}: must be one of {}", allowed.join(", ")),
                )
            })
    }

    /// `name[k]=v` pairs; an empty value unsets the key, as Stripe's metadata does.
    pub fn metadata(&mut self) -> Result<BTreeMap<String, String>, StripeError> {
        let entries = match self.take("metadata") {
            None => return Ok(BTreeMap::new()),
            Some(FormValue::Text(text)) if text.is_empty() => return Ok(BTreeMap::new()),
            Some(FormValue::Map(entries)) => entries,
            Some(other) => {
                return Err(StripeError::invalid_param(
                    "metadata",
                    format!("Invalid metadata: must be a hash, not {}", other.kind()),
                ))
            }
        };
        let mut metadata = BTreeMap::new();
        for (key, value) in entries {
            let FormValue::Text(value) = value else {
                return Err(StripeError::invalid_param(
                    "metadata",
                    format!("Invalid metadata[{key}]: must be a string"),
                ));
            };
            if key.chars().count() > METADATA_KEY_CHARS_MAX
                || value.chars().count() > METADATA_VALUE_CHARS_MAX
            {
                return Err(StripeError::invalid_param(
                    "metadata",
                    format!(
                        "Metadata keys can be up to {METADATA_KEY_CHARS_MAX} characters and \
                         values up to {METADATA_VALUE_CHARS_MAX}"
                    ),
                ));
            }
            if !value.is_empty() {
                metadata.insert(key, value);
            }
        }
        if metadata.len() > METADATA_KEYS_MAX {
            return Err(StripeError::invalid_param(
                "metadata",
                format!("You can specify up to {METADATA_KEYS_MAX} metadata keys"),
            ));
        }
        Ok(metadata)
    }

    /// `name[0]=a&name[1]=b` (or `name[]=`) as strings.
    pub fn list(&mut self, name: &str) -> Result<Vec<String>, StripeError> {
        match self.take(name) {
            None => Ok(Vec::new()),
            Some(FormValue::List(items)) => items
                .into_iter()
                .map(|item| match item {
                    FormValue::Text(text) => Ok(text),
                    other => Err(StripeError::invalid_param(
                        name,
                        format!(
                            "Invalid {name}: items must be strings, not {}",
                            other.kind()
                        ),
                    )),
                })
                .collect(),
            Some(other) => Err(StripeError::invalid_param(
                name,
                format!(
                    "Invalid array: {name} must be an array, not {}",
                    other.kind()
                ),
            )),
        }
    }

    /// A nested hash (`automatic_payment_methods[enabled]=true`), read with the same strictness.
    pub fn hash(&mut self, name: &str) -> Result<Option<Params>, StripeError> {
        match self.take(name) {
            None => Ok(None),
            Some(FormValue::Map(values)) => Ok(Some(Params { values })),
            Some(other) => Err(StripeError::invalid_param(
                name,
                format!("Invalid {name}: must be a hash, not {}", other.kind()),
            )),
        }
    }

    /// `created=<t>` or `created[gte|gt|lte|lt]=<t>` as an inclusive range.
    pub fn created(&mut self) -> Result<(i64, i64), StripeError> {
        match self.take("created") {
            None => Ok((i64::MIN, i64::MAX)),
            Some(FormValue::Text(text)) => {
                let at = text.parse::<i64>().map_err(|_| {
                    StripeError::invalid_param("created", format!("Invalid integer: {text}"))
                })?;
                Ok((at, at))
            }
            Some(FormValue::Map(values)) => {
                let mut range = Params { values };
                let mut from = i64::MIN;
                let mut to = i64::MAX;
                if let Some(at) = range.integer("gte")? {
                    from = from.max(at);
                }
                if let Some(at) = range.integer("gt")? {
                    from = from.max(at.saturating_add(1));
                }
                if let Some(at) = range.integer("lte")? {
                    to = to.min(at);
                }
                if let Some(at) = range.integer("lt")? {
                    to = to.min(at.saturating_sub(1));
                }
                range.finish_in("created")?;
                Ok((from, to))
            }
            Some(other) => Err(StripeError::invalid_param(
                "created",
                format!(
                    "Invalid created: must be an integer or a hash, not {}",
                    other.kind()
                ),
            )),
        }
    }

    /// `limit` (1 to 100, default 10).
    pub fn limit(&mut self) -> Result<usize, StripeError> {
        match self.integer("limit")? {
            None => Ok(LIST_LIMIT_DEFAULT),
            Some(limit) if (1..=LIST_LIMIT_MAX as i64).contains(&limit) => Ok(limit as usize),
            Some(_) => Err(StripeError::invalid_param(
                "limit",
                format!("This value must be greater than or equal to 1 and less than or equal to {LIST_LIMIT_MAX}"),
            )),
        }
    }

    /// Refuses whatever the route did not read.
    pub fn finish(self) -> Result<(), StripeError> {
        match self.values.into_keys().next() {
            None => Ok(()),
            Some(name) => Err(StripeError::invalid_param(
                &name,
                format!("Received unknown parameter: {name}"),
            )
            .with_code("parameter_unknown")),
        }
    }

    fn finish_in(self, parent: &str) -> Result<(), StripeError> {
        match self.values.into_keys().next() {
            None => Ok(()),
            Some(name) => Err(StripeError::invalid_param(
                &format!("{parent}[{name}]"),
                format!("Received unknown parameter: {parent}[{name}]"),
            )
            .with_code("parameter_unknown")),
        }
    }

    /// Refuses whatever a nested hash's reader did not take.
    pub fn finish_hash(self, parent: &str) -> Result<(), StripeError> {
        self.finish_in(parent)
    }
}

pub const METADATA_KEYS_MAX: usize = 50;
pub const METADATA_KEY_CHARS_MAX: usize = 40;
pub const METADATA_VALUE_CHARS_MAX: usize = 500;
pub const LIST_LIMIT_DEFAULT: usize = 10;
pub const LIST_LIMIT_MAX: usize = 100;
