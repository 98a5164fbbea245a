//! The regular expressions of the document: each one accepts exactly what a parser at the edge
//! accepts (or, where noted, a documented subset of it), written in the dialect that both
//! ECMA-262 (what OpenAPI names) and Python's `re` (what schemathesis generates from) read alike:
//! anchored, no lookaround, no shorthand classes (`\s`, `\w` and `\d` differ between the two),
//! only explicit character classes, `(?:…)` groups and bounded repetition.

use asiento_domain::account::{
    PENDING_CREDITS_ROOT, PENDING_DEBITS_ROOT, SEGMENTS_MAX, SEGMENT_CHARS_MAX, SYSTEM_ROOTS,
};
use std::collections::BTreeSet;

/// The characters of an account segment, a tenant, a customer or a provider name.
const SEGMENT_ALPHABET: &str = "abcdefghijklmnopqrstuvwxyz0123456789_-";

/// One segment: `[a-z0-9_-]{1,64}` (`asiento_domain::account::is_valid_segment`).
#[must_use]
pub fn segment() -> String {
    format!("{}{{1,{SEGMENT_CHARS_MAX}}}", class(&alphabet()))
}

/// A customer id, a provider name: one segment, anchored.
#[must_use]
pub fn name() -> String {
    format!("^{}$", segment())
}

fn alphabet() -> BTreeSet<char> {
    SEGMENT_ALPHABET.chars().collect()
}

/// `segment(:segment){0,more}` whose first segment is `first`.
fn path_from(first: &str, more: usize) -> String {
    format!("{first}(?::{}){{0,{more}}}", segment())
}

/// An account a client may name in a transfer or a declaration (`AccountName::parse`, and not
/// one of the system's own: `psp:`, `revenue:`, `expense:`, `bank:`, `pending_debits:`,
/// `pending_credits:`).
#[must_use]
pub fn client_account() -> String {
    let system: Vec<&str> = SYSTEM_ROOTS
        .iter()
        .copied()
        .chain([PENDING_DEBITS_ROOT, PENDING_CREDITS_ROOT])
        .collect();
    format!(
        "^{}$",
        path_from(&Except::new(&system).regex(), SEGMENTS_MAX - 1)
    )
}

/// Any account name `AccountName::parse` accepts (`/v1/accounts/{account}/…`): a name of at most
/// eight segments whose first is not a pending root, or a pending root alone, or a pending root
/// before such a name (the pending account of that account).
#[must_use]
pub fn any_account() -> String {
    format!("^{}$", any_account_body())
}

fn any_account_body() -> String {
    let pending = [PENDING_DEBITS_ROOT, PENDING_CREDITS_ROOT];
    let plain = path_from(&Except::new(&pending).regex(), SEGMENTS_MAX - 1);
    let roots = pending.map(literal).join("|");
    format!("(?:{plain}|(?:{roots})(?::{plain})?)")
}

/// `GET /v1/accounts?prefix=`: the beginning of an account name (`is_name_prefix`): empty, or
/// whole segments joined by `:`, the last one possibly cut short or left empty after its `:`.
#[must_use]
pub fn account_prefix() -> String {
    let segment = segment();
    format!(
        "^(?:{segment}(?::{segment}){{0,{more}}}|(?:{segment}:){{1,{more}}})?$",
        more = SEGMENTS_MAX - 1
    )
}

/// `GET /v1/accounts?after=`: the `next_after` of a page, `{account}:{currency}`.
#[must_use]
pub fn accounts_after(currencies: &[&str]) -> String {
    format!("^{}:(?:{})$", any_account_body(), currencies.join("|"))
}

/// A prefixed id as the API writes it: the prefix and a uuid's 32 lowercase hex digits. The
/// parsers also take the bare uuid and its hyphenated form; the document names the one form.
#[must_use]
pub fn prefixed_id(prefix: &str) -> String {
    format!("^{}[0-9a-f]{{32}}$", literal(prefix))
}

/// An `Idempotency-Key`: 1 to 255 printable ASCII characters (`IdempotencyKey::parse`), neither
/// starting nor ending with a space, which HTTP would strip from a header value.
#[must_use]
pub fn idempotency_key(length_max: usize) -> String {
    format!("^[!-~](?:[ -~]{{0,{}}}[!-~])?$", length_max - 2)
}

