//! Stripe's request encoding: `application/x-www-form-urlencoded` with Rack-style nesting.
//!
//! The adapter builds bodies with [`Form`] (nested maps as `metadata[order]=42`, lists as
//! indexed keys `expand[0]=…`, as stripe-python's `_api_encode` sends them), and the
//! simulator's Stripe dialect reads them with [`parse`] into a [`FormValue`] tree, which
//! accepts both `a[]=` and `a[0]=` as Stripe does. The encoded text is kept byte for byte:
//! a re-sent request under the same idempotency key must be the same request.

use std::collections::BTreeMap;

/// More pairs than this in one body is refused: Stripe's largest requests carry a few dozen.
pub const PAIRS_MAX: usize = 1_000;
/// Deeper nesting than this is refused (`a[b][c][d]` is depth 4).
pub const DEPTH_MAX: usize = 5;
/// An indexed list longer than this is refused.
pub const LIST_LEN_MAX: usize = 100;

/// A request body as the adapter sends it: pairs in the order they were added.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Form {
    pairs: Vec<(String, String)>,
}

impl Form {
    pub fn new() -> Form {
        Form::default()
    }

    /// `key=value`; `key` may already be bracketed (`payment_method_types[0]`).
    pub fn field(mut self, key: &str, value: impl Into<String>) -> Form {
        self.pairs.push((key.to_owned(), value.into()));
        self
    }

    /// `key=value` when there is a value; nothing otherwise (the SDK skips `None`).
    pub fn optional(self, key: &str, value: Option<impl Into<String>>) -> Form {
        match value {
            Some(value) => self.field(key, value),
            None => self,
        }
    }

    /// `key[k]=v` for every entry, in key order.
    pub fn map(mut self, key: &str, entries: &BTreeMap<String, String>) -> Form {
        for (name, value) in entries {
            self.pairs.push((format!("{key}[{name}]"), value.clone()));
        }
        self
    }

    /// `key[0]=v0&key[1]=v1…`: "always use indexed format for arrays".
    pub fn list<'a>(mut self, key: &str, values: impl IntoIterator<Item = &'a str>) -> Form {
        for (index, value) in values.into_iter().enumerate() {
            self.pairs
                .push((format!("{key}[{index}]"), value.to_owned()));
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The encoded text. Brackets stay unescaped, as the SDK leaves them.
    pub fn encode(&self) -> String {
        let mut serializer = form_urlencoded::Serializer::new(String::new());
        for (key, value) in &self.pairs {
            serializer.append_pair(key, value);
        }
        serializer.finish().replace("%5B", "[").replace("%5D", "]")
    }
}

/// One decoded parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormValue {
    Text(String),
    Map(BTreeMap<String, FormValue>),
    List(Vec<FormValue>),
}

impl FormValue {
    /// What the value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            FormValue::Text(_) => "a string",
            FormValue::Map(_) => "a hash",
            FormValue::List(_) => "an array",
        }
    }
}

/// Why a body could not be decoded; the dialect answers each with a 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    #[error("the body has more than {PAIRS_MAX} parameters")]
    TooManyPairs,
    #[error("invalid parameter name {0:?}")]
    KeyMalformed(String),
    #[error("parameter {0:?} is nested deeper than {DEPTH_MAX} levels")]
    TooDeep(String),
    #[error("parameter {0:?} is given more than once or with two shapes")]
    Conflicting(String),
    #[error("parameter {0:?} has an index out of order or above {LIST_LEN_MAX}")]
    IndexInvalid(String),
}

/// One step of a bracketed key: `a[b][0][]` is `Name("a"), Name("b"), Index(0), Append`.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Name(String),
    Index(usize),
    Append,
}

fn steps(key: &str) -> Result<Vec<Step>, FormError> {
    let malformed = || FormError::KeyMalformed(key.to_owned());
    let (head, mut rest) = match key.find('[') {
        Some(at) => (&key[..at], &key[at..]),
        None => (key, ""),
    };
    if head.is_empty() || head.contains(']') {
        return Err(malformed());
    }
    let mut steps = vec![Step::Name(head.to_owned())];
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[').ok_or_else(malformed)?;
        let close = inner.find(']').ok_or_else(malformed)?;
        let segment = &inner[..close];
        if segment.contains('[') {
            return Err(malformed());
        }
        steps.push(if segment.is_empty() {
            Step::Append
        } else if segment.bytes().all(|b| b.is_ascii_digit()) {
            let index = segment
                .parse::<usize>()
                .ok()
                .filter(|index| *index < LIST_LEN_MAX)
                .ok_or_else(|| FormError::IndexInvalid(key.to_owned()))?;
            Step::Index(index)
        } else {
            Step::Name(segment.to_owned())
        });
        rest = &inner[close + 1..];
    }
    if steps.len() > DEPTH_MAX {
        return Err(FormError::TooDeep(key.to_owned()));
    }
    Ok(steps)
}

