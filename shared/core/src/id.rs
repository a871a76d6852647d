//! TypeIDs: `prefix_` + 26 characters of lowercase Crockford base32.
//!
//! Follows the TypeID specification: the suffix encodes a 128-bit UUID
//! left-padded to 130 bits, so its first character is `0`–`7`. Ids made by
//! [`new_id`] wrap a fresh UUIDv7; within one process a later id sorts after
//! an earlier one both as a UUID and as a string, because the alphabet is in
//! ASCII order and the suffix has a fixed length.
//!
//! [`parse_id`] accepts only the canonical (lowercase) form and checks the
//! prefix, so an agent id can never be passed where a datacenter id is
//! expected. It does not insist on UUID version 7: ids are opaque to readers.

use thiserror::Error;
use uuid::Uuid;

use crate::violations::{Violations, shorten};

/// Prefix of datacenter ids.
pub const DATACENTER: &str = "dc";
/// Prefix of bootstrap workload ids.
pub const BOOTSTRAP_WORKLOAD: &str = "bws";
/// Prefix of agent ids.
pub const AGENT: &str = "agt";
/// Prefix of join token ids.
pub const JOIN_TOKEN: &str = "jtk";
/// Prefix of event ids.
pub const EVENT: &str = "evt";

/// Crockford base32 alphabet as TypeID uses it (lowercase, no i l o u).
const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Length of the encoded suffix.
const SUFFIX_LEN: usize = 26;

/// Why a string is not a valid id of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdError {
    /// The id does not start with the expected `prefix_`.
    #[error("expected an id starting with \"{expected}_\", got {found:?}")]
    WrongPrefix {
        /// The prefix that was expected, without the underscore.
        expected: String,
        /// The offending value (shortened when long).
        found: String,
    },
    /// The prefix is right but the suffix is not 26 valid base32 characters.
    #[error("malformed id: {reason}")]
    Malformed {
        /// What is wrong with the suffix.
        reason: String,
    },
}

/// A new TypeID `prefix_<suffix>` wrapping a fresh UUIDv7.
///
/// `prefix` should be one of this module's constants (lowercase ASCII
/// letters); anything else still yields an id, but one that other TypeID
/// implementations may reject.
pub fn new_id(prefix: &str) -> String {
    debug_assert!(
        !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_lowercase()),
        "TypeID prefixes are lowercase letters: {prefix:?}"
    );
    format!("{prefix}_{}", encode(Uuid::now_v7()))
}

/// The UUID inside `s`, which must be a canonical TypeID with `prefix`.
///
/// # Errors
///
/// [`IdError::WrongPrefix`] when `s` does not start with `prefix_`;
/// [`IdError::Malformed`] when the rest is not 26 lowercase Crockford base32
/// characters starting with `0`–`7`.
pub fn parse_id(prefix: &str, s: &str) -> Result<Uuid, IdError> {
    let suffix = s
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .ok_or_else(|| IdError::WrongPrefix {
            expected: prefix.to_owned(),
            found: shorten(s, 64).into_owned(),
        })?;
    decode(suffix).map_err(|reason| IdError::Malformed { reason })
}

/// Records a violation on `field` unless `value` is a valid id with `prefix`
/// (`is required` when it is empty).
pub fn check_id(v: &mut Violations, field: &str, prefix: &str, value: &str) {
    if value.is_empty() {
        v.add(field, "is required");
    } else if let Err(e) = parse_id(prefix, value) {
        v.add(field, e.to_string());
    }
}

fn encode(id: Uuid) -> String {
    let value = id.as_u128();
    (0..SUFFIX_LEN)
        .map(|i| {
            let shift = 5 * (SUFFIX_LEN - 1 - i);
            // Masked to five bits, so the index is always in range.
            char::from(ALPHABET[((value >> shift) & 0x1f) as usize])
        })
        .collect()
}

