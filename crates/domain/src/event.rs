//! How events are stored: a stable type name, a payload schema version and
//! a JSON payload, per event family, plus the upcaster that lifts payloads
//! written under an older schema to the current one.
//!
//! The event store keeps `(event_type, schema, data)`; names and shapes here
//! are a contract with every event ever written, which is why each event
//! type has a golden JSON test (`tests/golden.rs`).

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;

use crate::endpoint::EndpointEvent;
use crate::entry::JournalEntry;
use crate::exception::ExceptionEvent;
use crate::guard::GuardEvent;
use crate::monitor::MonitorEvent;
use crate::payment::PaymentEvent;
use crate::payout::PayoutEvent;
use crate::stream::StreamKind;
use crate::transfer::TransferEvent;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown event type {event_type:?}")]
    UnknownType { event_type: String },
    #[error("event type {event_type} has no schema {schema}")]
    UnknownSchema { event_type: String, schema: i32 },
    #[error("{event_type} (schema {schema}) does not decode: {message}")]
    Invalid {
        event_type: String,
        schema: i32,
        message: String,
    },
    #[error("stream {0:?} belongs to no event family")]
    UnknownStream(String),
}

impl DecodeError {
    pub(crate) fn invalid(event_type: &str, schema: i32, error: impl fmt::Display) -> DecodeError {
        DecodeError::Invalid {
            event_type: event_type.to_owned(),
            schema,
            message: error.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event {event_type} does not encode: {message}")]
pub struct EncodeError {
    pub event_type: &'static str,
    pub message: String,
}

/// Declares an event family: an enum whose variants wrap payload structs of
/// the same name, with the codec the store needs. The variant name is the
/// stored type name, so renaming a variant is a breaking change and the
/// golden tests catch it.
macro_rules! event_family {
    ($(#[$meta:meta])* $family:ident { $($variant:ident = $schema:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub enum $family {
            $($variant($variant)),*
        }

        impl $family {
            /// Every type name of the family with its current schema.
            pub const TYPES: &'static [(&'static str, i32)] = &[$((stringify!($variant), $schema)),*];

            #[must_use]
            pub fn event_type(&self) -> &'static str {
                match self {
                    $($family::$variant(_) => stringify!($variant)),*
                }
            }

            /// The schema this code writes.
            #[must_use]
            pub fn schema_version(&self) -> i32 {
                match self {
                    $($family::$variant(_) => $schema),*
                }
            }

            pub fn encode(&self) -> Result<serde_json::Value, $crate::event::EncodeError> {
                let result = match self {
                    $($family::$variant(payload) => serde_json::to_value(payload)),*
                };
                result.map_err(|e| $crate::event::EncodeError {
                    event_type: self.event_type(),
                    message: e.to_string(),
                })
            }

            /// Decodes a stored event, upcasting older schemas first. Reads the payload in
            /// place: only an event that needs upcasting is copied.
            pub fn decode(
                event_type: &str,
                schema: i32,
                data: &serde_json::Value,
            ) -> Result<Self, $crate::event::DecodeError> {
                let (schema, data) = $crate::event::upcast_ref(event_type, schema, data)?;
                Self::decode_current(event_type, schema, data.as_ref())
            }

            /// [`Self::decode`] from the payload's JSON text: one typed parse, no
            /// `serde_json::Value` on the way unless the event needs upcasting.
            pub fn decode_raw(
                event_type: &str,
                schema: i32,
                raw: &str,
            ) -> Result<Self, $crate::event::DecodeError> {
                if $crate::event::needs_upcast(event_type, schema) {
                    let data = $crate::event::parse_payload(event_type, schema, raw)?;
                    return Self::decode(event_type, schema, &data);
                }
                let mut parser = serde_json::Deserializer::from_str(raw);
                let decoded = Self::decode_current(event_type, schema, &mut parser)?;
                parser.end().map_err(|e| $crate::event::DecodeError::invalid(event_type, schema, e))?;
                Ok(decoded)
            }

            /// Decodes a payload already in the current schema of its type.
            fn decode_current<'de, D>(
                event_type: &str,
                schema: i32,
                data: D,
            ) -> Result<Self, $crate::event::DecodeError>
            where
                D: serde::Deserializer<'de, Error = serde_json::Error>,
            {
                match event_type {
                    $(stringify!($variant) => {
                        if schema != $schema {
                            return Err($crate::event::DecodeError::UnknownSchema {
                                event_type: event_type.to_owned(),
                                schema,
                            });
                        }
                        <$variant as serde::Deserialize>::deserialize(data)
                            .map($family::$variant)
                            .map_err(|e| $crate::event::DecodeError::invalid(event_type, schema, e))
                    })*
                    other => Err($crate::event::DecodeError::UnknownType {
                        event_type: other.to_owned(),
                    }),
                }
            }
        }

