//! Parsing what the user hands in: `KEY=VALUE` flag values, durations, and
//! proto-JSON files (`-` reads stdin).
//!
//! Files are parsed with the generated pbjson impls, so they are exactly the
//! canonical proto JSON that `-o json` prints (camelCase or the original
//! snake_case field names, enums by name); unknown fields are rejected, so a
//! typo in a file is an error rather than silently dropped.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1::Datacenter;

use crate::error::CliError;

/// Parses one `KEY=VALUE` flag value (clap value parser). The key must be
/// non-empty; the value may be empty and may itself contain `=`.
///
/// # Errors
/// A message clap shows as a usage error.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, _)) if k.trim().is_empty() => Err(format!(
            "expected KEY=VALUE with a non-empty KEY, got {s:?}"
        )),
        Some((k, v)) => Ok((k.to_string(), v.to_string())),
        None => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Parses a duration flag (`500ms`, `10s`, `5m`, `1h`, plain seconds) that
/// must be positive (clap value parser).
///
/// # Errors
/// A message clap shows as a usage error.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = ctrlplane_runtime::config::parse_duration(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".to_string());
    }
    Ok(d)
}

/// Collects repeated `--FLAG KEY=VALUE` pairs into a map.
///
/// # Errors
/// [`CliError::Usage`] when a key is given twice: silently keeping one of
/// them would hide a mistake.
pub fn pairs_to_map(
    flag: &str,
    pairs: &[(String, String)],
) -> Result<HashMap<String, String>, CliError> {
    let mut map = HashMap::with_capacity(pairs.len());
    for (k, v) in pairs {
        if map.insert(k.clone(), v.clone()).is_some() {
            return Err(CliError::Usage(format!(
                "--{flag} {k:?} is given more than once"
            )));
        }
    }
    Ok(map)
}

/// Reads a file, or stdin for `-`.
///
/// # Errors
/// [`CliError::Input`] naming the path.
pub fn read_input(path: &Path) -> Result<String, CliError> {
    let shown = path.display().to_string();
    let result = if shown == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map(|_| s)
    } else {
        std::fs::read_to_string(path)
    };
    result.map_err(|e| CliError::Input {
        path: shown,
        message: format!("cannot read: {e}"),
    })
}

