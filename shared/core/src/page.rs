//! Opaque page tokens and page sizes for `List*` RPCs.
//!
//! A token is the base64url (no padding) encoding of a JSON cursor the
//! service defines, e.g. the sort key of the last row returned. Tokens are
//! opaque to clients but not signed: a client can forge one, which only lets
//! it choose where its own, already authorised, query starts. What a service
//! must prevent is a token reused with *different filters* (a cursor from a
//! `status=ACTIVE` listing applied to an unfiltered one): it embeds
//! [`fingerprint`] of the filters in its cursor and rejects a mismatch with
//! [`PageTokenError::FilterMismatch`].

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Longest token [`decode`] accepts, in bytes; real cursors are far shorter.
pub const MAX_TOKEN_LEN: usize = 2048;

/// Why a page token was refused. Callers report it as a violation on their
/// `page_token` field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PageTokenError {
    /// The token is not one this service issued (bad base64, bad JSON, wrong
    /// shape or too long).
    #[error("invalid page token: {reason}")]
    Malformed {
        /// What failed while decoding.
        reason: String,
    },
    /// The token was issued for a request with different filters or order.
    #[error("page token was issued for a request with different filters")]
    FilterMismatch,
}

/// The opaque token for `cursor`.
///
/// # Panics
///
/// If `T`'s `Serialize` implementation fails, which derived implementations
/// on plain structs never do (JSON refuses only maps with non-string keys and
/// custom errors). A cursor type that fails is a programming error.
pub fn encode<T: Serialize>(cursor: &T) -> String {
    let json = serde_json::to_vec(cursor).expect("page cursors serialize to JSON");
    URL_SAFE_NO_PAD.encode(json)
}

/// The cursor inside `token`.
///
/// # Errors
///
/// [`PageTokenError::Malformed`] when the token is too long, not base64url,
/// not JSON, or not the shape of `T`.
pub fn decode<T: DeserializeOwned>(token: &str) -> Result<T, PageTokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(malformed(format!("longer than {MAX_TOKEN_LEN} characters")));
    }
    let json = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| malformed("not base64url".to_owned()))?;
    serde_json::from_slice(&json).map_err(|_| malformed("unrecognised content".to_owned()))
}

/// Checks that a cursor's embedded fingerprint matches the current request's.
///
/// # Errors
///
/// [`PageTokenError::FilterMismatch`] when they differ.
pub fn ensure_fingerprint(in_token: &str, current: &str) -> Result<(), PageTokenError> {
    if in_token == current {
        Ok(())
    } else {
        Err(PageTokenError::FilterMismatch)
    }
}

/// The cursor of a listing: where the next page starts, bound to the
/// request's filters.
#[derive(Serialize, Deserialize)]
struct Bound<A> {
    after: A,
    fp: String,
}

/// The token of a page that continues after `after`, bound to the filters
/// fingerprinted as `fp` (see [`fingerprint`]).
pub fn encode_bound<A: Serialize>(after: A, fp: &str) -> String {
    encode(&Bound {
        after,
        fp: fp.to_owned(),
    })
}

/// Where the page of `token` (made by [`encode_bound`]) starts: `None` for
/// the first page (an empty token). A malformed token, or one issued for
/// filters other than `fp`, adds a violation on `field` to `v` — `mismatch`
/// says what the filters were — and gives `None`.
pub fn decode_bound<A: DeserializeOwned>(
    v: &mut crate::Violations,
    field: &str,
    token: &str,
    fp: &str,
    mismatch: &str,
) -> Option<A> {
    if token.is_empty() {
        return None;
    }
    match decode::<Bound<A>>(token) {
        Ok(c) if c.fp == fp => Some(c.after),
        Ok(_) => {
            v.add(field, mismatch);
            None
        }
        Err(e) => {
            v.add(field, e.to_string());
            None
        }
    }
}

