//! Fuzzing the stored form of events: whatever a row of the log holds (any type name, any schema,
//! any JSON), decoding it is an error value and never a panic; and every event the domain's own
//! decisions emit survives the trip through its stored text form unchanged.
//!
//! The event log is read by every projection, the invariant checker and every use case; a row
//! that panics a decoder would stop all of them, so "never panics" is the property that matters
//! most here. The round trip goes through JSON text (what both backends store and hand back),
//! with the inputs a client controls (metadata, descriptions, provider strings) drawn from odd
//! unicode and extreme numbers.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use asiento_domain::guard::{decide_entry, guarded_keys, DebitGuard, Origin};
use asiento_domain::payment::DisputeOutcome;
use asiento_domain::transfer::{self, decide_with_guards};
use asiento_domain::*;
use chrono::{DateTime, Utc};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use uuid::Uuid;

/// Each property runs in well under a second in a debug build on 2 cores.
const CASES: u32 = 256;

// ---------------------------------------------------------------------------------------------
// Strategies

/// Text a client or a provider could send: ASCII, control characters, escapes, astral planes,
/// combining marks, right-to-left marks, the replacement character, a lone NUL.
fn odd_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_]{0,12}",
        "\\PC{0,24}",
        ".{0,24}",
        Just(String::new()),
        Just("\u{0}".to_owned()),
        Just("\"\\/\u{8}\u{c}\n\r\t".to_owned()),
        Just("e\u{301}\u{200f}\u{fffd}\u{1f4b8}\u{10ffff}".to_owned()),
    ]
}

/// Numbers across every representation serde_json has: small, i64 and u64 extremes, floats
/// including subnormals and the largest finite ones.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-1000i64..1000).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(i64::MIN)),
        Just(Value::from(u64::MAX)),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        Just(Value::Number(Number::from_f64(f64::MAX).unwrap())),
        Just(Value::Number(
            Number::from_f64(f64::MIN_POSITIVE / 2.0).unwrap()
        )),
        Just(Value::Number(Number::from_f64(-0.0).unwrap())),
    ]
}

/// Any JSON value, at most 4 levels deep and about 64 nodes.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        odd_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(odd_text(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Every type name the families know, and names they do not.
fn event_type() -> impl Strategy<Value = String> {
    let known: Vec<String> = PaymentEvent::TYPES
        .iter()
        .chain(TransferEvent::TYPES)
        .chain(GuardEvent::TYPES)
        .chain(ExceptionEvent::TYPES)
        .chain(PayoutEvent::TYPES)
        .map(|(name, _)| (*name).to_owned())
        .collect();
    prop_oneof![3 => proptest::sample::select(known), 1 => odd_text()]
}

fn schema() -> impl Strategy<Value = i32> {
    prop_oneof![4 => 0i32..4, 1 => any::<i32>()]
}

/// Stream names of every family (well formed and almost), and garbage.
fn stream_id() -> impl Strategy<Value = String> {
    let uuid = any::<u128>().prop_map(Uuid::from_u128);
    prop_oneof![
        uuid.clone()
            .prop_map(|u| payment_stream(PaymentId::from_uuid(u))),
        uuid.clone()
            .prop_map(|u| transfer_stream(TransferId::from_uuid(u))),
        uuid.prop_map(|u| exception_stream(ExceptionId::from_uuid(u))),
        Just(guard_stream(
            &TenantId::parse("acme").unwrap(),
            &AccountName::parse("customer:42:available").unwrap(),
            Currency::parse("USD").unwrap(),
        )),
        Just(payout_stream(
            &ProviderName::parse("stripe").unwrap(),
            &PayoutId::parse("po_1").unwrap(),
        )),
        "(payment|transfer|account|exception|payout)-\\PC{0,40}",
        odd_text(),
    ]
}

