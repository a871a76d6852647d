//! Field violations: the one way bad input is reported.
//!
//! Validation code records every problem it finds in a [`Violations`] and
//! carries on; the caller turns a non-empty collection into an error. On the
//! wire that error is `INVALID_ARGUMENT` with a `google.rpc.BadRequest`
//! detail listing the violations ([`Violations::to_status`]).
//!
//! Field paths use proto field names, `[i]` for list indexes, `[key]` for map
//! keys and a dot between levels, e.g.
//! `datacenter.bootstrap_services[0].services[1].ports[0].container` or
//! `datacenter.labels[team]`. The helpers [`child`], [`index`] and [`key`]
//! build such paths.
//!
//! Invariant: a status built here always fits comfortably in gRPC trailers
//! (clients such as grpc-core reject trailers past 8–16 KiB): the message
//! and the details are bounded, and violations that do not fit are summarised
//! in one closing entry instead of being dropped silently.

use std::borrow::Cow;
use std::fmt;

use tonic_types::{ErrorDetails, StatusExt};

/// Budget, in bytes of field paths and descriptions, for the violations put
/// into a status' `BadRequest` detail. Violations past it are summarised.
pub const STATUS_DETAILS_BUDGET: usize = 6 * 1024;

/// Longest status message, in characters (longer ones end in `…`).
pub const STATUS_MESSAGE_MAX: usize = 1024;

/// Longest field path or description copied into a status, in characters.
const STATUS_TEXT_MAX: usize = 512;

/// One bad field: where it is and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Path of the field, e.g. `datacenter.labels[team]`.
    pub field: String,
    /// What is wrong, phrased to follow the field name, e.g. `is required`.
    pub description: String,
}

impl fmt::Display for FieldViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.description)
        } else {
            write!(f, "{}: {}", self.field, self.description)
        }
    }
}

/// Every violation found while checking one request, in the order found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Violations {
    items: Vec<FieldViolation>,
}

impl Violations {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `field` is bad because of `description`.
    pub fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.items.push(FieldViolation {
            field: field.into(),
            description: description.into(),
        });
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Number of violations recorded.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The violations in the order they were recorded.
    pub fn iter(&self) -> std::slice::Iter<'_, FieldViolation> {
        self.items.iter()
    }

    /// The violations in the order they were recorded.
    pub fn into_vec(self) -> Vec<FieldViolation> {
        self.items
    }

    /// Appends every violation of `other`.
    pub fn extend(&mut self, other: Violations) {
        self.items.extend(other.items);
    }

    /// `Ok(())` when empty, else `Err(self)`.
    ///
    /// # Errors
    ///
    /// Returns the collection itself when it holds at least one violation.
    pub fn into_result(self) -> Result<(), Violations> {
        if self.is_empty() { Ok(()) } else { Err(self) }
    }

    /// The `INVALID_ARGUMENT` status for these violations: message
    /// `invalid request: <display>` and a `google.rpc.BadRequest` detail with
    /// one field violation per recorded violation.
    ///
    /// Both parts are bounded (see the module docs): the message is cut at
    /// [`STATUS_MESSAGE_MAX`] characters, and when the violations exceed
    /// [`STATUS_DETAILS_BUDGET`] the detail ends with one entry (empty field)
    /// saying how many more there were.
    pub fn to_status(&self) -> tonic::Status {
        let message = shorten(&format!("invalid request: {self}"), STATUS_MESSAGE_MAX).into_owned();

        let mut details = Vec::new();
        let mut used = 0;
        for (i, item) in self.items.iter().enumerate() {
            let field = shorten(&item.field, STATUS_TEXT_MAX);
            let description = shorten(&item.description, STATUS_TEXT_MAX);
            let cost = field.len() + description.len();
            if i > 0 && used + cost > STATUS_DETAILS_BUDGET {
                let rest = self.items.len() - i;
                details.push(tonic_types::FieldViolation::new(
                    "",
                    format!("{rest} more violation(s) not shown"),
                ));
                break;
            }
            used += cost;
            details.push(tonic_types::FieldViolation::new(field, description));
        }

        tonic::Status::with_error_details(
            tonic::Code::InvalidArgument,
            message,
            ErrorDetails::with_bad_request(details),
        )
    }
}

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violations {}

impl From<Violations> for tonic::Status {
    fn from(v: Violations) -> Self {
        v.to_status()
    }
}

