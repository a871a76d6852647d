//! Rendering results: aligned tables, `Key: value` views and proto JSON.
//!
//! Everything here returns strings (no I/O), so the exact layout is
//! unit-tested. JSON output is the messages' canonical proto JSON (pbjson)
//! with object keys sorted, so the same resource always prints the same
//! bytes: protobuf maps are `HashMap`s, whose order would otherwise change
//! from run to run.

use std::collections::HashMap;

use ctrlplane_proto::pbjson_types::Timestamp;
use serde::Serialize;

use crate::error::CliError;

/// How results are printed (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Human-readable: a table for lists, `Key: value` lines for one object.
    #[default]
    Table,
    /// Canonical proto JSON, for scripts (`jq`) and for `--from-file`.
    Json,
}

/// Spaces between table columns.
const GAP: usize = 3;

/// Formats rows under headers with every column left-aligned to its widest
/// cell. Trailing spaces are trimmed; empty cells should be given as `-`
/// by the caller so that columns stay visible.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate().take(widths.len()) {
            line.push_str(cell);
            let pad = widths[i] - cell.chars().count() + GAP;
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Formats `Key: value` lines with the values aligned. A multi-line value
/// continues indented under its first line.
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let label = format!("{key}:");
        let mut lines = value.lines();
        let first = lines.next().unwrap_or("");
        out.push_str(format!("{label:<width$}  {first}").trim_end());
        out.push('\n');
        for line in lines {
            out.push_str(&" ".repeat(width + 2));
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `-` for an empty string, so that table columns stay visible.
pub fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_string()
    } else {
        s.to_string()
    }
}

/// `k=v` pairs sorted by key and joined with `,` (the label selector
/// syntax); `-` for none.
pub fn pairs(map: &HashMap<String, String>) -> String {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort();
    let joined = entries
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    or_dash(&joined)
}

/// A timestamp as `2024-05-01T12:00:03Z` (UTC, whole seconds); `-` when
/// unset.
pub fn timestamp(ts: Option<&Timestamp>) -> String {
    let Some(ts) = ts else {
        return "-".to_string();
    };
    let days = ts.seconds.div_euclid(86_400);
    let secs = ts.seconds.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`; exact for every `i64` day we can meet).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Pretty proto JSON of a message (or anything serializable), keys sorted,
/// with a trailing newline.
///
/// # Errors
/// A value the generated serializer refuses (e.g. a timestamp out of
/// range).
pub fn json<T: Serialize>(value: &T) -> Result<String, CliError> {
    let value = serde_json::to_value(value)
        .map_err(|e| CliError::Config(format!("cannot encode JSON: {e}")))?;
    json_value(value)
}

/// Pretty JSON of a `serde_json::Value`, keys sorted, trailing newline.
///
/// # Errors
/// Never in practice (a `Value` always serializes).
pub fn json_value(value: serde_json::Value) -> Result<String, CliError> {
    let mut s = serde_json::to_string_pretty(&sort_keys(value))
        .map_err(|e| CliError::Config(format!("cannot encode JSON: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// Re-inserts every object's keys in sorted order. (`serde_json::Map` keeps
/// insertion order when another crate in the build turns on
/// `preserve_order`, so relying on it being a `BTreeMap` is not enough.)
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim() {
        let rows = vec![
            vec![
                "dc_1".to_string(),
                "Berlin".to_string(),
                "active".to_string(),
            ],
            vec![
                "dc_22".to_string(),
                "-".to_string(),
                "maintenance".to_string(),
            ],
        ];
        assert_eq!(
            table(&["ID", "NAME", "STATUS"], &rows),
            "ID      NAME     STATUS\n\
             dc_1    Berlin   active\n\
             dc_22   -        maintenance\n"
        );
        assert_eq!(table(&["ID", "NAME"], &[]), "ID   NAME\n");
    }

    #[test]
    fn tables_count_characters_not_bytes() {
        let rows = vec![vec!["Zürich".to_string(), "x".to_string()]];
        assert_eq!(table(&["NAME", "S"], &rows), "NAME     S\nZürich   x\n");
    }

    #[test]
    fn key_value_views_align() {
        let out = key_values(&[
            ("ID", "dc_1".to_string()),
            ("Provider", "process".to_string()),
            ("Zone", String::new()),
            ("Bootstrap services", "logs\nmetrics".to_string()),
        ]);
        assert_eq!(
            out,
            "ID:                  dc_1\n\
             Provider:            process\n\
             Zone:\n\
             Bootstrap services:  logs\n                     metrics\n"
        );
    }

    #[test]
    fn pairs_are_sorted() {
        let map: HashMap<String, String> = [("b", "2"), ("a", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs(&map), "a=1,b=2");
        assert_eq!(pairs(&HashMap::new()), "-");
    }

    #[test]
    fn timestamps() {
        let ts = Timestamp {
            seconds: 1_714_564_803,
            nanos: 500,
        };
        assert_eq!(timestamp(Some(&ts)), "2024-05-01T12:00:03Z");
        assert_eq!(timestamp(None), "-");
        let at = |seconds| timestamp(Some(&Timestamp { seconds, nanos: 0 }));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(-1), "1969-12-31T23:59:59Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn json_keys_are_sorted_and_deterministic() {
        let dc = ctrlplane_proto::datacenter::v1::Datacenter {
            id: "dc_1".into(),
            labels: (0..20)
                .map(|i| (format!("k{i:02}"), "v".to_string()))
                .collect(),
            revision: 7,
            ..Default::default()
        };
        let out = json(&dc).unwrap();
        assert!(out.ends_with("}\n"));
        let k00 = out.find("\"k00\"").unwrap();
        let k19 = out.find("\"k19\"").unwrap();
        assert!(k00 < k19);
        // proto JSON: int64 as a string, camelCase names.
        assert!(out.contains("\"revision\": \"7\""), "{out}");
        assert_eq!(out, json(&dc.clone()).unwrap());
    }
}