/// A stored payload: any JSON, or a real event's payload with one field replaced or removed,
/// so that decoding gets past the outer shape into every field's own checks.
fn payload() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => json(),
        2 => (real_event(), any::<prop::sample::Index>(), proptest::option::of(json())).prop_map(
            |(event, index, replacement)| {
                let mut data = event.encode().unwrap();
                if let Value::Object(map) = &mut data {
                    if !map.is_empty() {
                        let key = map.keys().nth(index.index(map.len())).unwrap().clone();
                        match replacement {
                            Some(value) => map.insert(key, value),
                            None => map.remove(&key),
                        };
                    }
                }
                data
            }
        ),
    ]
}

fn at(seconds: i64, nanos: u32) -> DateTime<Utc> {
    DateTime::from_timestamp(1_764_000_000 + seconds, nanos).unwrap()
}

fn usd() -> Currency {
    Currency::parse("USD").unwrap()
}

fn tenant() -> TenantId {
    TenantId::parse("acme").unwrap()
}

/// A step of a payment's life; amounts are per mille of the payment's amount, so that most of
/// them are accepted (rejected commands simply emit nothing).
#[derive(Debug, Clone)]
enum Step {
    /// What earlier versions wrote after the intent; still in their logs.
    LegacyChargeRequested,
    Capture(Option<u16>),
    Refund(u16),
    Expire,
    Flag(String),
    Action(String),
    Authorized(u16),
    Captured(u16),
    Failed(String),
    Refunded(u16),
    DisputeOpened(u16),
    DisputeClosed(u16, bool),
}

fn step() -> impl Strategy<Value = Step> {
    let part = 1u16..=1000;
    prop_oneof![
        1 => Just(Step::LegacyChargeRequested),
        1 => proptest::option::of(part.clone()).prop_map(Step::Capture),
        1 => part.clone().prop_map(Step::Refund),
        1 => Just(Step::Expire),
        1 => odd_text().prop_map(Step::Flag),
        1 => odd_text().prop_map(Step::Action),
        2 => part.clone().prop_map(Step::Authorized),
        3 => part.clone().prop_map(Step::Captured),
        1 => odd_text().prop_map(Step::Failed),
        3 => part.clone().prop_map(Step::Refunded),
        1 => part.clone().prop_map(Step::DisputeOpened),
        1 => (part, any::<bool>()).prop_map(|(p, won)| Step::DisputeClosed(p, won)),
    ]
}

#[derive(Debug, Clone)]
struct NewPaymentInput {
    amount: i64,
    manual: bool,
    description: Option<String>,
    metadata: Map<String, Value>,
    charge_id: String,
    nanos: u32,
}

fn new_payment() -> impl Strategy<Value = NewPaymentInput> {
    (
        prop_oneof![1i64..=1_000_000, Just(i64::MAX / 2), Just(i64::MAX)],
        any::<bool>(),
        proptest::option::of(odd_text()),
        proptest::collection::btree_map(odd_text(), json(), 0..6),
        odd_text(),
        0u32..1_000_000_000,
    )
        .prop_map(
            |(amount, manual, description, metadata, charge_id, nanos)| NewPaymentInput {
                amount,
                manual,
                description,
                metadata: metadata.into_iter().collect(),
                charge_id,
                nanos,
            },
        )
}

fn part_of(amount: i64, per_mille: u16) -> Amount {
    let part = i128::from(amount) * i128::from(per_mille) / 1000;
    Amount::new(i64::try_from(part).unwrap().max(1))
}