        $(
            impl From<$variant> for $family {
                fn from(payload: $variant) -> Self {
                    $family::$variant(payload)
                }
            }
        )*
    };
}
pub(crate) use event_family;

/// Lifts a stored payload to the current schema of its type. Pure and
/// stateless, so the store may run it as its read hook, and `decode` runs it
/// anyway (running it twice is harmless: current schemas pass through).
///
/// Shape changes so far:
/// - `PaymentIntended` 1 → 2: the first version predates several providers
///   and manual capture; `amount` became `amount_minor` (the API's name) and
///   `provider` (`"sim"`, the only provider then) and `capture`
///   (`"automatic"`, the only mode then) were added.
pub fn upcast(event_type: &str, schema: i32, data: Value) -> Result<(i32, Value), DecodeError> {
    let (schema, lifted) = match upcast_ref(event_type, schema, &data)? {
        (schema, Cow::Owned(lifted)) => (schema, Some(lifted)),
        (schema, Cow::Borrowed(_)) => (schema, None),
    };
    Ok((schema, lifted.unwrap_or(data)))
}

/// [`upcast`] on a borrowed payload: borrowed back unchanged when it is current, copied only
/// when it has to change.
pub fn upcast_ref<'a>(
    event_type: &str,
    schema: i32,
    data: &'a Value,
) -> Result<(i32, Cow<'a, Value>), DecodeError> {
    if !needs_upcast(event_type, schema) {
        return Ok((schema, Cow::Borrowed(data)));
    }
    match (event_type, schema) {
        ("PaymentIntended", 1) => {
            let invalid = |message: &str| DecodeError::Invalid {
                event_type: event_type.to_owned(),
                schema,
                message: message.to_owned(),
            };
            let Value::Object(object) = data else {
                return Err(invalid("payload is not an object"));
            };
            let mut object = object.clone();
            let amount = object
                .remove("amount")
                .ok_or_else(|| invalid("missing field `amount`"))?;
            object.insert("amount_minor".to_owned(), amount);
            object.insert("provider".to_owned(), Value::from("sim"));
            object.insert("capture".to_owned(), Value::from("automatic"));
            Ok((2, Cow::Owned(Value::Object(object))))
        }
        _ => Ok((schema, Cow::Borrowed(data))),
    }
}

/// Whether [`upcast_ref`] changes payloads of this type and schema.
#[must_use]
pub fn needs_upcast(event_type: &str, schema: i32) -> bool {
    matches!((event_type, schema), ("PaymentIntended", 1))
}

/// A stored payload's text as a JSON tree.
pub(crate) fn parse_payload(
    event_type: &str,
    schema: i32,
    raw: &str,
) -> Result<Value, DecodeError> {
    serde_json::from_str(raw).map_err(|e| DecodeError::invalid(event_type, schema, e))
}

/// Any event of any stream, for readers of the whole log (projections,
/// the invariant checker) that dispatch on the stream's family.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Payment(PaymentEvent),
    Transfer(TransferEvent),
    Guard(GuardEvent),
    Exception(ExceptionEvent),
    Payout(PayoutEvent),
    WebhookEndpoint(EndpointEvent),
    BalanceMonitor(MonitorEvent),
}