/// Text without U+0000 (NUL), which no text of a request may hold (`body::refuse_nul`).
pub const NO_NUL: &str = r"^[^\u0000]*$";

/// The characters Rust's `str::trim` removes (Unicode `White_Space`), as a class body.
const WHITE_SPACE: &str = r"\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

/// Free text with at least one character that is not white space (`note.trim().is_empty()` is
/// refused), and no NUL.
#[must_use]
pub fn not_blank() -> String {
    format!(r"^[^\u0000]*[^\u0000{WHITE_SPACE}][^\u0000]*$")
}

/// `https://host[:port][/path]`: a URL `reqwest::Url` parses with a host name whose last label
/// starts with a letter (a numeric one would be read as an IPv4 address), without user info.
/// Where the name resolves is checked at registration, and is not in the document.
#[must_use]
pub fn webhook_url() -> String {
    let label = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?";
    let last = "[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?";
    let port =
        "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})";
    let path = "[0-9A-Za-z._~!$&'()*+,;=:@%/-]*";
    format!("^https://(?:{label}\\.)*{last}(?::{port})?(?:/{path})?$")
}

/// A feed cursor: the decimal `next_cursor` of a page (`FeedCursor::parse`, any non-negative
/// i64; the document stops at 18 digits).
pub const FEED_CURSOR: &str = "^[0-9]{1,18}$";

/// A list page cursor (payments, transfers): 48 hex digits (`asiento_projector::keyset::Keyset`).
pub const KEYSET_CURSOR: &str = "^[0-9a-f]{48}$";

fn literal(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == ':' {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}

/// A character class of `chars`, with runs of three or more written as ranges and `-` last.
fn class(chars: &BTreeSet<char>) -> String {
    let mut body = String::new();
    let plain: Vec<char> = chars.iter().copied().filter(|c| *c != '-').collect();
    let mut i = 0;
    while i < plain.len() {
        let start = plain[i];
        let mut end = i;
        while end + 1 < plain.len() && u32::from(plain[end + 1]) == u32::from(plain[end]) + 1 {
            end += 1;
        }
        if end >= i + 2 {
            body.push(start);
            body.push('-');
            body.push(plain[end]);
        } else {
            body.extend(&plain[i..=end]);
        }
        i = end + 1;
    }
    if chars.contains(&'-') {
        body.push('-');
    }
    format!("[{body}]")
}

/// One segment that is none of some words: a trie of the words, each node answering "end here"
/// (unless the node is one of the words), "leave the trie by a character no word continues
/// with, then anything", or "follow a word's next character".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Except {
    words: Vec<String>,
}

impl Except {
    #[must_use]
    pub fn new(words: &[&str]) -> Self {
        let mut words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        words.sort();
        words.dedup();
        Except { words }
    }

    /// Whether `segment` is a valid segment and none of the words, by walking the same trie the
    /// regex is written from.
    #[must_use]
    pub fn accepts(&self, segment: &str) -> bool {
        self.walk(segment, "")
    }

    fn walk(&self, rest: &str, prefix: &str) -> bool {
        let depth = prefix.chars().count();
        let Some(next) = rest.chars().next() else {
            // The string ends here: fine unless it is empty or one of the words.
            return depth > 0 && !self.words.iter().any(|w| w == prefix);
        };
        if depth >= SEGMENT_CHARS_MAX || !alphabet().contains(&next) {
            return false;
        }
        let continues = self.next_chars(prefix);
        let mut longer = prefix.to_owned();
        longer.push(next);
        if continues.contains(&next) {
            self.walk(&rest[next.len_utf8()..], &longer)
        } else {
            // Out of the trie: anything of the alphabet up to the length bound.
            let tail = &rest[next.len_utf8()..];
            tail.chars().all(|c| alphabet().contains(&c))
                && depth + 1 + tail.chars().count() <= SEGMENT_CHARS_MAX
        }
    }