/// The events of a payment driven by the domain's own `decide` through `steps`.
fn payment_history(input: &NewPaymentInput, steps: &[Step]) -> Vec<PaymentEvent> {
    let id = PaymentId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0042));
    let create = PaymentCommand::Create(CreatePayment {
        id,
        tenant: tenant(),
        amount: Amount::new(input.amount),
        currency: usd(),
        customer: CustomerId::parse("42").unwrap(),
        provider: ProviderName::parse("sim").unwrap(),
        capture_mode: if input.manual {
            CaptureMode::Manual
        } else {
            CaptureMode::Automatic
        },
        description: input.description.clone(),
        metadata: input.metadata.clone(),
        payment_method: None,
        at: at(0, input.nanos),
    });
    let mut payment = Payment::default();
    let mut all = Vec::new();
    // A description or metadata over the limits is refused: then there is no history.
    let Ok(events) = decide_payment(&payment, create) else {
        return all;
    };
    payment = events.iter().fold(payment, evolve_payment);
    all.extend(events);
    let fees = FeeSchedule::new(300, Amount::new(30)).unwrap();
    let charge = || input.charge_id.clone();
    for (t, step) in steps.iter().enumerate() {
        let at = at(t as i64 + 1, input.nanos);
        let of = |p: u16| part_of(input.amount, p);
        let provider = |fact| PaymentCommand::Provider { fact, fees, at };
        let command = match step {
            Step::LegacyChargeRequested => {
                let legacy =
                    PaymentEvent::ChargeRequested(asiento_domain::payment::ChargeRequested {
                        psp_key: psp_charge_key(id),
                        at,
                    });
                payment = evolve_payment(payment, &legacy);
                all.push(legacy);
                continue;
            }
            Step::Capture(p) => PaymentCommand::RequestCapture {
                amount: p.map(of),
                at,
            },
            Step::Refund(p) => PaymentCommand::RequestRefund { amount: of(*p), at },
            Step::Expire => PaymentCommand::Expire { at },
            Step::Flag(note) => PaymentCommand::FlagForReview {
                note: note.clone(),
                at,
            },
            Step::Action(url) => provider(ProviderFact::ActionRequired {
                charge_id: charge(),
                redirect_url: url.clone(),
            }),
            Step::Authorized(p) => provider(ProviderFact::Authorized {
                charge_id: charge(),
                amount: of(*p),
            }),
            Step::Captured(p) => provider(ProviderFact::Captured {
                charge_id: charge(),
                amount: of(*p),
            }),
            Step::Failed(reason) => provider(ProviderFact::Failed {
                charge_id: Some(charge()),
                reason: reason.clone(),
            }),
            Step::Refunded(p) => provider(ProviderFact::Refunded {
                charge_id: charge(),
                amount_refunded: of(*p),
                current: false,
            }),
            Step::DisputeOpened(p) => provider(ProviderFact::DisputeOpened {
                charge_id: charge(),
                dispute_id: "dp_1".to_owned(),
                amount: of(*p),
            }),
            Step::DisputeClosed(p, won) => provider(ProviderFact::DisputeClosed {
                charge_id: charge(),
                dispute_id: "dp_1".to_owned(),
                amount: of(*p),
                outcome: if *won {
                    DisputeOutcome::Won
                } else {
                    DisputeOutcome::Lost
                },
                reinstated: !*won,
            }),
        };
        if let Ok(events) = decide_payment(&payment, command) {
            payment = events.iter().fold(payment, evolve_payment);
            all.extend(events);
        }
    }
    all
}

/// A transfer between a customer and a merchant account, with its guard events, decided by the
/// domain; the customer's guard starts with `funded` so that some debits pass and some do not.
fn transfer_events(
    amount: i64,
    funded: i64,
    description: Option<String>,
    nanos: u32,
) -> (Vec<TransferEvent>, Vec<GuardEvent>) {
    let request = RequestTransfer {
        id: TransferId::from_uuid(Uuid::from_u128(7)),
        tenant: tenant(),
        from: AccountName::parse("customer:42:available").unwrap(),
        to: AccountName::parse("merchant:acme:available").unwrap(),
        amount: Amount::new(amount),
        currency: usd(),
        description,
        pending: false,
        expires_at: None,
        at: at(0, nanos),
    };
    let transfer = transfer::Transfer::default();
    let Ok(events) = transfer::decide(&transfer, request.clone()) else {
        return (Vec::new(), Vec::new());
    };
    let mut guards = BTreeMap::new();
    for event in &events {
        if let TransferEvent::EntryPosted(posted) = event {
            for key in guarded_keys(&posted.entry) {
                guards.insert(
                    key,
                    DebitGuard {
                        version: 3,
                        balance: Amount::new(funded),
                        ..DebitGuard::default()
                    },
                );
            }
        }
    }
    let mut guard_events = Vec::new();
    // A provider fact is never refused: it records an overdraft instead, so both guard event
    // types are reached.
    for event in &events {
        if let TransferEvent::EntryPosted(posted) = event {
            if let Ok(appends) =
                decide_entry(&posted.entry, Origin::ProviderFact, &guards, posted.at)
            {
                guard_events.extend(appends.into_iter().flat_map(|append| append.events));
            }
        }
    }
    match decide_with_guards(&transfer, request, &guards) {
        Ok(decision) => {
            guard_events.extend(decision.guards.into_iter().flat_map(|append| append.events));
            (decision.events, guard_events)
        }
        Err(_) => (events, guard_events),
    }
}