fn decode(suffix: &str) -> Result<Uuid, String> {
    let len = suffix.chars().count();
    if len != SUFFIX_LEN {
        return Err(format!(
            "the part after the prefix must be {SUFFIX_LEN} characters, got {len}"
        ));
    }
    let mut value: u128 = 0;
    for (i, c) in suffix.chars().enumerate() {
        if c.is_ascii_uppercase() {
            return Err("ids are lowercase".to_owned());
        }
        let digit = u8::try_from(c)
            .ok()
            .and_then(|b| ALPHABET.iter().position(|&a| a == b))
            .ok_or_else(|| format!("invalid character {c:?} (expected Crockford base32)"))?;
        if i == 0 && digit > 7 {
            return Err("the first character after the prefix must be 0-7".to_owned());
        }
        // 3 bits from the first digit plus 25 * 5 bits: exactly 128, no overflow.
        value = (value << 5) | digit as u128;
    }
    Ok(Uuid::from_u128(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_id_shape() {
        let id = new_id(DATACENTER);
        let suffix = id.strip_prefix("dc_").unwrap();
        assert_eq!(suffix.len(), 26);
        assert!(suffix.bytes().all(|b| ALPHABET.contains(&b)));
        assert!(suffix.as_bytes()[0] <= b'7');
        let uuid = parse_id(DATACENTER, &id).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
    }

    #[test]
    fn later_ids_sort_after_earlier_ones() {
        let ids: Vec<String> = (0..2000).map(|_| new_id(EVENT)).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} !< {}", pair[0], pair[1]);
            let a = parse_id(EVENT, &pair[0]).unwrap();
            let b = parse_id(EVENT, &pair[1]).unwrap();
            assert!(a < b);
        }
    }

    #[test]
    fn spec_vectors() {
        // Test vectors from the TypeID specification.
        let cases = [
            ("00000000000000000000000000", 0u128),
            ("00000000000000000000000001", 1),
            ("0000000000000000000000000a", 10),
            ("0000000000000000000000000g", 16),
            ("00000000000000000000000010", 32),
            ("7zzzzzzzzzzzzzzzzzzzzzzzzz", u128::MAX),
        ];
        for (suffix, n) in cases {
            let id = format!("agt_{suffix}");
            assert_eq!(parse_id(AGENT, &id).unwrap().as_u128(), n, "{id}");
            assert_eq!(encode(Uuid::from_u128(n)), suffix);
        }
        for (suffix, uuid) in [
            (
                "0123456789abcdefghjkmnpqrs",
                "0110c853-1d09-52d8-d73e-1194e95b5f19",
            ),
            (
                "01h455vb4pex5vsknk084sn02q",
                "01890a5d-ac96-774b-bcce-b302099a8057",
            ),
        ] {
            let uuid = Uuid::parse_str(uuid).unwrap();
            assert_eq!(encode(uuid), suffix);
            assert_eq!(parse_id("prefix", &format!("prefix_{suffix}")), Ok(uuid));
        }
    }

    #[test]
    fn wrong_prefix() {
        let id = new_id(AGENT);
        let err = parse_id(DATACENTER, &id).unwrap_err();
        assert!(matches!(err, IdError::WrongPrefix { .. }));
        assert_eq!(
            err.to_string(),
            format!("expected an id starting with \"dc_\", got \"{id}\"")
        );
        // A prefix that merely starts the same is still wrong.
        let suffix = id.strip_prefix("agt_").unwrap();
        assert!(matches!(
            parse_id(DATACENTER, &format!("dcx_{suffix}")),
            Err(IdError::WrongPrefix { .. })
        ));
        assert!(matches!(
            parse_id(DATACENTER, suffix),
            Err(IdError::WrongPrefix { .. })
        ));
        assert!(matches!(
            parse_id(DATACENTER, ""),
            Err(IdError::WrongPrefix { .. })
        ));
    }

    #[test]
    fn malformed() {
        let id = new_id(DATACENTER);
        let bad = [
            id.to_uppercase().replacen("DC_", "dc_", 1),
            format!("{id}0"),
            id[..id.len() - 1].to_owned(),
            format!("{}u", &id[..id.len() - 1]),
            format!("{}é", &id[..id.len() - 1]),
            "dc_8zzzzzzzzzzzzzzzzzzzzzzzzz".to_owned(),
            "dc_".to_owned(),
        ];
        for s in bad {
            let err = parse_id(DATACENTER, &s).unwrap_err();
            assert!(matches!(err, IdError::Malformed { .. }), "{s}: {err}");
            assert!(err.to_string().starts_with("malformed id: "));
        }
    }

    #[test]
    fn check_id_records_violations() {
        let mut v = Violations::new();
        check_id(&mut v, "id", DATACENTER, "");
        check_id(&mut v, "other", DATACENTER, &new_id(AGENT));
        check_id(&mut v, "ok", DATACENTER, &new_id(DATACENTER));
        let got: Vec<_> = v.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(got, ["id", "other"]);
        assert_eq!(v.iter().next().unwrap().description, "is required");
        assert!(
            v.iter()
                .nth(1)
                .unwrap()
                .description
                .starts_with("expected an id starting with \"dc_\"")
        );
    }
}