impl Event {
    pub fn decode(
        stream_id: &str,
        event_type: &str,
        schema: i32,
        data: &Value,
    ) -> Result<Event, DecodeError> {
        match StreamKind::parse(stream_id) {
            Some(StreamKind::Payment(_)) => {
                PaymentEvent::decode(event_type, schema, data).map(Event::Payment)
            }
            Some(StreamKind::Transfer(_)) => {
                TransferEvent::decode(event_type, schema, data).map(Event::Transfer)
            }
            Some(StreamKind::Guard { .. }) => {
                GuardEvent::decode(event_type, schema, data).map(Event::Guard)
            }
            Some(StreamKind::Exception(_)) => {
                ExceptionEvent::decode(event_type, schema, data).map(Event::Exception)
            }
            Some(StreamKind::Payout { .. }) => {
                PayoutEvent::decode(event_type, schema, data).map(Event::Payout)
            }
            Some(StreamKind::WebhookEndpoint(_)) => {
                EndpointEvent::decode(event_type, schema, data).map(Event::WebhookEndpoint)
            }
            Some(StreamKind::BalanceMonitor(_)) => {
                MonitorEvent::decode(event_type, schema, data).map(Event::BalanceMonitor)
            }
            None => Err(DecodeError::UnknownStream(stream_id.to_owned())),
        }
    }

    /// [`Event::decode`] from the payload's JSON text.
    pub fn decode_raw(
        stream_id: &str,
        event_type: &str,
        schema: i32,
        raw: &str,
    ) -> Result<Event, DecodeError> {
        match StreamKind::parse(stream_id) {
            Some(StreamKind::Payment(_)) => {
                PaymentEvent::decode_raw(event_type, schema, raw).map(Event::Payment)
            }
            Some(StreamKind::Transfer(_)) => {
                TransferEvent::decode_raw(event_type, schema, raw).map(Event::Transfer)
            }
            Some(StreamKind::Guard { .. }) => {
                GuardEvent::decode_raw(event_type, schema, raw).map(Event::Guard)
            }
            Some(StreamKind::Exception(_)) => {
                ExceptionEvent::decode_raw(event_type, schema, raw).map(Event::Exception)
            }
            Some(StreamKind::Payout { .. }) => {
                PayoutEvent::decode_raw(event_type, schema, raw).map(Event::Payout)
            }
            Some(StreamKind::WebhookEndpoint(_)) => {
                EndpointEvent::decode_raw(event_type, schema, raw).map(Event::WebhookEndpoint)
            }
            Some(StreamKind::BalanceMonitor(_)) => {
                MonitorEvent::decode_raw(event_type, schema, raw).map(Event::BalanceMonitor)
            }
            None => Err(DecodeError::UnknownStream(stream_id.to_owned())),
        }
    }

    #[must_use]
    pub fn event_type(&self) -> &'static str {
        match self {
            Event::Payment(e) => e.event_type(),
            Event::Transfer(e) => e.event_type(),
            Event::Guard(e) => e.event_type(),
            Event::Exception(e) => e.event_type(),
            Event::Payout(e) => e.event_type(),
            Event::WebhookEndpoint(e) => e.event_type(),
            Event::BalanceMonitor(e) => e.event_type(),
        }
    }

    #[must_use]
    pub fn schema_version(&self) -> i32 {
        match self {
            Event::Payment(e) => e.schema_version(),
            Event::Transfer(e) => e.schema_version(),
            Event::Guard(e) => e.schema_version(),
            Event::Exception(e) => e.schema_version(),
            Event::Payout(e) => e.schema_version(),
            Event::WebhookEndpoint(e) => e.schema_version(),
            Event::BalanceMonitor(e) => e.schema_version(),
        }
    }

    pub fn encode(&self) -> Result<Value, EncodeError> {
        match self {
            Event::Payment(e) => e.encode(),
            Event::Transfer(e) => e.encode(),
            Event::Guard(e) => e.encode(),
            Event::Exception(e) => e.encode(),
            Event::Payout(e) => e.encode(),
            Event::WebhookEndpoint(e) => e.encode(),
            Event::BalanceMonitor(e) => e.encode(),
        }
    }

    /// The journal entry this event posts, if it is an `EntryPosted`.
    #[must_use]
    pub fn entry(&self) -> Option<&JournalEntry> {
        match self {
            Event::Payment(PaymentEvent::EntryPosted(e))
            | Event::Transfer(TransferEvent::EntryPosted(e))
            | Event::Payout(PayoutEvent::EntryPosted(e)) => Some(&e.entry),
            _ => None,
        }
    }
}
