//! Label selectors: `k=v,k2=v2`, all of which must hold.
//!
//! Items are separated by `,`; whitespace around an item, a key or a value
//! is ignored; the empty (or all-blank) selector matches everything. Keys
//! and values follow the label rules of [`crate::validate::labels`], which
//! is what guarantees a label value never contains `,` or `=`. An empty value
//! (`k=`) matches a label whose value is empty. An empty item (`a=b,,c=d` or a
//! trailing comma) is an error rather than ignored, so typos surface.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::validate::{label_key_problem, label_value_problem};
use crate::violations::quote;

/// A parsed selector: `(key, value)` pairs that must all match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<(String, String)>);

impl LabelSelector {
    /// Parses `k=v,k2=v2`.
    ///
    /// # Errors
    ///
    /// A description naming the first bad item, e.g.
    /// `invalid selector item "team": expected key=value`.
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        if s.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        let mut pairs = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            let bad = |why: &str| format!("invalid selector item {}: {why}", quote(item));
            let Some((k, value)) = item.split_once('=') else {
                return Err(bad("expected key=value"));
            };
            let (k, value) = (k.trim(), value.trim());
            if let Some(problem) = label_key_problem(k) {
                return Err(bad(&format!("key {problem}")));
            }
            if let Some(problem) = label_value_problem(value) {
                return Err(bad(&format!("value {problem}")));
            }
            pairs.push((k.to_owned(), value.to_owned()));
        }
        Ok(LabelSelector(pairs))
    }

    /// Whether every pair is present in `labels` with exactly that value.
    pub fn matches(&self, labels: &HashMap<String, String>) -> bool {
        self.0
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
    }

    /// The pairs in the order written.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    /// Whether this selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for LabelSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Writes the canonical form `k=v,k2=v2`, which parses back to the same.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_matches_all() {
        for s in ["", "   "] {
            let sel = LabelSelector::parse(s).unwrap();
            assert!(sel.is_empty());
            assert!(sel.matches(&labels(&[])));
            assert!(sel.matches(&labels(&[("a", "b")])));
        }
    }

    #[test]
    fn parses_and_trims() {
        let sel = LabelSelector::parse(" team = infra , example.com/tier=gold,empty=").unwrap();
        assert_eq!(
            sel.pairs(),
            [
                ("team".to_string(), "infra".to_string()),
                ("example.com/tier".to_string(), "gold".to_string()),
                ("empty".to_string(), String::new()),
            ]
        );
        assert_eq!(sel.to_string(), "team=infra,example.com/tier=gold,empty=");
        assert_eq!(sel.to_string().parse::<LabelSelector>().unwrap(), sel);
    }

    #[test]
    fn matching() {
        let sel = LabelSelector::parse("team=infra,tier=gold").unwrap();
        assert!(sel.matches(&labels(&[("team", "infra"), ("tier", "gold"), ("x", "y")])));
        assert!(!sel.matches(&labels(&[("team", "infra")])));
        assert!(!sel.matches(&labels(&[("team", "infra"), ("tier", "silver")])));
        let empty_value = LabelSelector::parse("flag=").unwrap();
        assert!(empty_value.matches(&labels(&[("flag", "")])));
        assert!(!empty_value.matches(&labels(&[])));
    }

    #[test]
    fn errors_name_the_item() {
        for (s, item) in [
            ("team", "\"team\""),
            ("a=b,,c=d", "\"\""),
            ("a=b,", "\"\""),
            ("=x", "\"=x\""),
            ("a=b=c", "\"a=b=c\""),
            ("Bad Key=x", "\"Bad Key=x\""),
            ("a=-x", "\"a=-x\""),
        ] {
            let err = LabelSelector::parse(s).unwrap_err();
            assert!(
                err.starts_with(&format!("invalid selector item {item}: ")),
                "{s}: {err}"
            );
        }
    }
}