/// One event the domain could have emitted, of any family.
fn real_event() -> impl Strategy<Value = Event> {
    let payment = (new_payment(), proptest::collection::vec(step(), 0..8)).prop_filter_map(
        "a history",
        |(input, steps)| {
            let events = payment_history(&input, &steps);
            let last = events.last().cloned()?;
            Some(Event::Payment(last))
        },
    );
    let transfer = (
        1i64..=1_000_000,
        0i64..=1_000_000,
        proptest::option::of(odd_text()),
        any::<bool>(),
    )
        .prop_filter_map("a transfer", |(amount, funded, description, guard)| {
            let (transfers, guards) = transfer_events(amount, funded, description, 0);
            if guard {
                guards.last().cloned().map(Event::Guard)
            } else {
                transfers.last().cloned().map(Event::Transfer)
            }
        });
    prop_oneof![payment, transfer]
}

// ---------------------------------------------------------------------------------------------
// Checks

/// Decodes stored text the way a reader of the log does.
fn through_text(event_type: &str, schema: i32, data: &Value) -> Value {
    let text = serde_json::to_string(data).unwrap();
    let back: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        serde_json::to_string(&back).unwrap(),
        text,
        "{event_type} (schema {schema}) changes on its way through text"
    );
    back
}

/// Every error names the type it was decoding, or the stream that names no family.
fn check_error(error: &DecodeError, event_type: &str, stream_id: Option<&str>) {
    match error {
        DecodeError::UnknownType { event_type: named }
        | DecodeError::UnknownSchema {
            event_type: named, ..
        }
        | DecodeError::Invalid {
            event_type: named, ..
        } => assert_eq!(named, event_type),
        DecodeError::UnknownStream(named) => assert_eq!(Some(named.as_str()), stream_id),
    }
    assert!(!error.to_string().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Any row, decoded by every family and by its stream: a value or an error, never a panic.
    /// A decoded event re-encodes to a payload that decodes to the same event.
    #[test]
    fn decoding_any_row_never_panics(
        event_type in event_type(),
        schema in schema(),
        data in payload(),
        stream_id in stream_id(),
    ) {
        let raw = data.to_string();
        macro_rules! family {
            ($family:ty) => {
                let decoded = <$family>::decode(&event_type, schema, &data);
                // From the stored text, the same event or an error as well.
                match (<$family>::decode_raw(&event_type, schema, &raw), &decoded) {
                    (Ok(from_text), Ok(from_value)) => prop_assert_eq!(&from_text, from_value),
                    (Err(error), Err(_)) => check_error(&error, &event_type, None),
                    (from_text, from_value) => prop_assert!(
                        false,
                        "text and tree disagree: {:?} against {:?}",
                        from_text,
                        from_value
                    ),
                }
                match decoded {
                    Ok(event) => {
                        prop_assert_eq!(event.event_type(), event_type.as_str());
                        let again = <$family>::decode(
                            event.event_type(),
                            event.schema_version(),
                            &event.encode().unwrap(),
                        );
                        prop_assert_eq!(again, Ok(event));
                    }
                    Err(error) => check_error(&error, &event_type, None),
                }
            };
        }
        family!(PaymentEvent);
        family!(TransferEvent);
        family!(GuardEvent);
        family!(ExceptionEvent);
        family!(PayoutEvent);
        let decoded = Event::decode(&stream_id, &event_type, schema, &data);
        prop_assert_eq!(
            Event::decode_raw(&stream_id, &event_type, schema, &raw).ok(),
            decoded.clone().ok()
        );
        match decoded {
            Ok(event) => {
                prop_assert_eq!(event.event_type(), event_type.as_str());
                let again = Event::decode(
                    &stream_id,
                    event.event_type(),
                    event.schema_version(),
                    &event.encode().unwrap(),
                );
                prop_assert_eq!(again, Ok(event));
            }
            Err(error) => check_error(&error, &event_type, Some(&stream_id)),
        }
    }

    /// `upcast` leaves current schemas alone, and lifts what it lifts to a schema that decodes
    /// without lifting again (running it twice is harmless, as the store may).
    #[test]
    fn upcast_never_panics_and_is_idempotent(
        event_type in event_type(),
        schema in schema(),
        data in payload(),
    ) {
        match upcast(&event_type, schema, data.clone()) {
            Ok((lifted, lifted_data)) => {
                if (event_type.as_str(), schema) != ("PaymentIntended", 1) {
                    prop_assert_eq!(lifted, schema);
                    prop_assert_eq!(&lifted_data, &data);
                }
                let again = upcast(&event_type, lifted, lifted_data.clone());
                prop_assert_eq!(again, Ok((lifted, lifted_data)));
            }
            Err(error) => check_error(&error, &event_type, None),
        }
    }

    /// Every event of a payment's life, with client-chosen metadata and descriptions and
    /// provider-chosen strings, comes back from its stored text as itself, through its family
    /// and through its stream.
    #[test]
    fn payment_events_round_trip_through_text(
        input in new_payment(),
        steps in proptest::collection::vec(step(), 0..16),
    ) {
        let stream = payment_stream(PaymentId::from_uuid(Uuid::from_u128(
            0x0190_0000_0000_7000_8000_0000_0000_0042,
        )));
        for event in payment_history(&input, &steps) {
            let (name, schema) = (event.event_type(), event.schema_version());
            let data = through_text(name, schema, &event.encode().unwrap());
            prop_assert_eq!(PaymentEvent::decode(name, schema, &data), Ok(event.clone()));
            prop_assert_eq!(
                Event::decode_raw(&stream, name, schema, &data.to_string()),
                Ok(Event::Payment(event.clone()))
            );
            prop_assert_eq!(
                Event::decode(&stream, name, schema, &data),
                Ok(Event::Payment(event))
            );
        }
    }

    /// Transfers and the guard events their entries produce round-trip the same way.
    #[test]
    fn transfer_and_guard_events_round_trip_through_text(
        amount in prop_oneof![1i64..=1_000_000, Just(i64::MAX)],
        funded in prop_oneof![0i64..=1_000_000, Just(i64::MAX)],
        description in proptest::option::of(odd_text()),
        nanos in 0u32..1_000_000_000,
    ) {
        let (transfers, guards) = transfer_events(amount, funded, description, nanos);
        let transfer_stream = transfer_stream(TransferId::from_uuid(Uuid::from_u128(7)));
        for event in transfers {
            let (name, schema) = (event.event_type(), event.schema_version());
            let data = through_text(name, schema, &event.encode().unwrap());
            prop_assert_eq!(TransferEvent::decode(name, schema, &data), Ok(event.clone()));
            prop_assert_eq!(
                Event::decode(&transfer_stream, name, schema, &data),
                Ok(Event::Transfer(event))
            );
        }
        let guard_stream = guard_stream(
            &tenant(),
            &AccountName::parse("customer:42:available").unwrap(),
            usd(),
        );
        for event in guards {
            let (name, schema) = (event.event_type(), event.schema_version());
            let data = through_text(name, schema, &event.encode().unwrap());
            prop_assert_eq!(GuardEvent::decode(name, schema, &data), Ok(event.clone()));
            prop_assert_eq!(
                Event::decode(&guard_stream, name, schema, &data),
                Ok(Event::Guard(event))
            );
        }
    }
}