impl IntoIterator for Violations {
    type Item = FieldViolation;
    type IntoIter = std::vec::IntoIter<FieldViolation>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a> IntoIterator for &'a Violations {
    type Item = &'a FieldViolation;
    type IntoIter = std::slice::Iter<'a, FieldViolation>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

/// `parent.name`, or `name` when `parent` is empty.
pub fn child(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// `parent[i]`: element `i` of a list field.
pub fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// `parent[key]`: entry `key` of a map field. Keys longer than any valid
/// key (a label key may have 253 + 1 + 63 characters) are shortened, ending
/// in `…`, so that a hostile key cannot blow up a path; every valid key
/// appears verbatim.
pub fn key(parent: &str, key: &str) -> String {
    format!("{parent}[{}]", shorten(key, 320))
}

/// `s` cut to at most `max` characters, the last one then being `…`.
pub(crate) fn shorten(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some(_) => {
            let keep = max.saturating_sub(1);
            let end = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
            Cow::Owned(format!("{}…", &s[..end]))
        }
    }
}

/// `s` quoted and escaped for a description, shortened to 64 characters.
pub(crate) fn quote(s: &str) -> String {
    format!("{:?}", shorten(s, 64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    fn sample() -> Violations {
        let mut v = Violations::new();
        v.add("datacenter.name", "is required");
        v.add(
            "datacenter.labels[team]",
            "value must be at most 63 characters",
        );
        v.add(
            "datacenter.bootstrap_services[0].services[1].ports[0].container",
            "must be 1-65535, got 0",
        );
        v
    }

    #[test]
    fn collects_in_order_and_displays() {
        let v = sample();
        assert_eq!(v.len(), 3);
        assert!(!v.is_empty());
        assert_eq!(
            v.to_string(),
            "datacenter.name: is required; datacenter.labels[team]: value must be at most 63 \
             characters; datacenter.bootstrap_services[0].services[1].ports[0].container: must \
             be 1-65535, got 0"
        );
        let fields: Vec<_> = v.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields[0], "datacenter.name");
        assert_eq!(v.clone().into_vec().len(), 3);
    }

    #[test]
    fn into_result_and_extend() {
        assert_eq!(Violations::new().into_result(), Ok(()));
        let mut a = Violations::new();
        a.add("a", "bad");
        let mut b = Violations::new();
        b.add("b", "worse");
        a.extend(b);
        let err = a.into_result().unwrap_err();
        assert_eq!(err.len(), 2);
        assert_eq!(err.iter().nth(1).unwrap().field, "b");
    }

    #[test]
    fn status_carries_every_violation() {
        let v = sample();
        let status = v.to_status();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), format!("invalid request: {v}"));
        let bad = status
            .get_details_bad_request()
            .expect("bad request detail");
        let got: Vec<_> = bad
            .field_violations
            .iter()
            .map(|f| (f.field.clone(), f.description.clone()))
            .collect();
        let want: Vec<_> = v
            .iter()
            .map(|f| (f.field.clone(), f.description.clone()))
            .collect();
        assert_eq!(got, want);

        let via_from: tonic::Status = v.clone().into();
        assert_eq!(via_from.message(), status.message());
    }

    #[test]
    fn status_is_bounded() {
        let mut v = Violations::new();
        for i in 0..1000 {
            v.add(format!("datacenter.labels[key-{i}]"), "x".repeat(2000));
        }
        let status = v.to_status();
        assert!(status.message().chars().count() <= STATUS_MESSAGE_MAX);
        assert!(status.details().len() < 10 * 1024);
        let bad = status.get_details_bad_request().unwrap();
        let last = bad.field_violations.last().unwrap();
        assert_eq!(last.field, "");
        assert!(last.description.ends_with("more violation(s) not shown"));
        let shown = bad.field_violations.len() - 1;
        assert!(last.description.starts_with(&format!("{} ", 1000 - shown)));
    }

    #[test]
    fn paths() {
        assert_eq!(child("", "name"), "name");
        assert_eq!(child("datacenter", "name"), "datacenter.name");
        assert_eq!(index("services", 2), "services[2]");
        assert_eq!(key("labels", "team"), "labels[team]");
        assert_eq!(shorten("abcdef", 4), "abc…");
        assert_eq!(shorten("abcd", 4), "abcd");
        assert_eq!(shorten("äöüß", 3), "äö…");
        assert_eq!(quote("a\"b"), r#""a\"b""#);
    }
}