/// Parses a bootstrap file: a JSON array of `BootstrapServiceSpec`, or an
/// object `{"bootstrapServices": [...]}` (the shape of a datacenter's
/// field, so `jq '{bootstrapServices}'` output works too).
///
/// # Errors
/// [`CliError::Input`] naming `path` and saying what is wrong.
pub fn parse_bootstrap_specs(
    path: &str,
    text: &str,
) -> Result<Vec<BootstrapServiceSpec>, CliError> {
    let bad = |message: String| CliError::Input {
        path: path.to_string(),
        message,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let list = match value {
        serde_json::Value::Array(_) => value,
        serde_json::Value::Object(mut obj) => {
            let key = ["bootstrapServices", "bootstrap_services"]
                .into_iter()
                .find(|k| obj.contains_key(*k))
                .ok_or_else(|| bad(EXPECTED_BOOTSTRAP.to_string()))?;
            if obj.len() != 1 {
                return Err(bad(format!(
                    "{EXPECTED_BOOTSTRAP}; unexpected other keys next to {key:?}"
                )));
            }
            obj.remove(key).unwrap_or_default()
        }
        _ => return Err(bad(EXPECTED_BOOTSTRAP.to_string())),
    };
    serde_json::from_value(list).map_err(|e| bad(format!("invalid BootstrapServiceSpec list: {e}")))
}

const EXPECTED_BOOTSTRAP: &str =
    "expected a JSON array of BootstrapServiceSpec, or {\"bootstrapServices\": [...]}";

/// Parses a whole `Datacenter` in proto JSON (e.g. the output of
/// `ctrlplane dc get ID -o json`; output-only fields are ignored by the
/// server).
///
/// # Errors
/// [`CliError::Input`] naming `path`.
pub fn parse_datacenter(path: &str, text: &str) -> Result<Datacenter, CliError> {
    serde_json::from_str(text).map_err(|e| CliError::Input {
        path: path.to_string(),
        message: format!("invalid Datacenter JSON: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values() {
        assert_eq!(
            parse_key_value("env=prod").unwrap(),
            ("env".into(), "prod".into())
        );
        assert_eq!(parse_key_value("k=").unwrap(), ("k".into(), String::new()));
        assert_eq!(
            parse_key_value("url=a=b").unwrap(),
            ("url".into(), "a=b".into())
        );
        assert!(
            parse_key_value("env")
                .unwrap_err()
                .contains("expected KEY=VALUE")
        );
        assert!(
            parse_key_value("=prod")
                .unwrap_err()
                .contains("non-empty KEY")
        );
        assert!(parse_key_value("").is_err());
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let pairs = vec![
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ];
        let map = pairs_to_map("label", &pairs).unwrap();
        assert_eq!(map.len(), 2);
        assert_eq!(map["b"], "2");
        let dup = vec![
            ("a".to_string(), "1".to_string()),
            ("a".to_string(), "2".to_string()),
        ];
        let err = pairs_to_map("label", &dup).unwrap_err();
        assert!(
            matches!(err, CliError::Usage(ref m) if m.contains("--label \"a\"")),
            "{err}"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_positive_duration("1h").unwrap(),
            Duration::from_secs(3600)
        );
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_positive_duration("soon").is_err());
    }

    #[test]
    fn bootstrap_files_in_both_shapes() {
        let array = r#"[{"name":"logs","kind":"WORKLOAD_KIND_DEPLOYMENT",
            "services":[{"name":"vector","image":"timberio/vector:0.40"}]},{"name":"metrics"}]"#;
        let specs = parse_bootstrap_specs("b.json", array).unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].name, "logs");
        assert_eq!(specs[0].services[0].image, "timberio/vector:0.40");

        let wrapped = r#"{"bootstrapServices":[{"name":"logs","dependsOn":["certs"]}]}"#;
        let specs = parse_bootstrap_specs("b.json", wrapped).unwrap();
        assert_eq!(specs[0].depends_on, vec!["certs".to_string()]);
        let snake = r#"{"bootstrap_services":[]}"#;
        assert!(parse_bootstrap_specs("b.json", snake).unwrap().is_empty());
    }

    #[test]
    fn bad_bootstrap_files_name_the_file_and_problem() {
        let cases = [
            ("not json", "not valid JSON"),
            (r#"{"name":"logs"}"#, "expected a JSON array"),
            (r#"{"bootstrapServices":[],"x":1}"#, "unexpected other keys"),
            ("42", "expected a JSON array"),
            (r#"[{"nmae":"logs"}]"#, "invalid BootstrapServiceSpec list"),
        ];
        for (text, want) in cases {
            let err = parse_bootstrap_specs("specs.json", text)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("specs.json: ") && err.contains(want),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn datacenter_files() {
        let dc = parse_datacenter(
            "dc.json",
            r#"{"name":"Berlin 1","providerName":"process","labels":{"env":"prod"},
                "location":{"city":"Berlin"},"status":"DATACENTER_STATUS_ACTIVE","revision":"3"}"#,
        )
        .unwrap();
        assert_eq!(dc.name, "Berlin 1");
        assert_eq!(dc.provider_name, "process");
        assert_eq!(dc.labels["env"], "prod");
        assert_eq!(dc.location.unwrap().city, "Berlin");
        let err = parse_datacenter("dc.json", r#"{"nam":"x"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("dc.json: invalid Datacenter JSON"), "{err}");
    }

    #[test]
    fn missing_files_are_named() {
        let err = read_input(Path::new("/nonexistent/specs.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/nonexistent/specs.json: cannot read"),
            "{err}"
        );
    }
}