/// A short (16 hex digits) fingerprint of `parts`, e.g. a request's filters.
///
/// Each part is hashed with its length in front, so `["ab", "c"]` and
/// `["a", "bc"]` differ; the order of parts matters.
pub fn fingerprint(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The page size to use for a request that asked for `requested`.
///
/// `0` means `default`; more than `max` is lowered to `max` (as is a
/// `default` above `max`).
///
/// # Errors
///
/// A description for a `page_size` violation when `requested` is negative.
pub fn page_size(requested: i32, default: u32, max: u32) -> Result<u32, String> {
    match u32::try_from(requested) {
        Err(_) => Err(format!("must not be negative, got {requested}")),
        Ok(0) => Ok(default.min(max)),
        Ok(n) => Ok(n.min(max)),
    }
}

fn malformed(reason: String) -> PageTokenError {
    PageTokenError::Malformed { reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_cursors_round_trip_and_refuse_other_filters() {
        let fp = fingerprint(&["dc_1"]);
        let token = encode_bound("row-9", &fp);
        let mut v = crate::Violations::new();
        assert_eq!(
            decode_bound::<String>(&mut v, "page_token", "", &fp, "x"),
            None
        );
        assert_eq!(
            decode_bound::<String>(&mut v, "page_token", &token, &fp, "x").as_deref(),
            Some("row-9")
        );
        assert!(v.is_empty());
        let other = fingerprint(&["dc_2"]);
        assert_eq!(
            decode_bound::<String>(&mut v, "page_token", &token, &other, "other dc"),
            None
        );
        assert_eq!(
            decode_bound::<String>(&mut v, "page_token", "%%%", &fp, "x"),
            None
        );
        let r = v.into_result().unwrap_err().to_string();
        assert!(
            r.contains("other dc") && r.contains("invalid page token"),
            "{r}"
        );
    }
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Cursor {
        after_id: String,
        offset: u64,
        filters: String,
    }

    fn cursor() -> Cursor {
        Cursor {
            after_id: "dc_01h455vb4pex5vsknk084sn02q".into(),
            offset: 50,
            filters: fingerprint(&["ACTIVE", "docker", ""]),
        }
    }

    #[test]
    fn round_trip() {
        let token = encode(&cursor());
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(decode::<Cursor>(&token), Ok(cursor()));
    }

    #[test]
    fn garbage_token() {
        for token in ["!!!", "not a token", "e30=", "AAAA", &"a".repeat(5000)] {
            let err = decode::<Cursor>(token).unwrap_err();
            assert!(matches!(err, PageTokenError::Malformed { .. }), "{token}");
            assert!(err.to_string().starts_with("invalid page token: "));
        }
    }

    #[test]
    fn tampered_token() {
        let token = encode(&cursor());
        // Change one character in the middle: the JSON no longer parses or
        // no longer has the cursor's shape.
        let mut bytes = token.clone().into_bytes();
        let mid = bytes.len() / 2;
        bytes[mid] = if bytes[mid] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(bytes).unwrap();
        assert_ne!(decode::<Cursor>(&tampered).ok(), Some(cursor()));

        // A well-formed cursor for other filters is caught by the fingerprint.
        let mut other = cursor();
        other.filters = fingerprint(&["OFFLINE", "docker", ""]);
        let decoded: Cursor = decode(&encode(&other)).unwrap();
        assert_eq!(
            ensure_fingerprint(&decoded.filters, &cursor().filters),
            Err(PageTokenError::FilterMismatch)
        );
        assert_eq!(
            ensure_fingerprint(&cursor().filters, &cursor().filters),
            Ok(())
        );
    }

    #[test]
    fn fingerprints() {
        let f = fingerprint(&["ab", "c"]);
        assert_eq!(f.len(), 16);
        assert!(f.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(f, fingerprint(&["ab", "c"]));
        assert_ne!(f, fingerprint(&["a", "bc"]));
        assert_ne!(f, fingerprint(&["c", "ab"]));
        assert_ne!(fingerprint(&[]), fingerprint(&[""]));
    }

    #[test]
    fn page_sizes() {
        assert_eq!(page_size(0, 50, 500), Ok(50));
        assert_eq!(page_size(10, 50, 500), Ok(10));
        assert_eq!(page_size(1000, 50, 500), Ok(500));
        assert_eq!(page_size(0, 1000, 500), Ok(500));
        assert!(page_size(-1, 50, 500).unwrap_err().contains("-1"));
    }
}
