//! An event's payload as read: the stored JSON text, turned into a
//! `serde_json::Value` only when a reader asks for one.
//!
//! Readers that know the payload's type (the domain, the projections) decode
//! it straight from the text with [`EventData::raw`]: one typed parse instead
//! of building a `Value` tree and walking it again. The tree is built once, on
//! first use of [`EventData::value`] (or through `Deref`), for readers that
//! want to look around in the JSON.

use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use serde_json::value::RawValue;
use serde_json::Value;

/// The JSON payload of a recorded event.
pub struct EventData {
    raw: Box<RawValue>,
    value: OnceLock<Value>,
}

impl EventData {
    /// Wraps JSON text already checked to be one JSON value.
    #[must_use]
    pub fn from_raw(raw: Box<RawValue>) -> EventData {
        EventData {
            raw,
            value: OnceLock::new(),
        }
    }

    /// The payload as JSON text (as stored, or as re-encoded by an upcaster).
    #[must_use]
    pub fn raw(&self) -> &str {
        self.raw.get()
    }

    /// The payload as JSON text that is known to be one JSON value, for a reader that keeps it
    /// (`to_owned` copies the text, parsing nothing).
    #[must_use]
    pub fn raw_value(&self) -> &RawValue {
        &self.raw
    }

    /// The payload as a JSON tree, parsed on first use.
    pub fn value(&self) -> &Value {
        self.value.get_or_init(|| parse(self.raw.get()))
    }

    /// The payload as an owned JSON tree.
    #[must_use]
    pub fn into_value(self) -> Value {
        let EventData { raw, value } = self;
        value.into_inner().unwrap_or_else(|| parse(raw.get()))
    }
}

/// `raw` passed serde_json's own validation when it became a `RawValue`, with
/// the same parser and nesting limit, so this cannot fail; should it ever,
/// the reader sees `null` rather than a crash.
fn parse(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or(Value::Null)
}

impl From<Value> for EventData {
    fn from(value: Value) -> EventData {
        // Serialising a `Value` cannot fail: its map keys are strings.
        let raw = serde_json::value::to_raw_value(&value).unwrap_or_default();
        EventData {
            raw,
            value: OnceLock::from(value),
        }
    }
}

impl Deref for EventData {
    type Target = Value;
    fn deref(&self) -> &Value {
        self.value()
    }
}

impl Clone for EventData {
    fn clone(&self) -> EventData {
        EventData {
            raw: self.raw.clone(),
            value: self.value.clone(),
        }
    }
}

impl fmt::Debug for EventData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.raw())
    }
}

/// Equal when the JSON values are equal, whatever the spelling of the text.
impl PartialEq for EventData {
    fn eq(&self, other: &EventData) -> bool {
        self.raw() == other.raw() || self.value() == other.value()
    }
}

impl PartialEq<Value> for EventData {
    fn eq(&self, other: &Value) -> bool {
        self.value() == other
    }
}

impl serde::Serialize for EventData {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn from_text(text: &str) -> EventData {
        EventData::from_raw(RawValue::from_string(text.to_owned()).expect("valid JSON"))
    }

    #[test]
    fn text_and_tree_agree() {
        let data = from_text(r#"{"b": [1, 2], "a": "x"}"#);
        assert_eq!(data.raw(), r#"{"b": [1, 2], "a": "x"}"#);
        assert_eq!(data["a"], "x");
        assert_eq!(data, json!({ "a": "x", "b": [1, 2] }));
        assert_eq!(data.clone().into_value(), json!({ "a": "x", "b": [1, 2] }));
    }

    #[test]
    fn equal_by_value_not_by_spelling() {
        let spaced = from_text(r#"{ "a" : 1 }"#);
        let from_value = EventData::from(json!({ "a": 1 }));
        assert_eq!(spaced, from_value);
        assert_ne!(spaced, EventData::from(json!({ "a": 2 })));
        assert_eq!(
            serde_json::from_str::<Value>(from_value.raw()).expect("valid"),
            json!({ "a": 1 })
        );
    }
}