/// Puts `value` at `steps` under `slot`, creating maps and lists on the way.
fn insert(
    slot: &mut Option<FormValue>,
    steps: &[Step],
    value: String,
    key: &str,
) -> Result<(), FormError> {
    let conflicting = || FormError::Conflicting(key.to_owned());
    let Some((step, rest)) = steps.split_first() else {
        return match slot {
            None => {
                *slot = Some(FormValue::Text(value));
                Ok(())
            }
            Some(_) => Err(conflicting()),
        };
    };
    match step {
        Step::Name(name) => {
            let map = match slot.get_or_insert_with(|| FormValue::Map(BTreeMap::new())) {
                FormValue::Map(map) => map,
                _ => return Err(conflicting()),
            };
            let mut child = map.remove(name);
            insert(&mut child, rest, value, key)?;
            map.insert(name.clone(), child.ok_or_else(conflicting)?);
            Ok(())
        }
        Step::Index(_) | Step::Append => {
            let list = match slot.get_or_insert_with(|| FormValue::List(Vec::new())) {
                FormValue::List(list) => list,
                _ => return Err(conflicting()),
            };
            let index = match step {
                Step::Index(index) => *index,
                _ => list.len(),
            };
            // An index names the element being built or the next one: `a[0][x]&a[0][y]&a[1]…`.
            if index > list.len() || index >= LIST_LEN_MAX {
                return Err(FormError::IndexInvalid(key.to_owned()));
            }
            if index == list.len() {
                let mut child = None;
                insert(&mut child, rest, value, key)?;
                list.push(child.ok_or_else(conflicting)?);
            } else {
                let mut child = Some(list.remove(index));
                insert(&mut child, rest, value, key)?;
                list.insert(index, child.ok_or_else(conflicting)?);
            }
            Ok(())
        }
    }
}

/// Decodes a form body into its top-level parameters.
pub fn parse(body: &[u8]) -> Result<BTreeMap<String, FormValue>, FormError> {
    let mut root = BTreeMap::new();
    for (count, (key, value)) in form_urlencoded::parse(body).enumerate() {
        if count >= PAIRS_MAX {
            return Err(FormError::TooManyPairs);
        }
        let steps = steps(&key)?;
        let Some((Step::Name(name), rest)) = steps.split_first() else {
            unreachable!("`steps` always starts with the key's name");
        };
        let mut child = root.remove(name);
        insert(&mut child, rest, value.into_owned(), &key)?;
        if let Some(child) = child {
            root.insert(name.clone(), child);
        }
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> FormValue {
        FormValue::Text(value.to_owned())
    }

    #[test]
    fn forms_encode_as_the_sdk_sends_them() {
        let metadata = BTreeMap::from([
            ("asiento_payment_id".to_owned(), "pay_1".to_owned()),
            ("note".to_owned(), "a&b = c".to_owned()),
        ]);
        let form = Form::new()
            .field("amount", "1099")
            .field("currency", "usd")
            .map("metadata", &metadata)
            .list("expand", ["latest_charge.balance_transaction"])
            .optional("description", None::<String>);
        assert_eq!(
            form.encode(),
            "amount=1099&currency=usd&metadata[asiento_payment_id]=pay_1\
             &metadata[note]=a%26b+%3D+c&expand[0]=latest_charge.balance_transaction"
        );
    }

    #[test]
    fn encoded_forms_parse_back_to_their_tree() {
        let metadata = BTreeMap::from([("k".to_owned(), "v w".to_owned())]);
        let body = Form::new()
            .field("amount", "5")
            .map("metadata", &metadata)
            .list("payment_method_types", ["card", "link"])
            .encode();
        let parsed = parse(body.as_bytes()).expect("valid");
        assert_eq!(parsed["amount"], text("5"));
        assert_eq!(
            parsed["metadata"],
            FormValue::Map(BTreeMap::from([("k".to_owned(), text("v w"))]))
        );
        assert_eq!(
            parsed["payment_method_types"],
            FormValue::List(vec![text("card"), text("link")])
        );
    }

    #[test]
    fn appended_indexed_and_nested_lists_parse_as_stripe_reads_them() {
        let parsed =
            parse(b"expand[]=a&expand[]=b&items[0][price]=p&items[0][qty]=2&items[1][price]=q")
                .expect("valid");
        assert_eq!(
            parsed["expand"],
            FormValue::List(vec![text("a"), text("b")])
        );
        let FormValue::List(items) = &parsed["items"] else {
            panic!("items is a list: {parsed:?}");
        };
        assert_eq!(items.len(), 2);
        assert_eq!(
            items[0],
            FormValue::Map(BTreeMap::from([
                ("price".to_owned(), text("p")),
                ("qty".to_owned(), text("2")),
            ]))
        );
        assert_eq!(parse(b"a%5Bb%5D=1").expect("escaped brackets")["a"], {
            FormValue::Map(BTreeMap::from([("b".to_owned(), text("1"))]))
        });
    }

    #[test]
    fn malformed_repeated_and_unbounded_keys_are_refused() {
        for (body, expected) in [
            (&b"[a]=1"[..], FormError::KeyMalformed("[a]".into())),
            (b"a[b=1", FormError::KeyMalformed("a[b".into())),
            (b"a]=1", FormError::KeyMalformed("a]".into())),
            (b"a[b]x=1", FormError::KeyMalformed("a[b]x".into())),
            (b"a=1&a=2", FormError::Conflicting("a".into())),
            (b"a=1&a[b]=2", FormError::Conflicting("a[b]".into())),
            (b"a[b]=1&a[]=2", FormError::Conflicting("a[]".into())),
            (b"a[1]=x", FormError::IndexInvalid("a[1]".into())),
            (b"a[100]=x", FormError::IndexInvalid("a[100]".into())),
            (
                b"a[99999999999999999999999]=x",
                FormError::IndexInvalid("a[99999999999999999999999]".into()),
            ),
            (
                b"a[b][c][d][e][f]=1",
                FormError::TooDeep("a[b][c][d][e][f]".into()),
            ),
        ] {
            assert_eq!(
                parse(body),
                Err(expected),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let many = vec!["a[]=1"; PAIRS_MAX + 1].join("&");
        assert!(matches!(
            parse(many.as_bytes()),
            Err(FormError::TooManyPairs | FormError::IndexInvalid(_))
        ));
        let many_names: String = (0..=PAIRS_MAX).map(|i| format!("k{i}=1&")).collect();
        assert_eq!(parse(many_names.as_bytes()), Err(FormError::TooManyPairs));
    }
}