    fn next_chars(&self, prefix: &str) -> BTreeSet<char> {
        self.words
            .iter()
            .filter_map(|w| w.strip_prefix(prefix)?.chars().next())
            .collect()
    }

    /// One flat alternation (deeply nested groups are slow to read and recurse deeply in regex
    /// tools): for each node of the trie, "its prefix, then a character no word continues with,
    /// then anything", and "its prefix, ending there" unless the prefix is one of the words.
    #[must_use]
    pub fn regex(&self) -> String {
        let mut prefixes: BTreeSet<String> = BTreeSet::from([String::new()]);
        for word in &self.words {
            for (end, _) in word.char_indices().skip(1) {
                prefixes.insert(word[..end].to_owned());
            }
            prefixes.insert(word.clone());
        }
        let mut branches = Vec::new();
        for prefix in &prefixes {
            let depth = prefix.chars().count();
            if depth >= SEGMENT_CHARS_MAX {
                continue;
            }
            let others: BTreeSet<char> = alphabet()
                .difference(&self.next_chars(prefix))
                .copied()
                .collect();
            if !others.is_empty() {
                let left = SEGMENT_CHARS_MAX - depth - 1;
                let tail = if left == 0 {
                    String::new()
                } else {
                    format!("{}{{0,{left}}}", class(&alphabet()))
                };
                branches.push(format!("{}{}{tail}", literal(prefix), class(&others)));
            }
            if depth > 0 && !self.words.contains(prefix) {
                branches.push(literal(prefix));
            }
        }
        format!("(?:{})", branches.join("|"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asiento_domain::account::{is_valid_segment, CUSTOMER_ROOT};

    /// Every string of up to three characters over a few letters, the words, their prefixes and
    /// their extensions, and some long ones: the trie agrees with the rule it stands for.
    #[test]
    fn a_segment_except_some_words_is_exactly_that() {
        let words = [
            "psp",
            "revenue",
            "expense",
            "bank",
            PENDING_DEBITS_ROOT,
            PENDING_CREDITS_ROOT,
        ];
        let except = Except::new(&words);
        let mut samples: Vec<String> = vec![String::new()];
        let letters = ['p', 's', 'b', 'a', 'e', '_', 'A', ':', ' '];
        for _ in 0..3 {
            let longer: Vec<String> = samples
                .iter()
                .flat_map(|s| letters.iter().map(move |c| format!("{s}{c}")))
                .collect();
            samples.extend(longer);
        }
        for word in words {
            for end in 0..=word.len() {
                samples.push(word[..end].to_owned());
                samples.push(format!("{}x", &word[..end]));
                samples.push(format!("{}-", &word[..end]));
            }
            samples.push(format!("{word}{word}"));
        }
        samples.push("a".repeat(SEGMENT_CHARS_MAX));
        samples.push("a".repeat(SEGMENT_CHARS_MAX + 1));
        samples.push(format!("p{}", "z".repeat(SEGMENT_CHARS_MAX - 1)));
        samples.push(format!("p{}", "z".repeat(SEGMENT_CHARS_MAX)));
        samples.push(format!("ps{}", "z".repeat(SEGMENT_CHARS_MAX - 2)));
        samples.push(format!("ps{}", "z".repeat(SEGMENT_CHARS_MAX - 1)));
        for sample in &samples {
            let want = is_valid_segment(sample) && !words.contains(&sample.as_str());
            assert_eq!(except.accepts(sample), want, "{sample:?}");
        }
        assert!(!except.regex().is_empty());
    }

    #[test]
    fn classes_are_compact() {
        assert_eq!(class(&alphabet()), "[0-9_a-z-]");
        let some: BTreeSet<char> = "abdxyz-".chars().collect();
        assert_eq!(class(&some), "[abdx-z-]");
    }

    #[test]
    fn the_customer_root_is_a_client_root() {
        let system: Vec<&str> = SYSTEM_ROOTS
            .iter()
            .copied()
            .chain([PENDING_DEBITS_ROOT, PENDING_CREDITS_ROOT])
            .collect();
        assert!(Except::new(&system).accepts(CUSTOMER_ROOT));
        assert!(!Except::new(&system).accepts("psp"));
    }
}
