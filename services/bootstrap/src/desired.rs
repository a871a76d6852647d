//! The desired set of a datacenter: declared specs ∪ hook contributions,
//! rendered with the datacenter's fields and hashed. Pure: no I/O.
//!
//! - Deduplicated by name: declared wins, then hooks in a stable order (by
//!   hook name), each hook's specs in its own order. Every dropped
//!   duplicate is reported as a [`Note`], so the plan shows the decision.
//! - Templating: env values, args, command and labels may use
//!   `${datacenter.id}`, `.name`, `.slug`, `.region`, `.zone`, `.provider`,
//!   `.tenant` and `${datacenter.labels.KEY}`; every other `$` (shell
//!   variables, `$$`) passes through and `$${datacenter.x}` writes a
//!   literal `${datacenter.x}`. An
//!   unknown variable (or a missing label) fails that spec with a clear
//!   error — it never renders empty — and a failed spec keeps its name
//!   reserved, so an installed version is left alone rather than retired.
//! - `spec_hash` covers the whole rendered spec; `structure_hash` leaves
//!   out what `Deploy` can change in place (images and env), so the planner
//!   can tell an in-place update from a replacement.

use std::collections::BTreeSet;

use ctrlplane_core::{Violations, validate};
use ctrlplane_proto::bootstrap::v1::{BootstrapServiceSpec, DatacenterInfo};
use sha2::{Digest, Sha256};

use crate::model::SOURCE_DECLARED;

/// One hook's specs for a datacenter.
#[derive(Debug, Clone, PartialEq)]
pub struct Contribution {
    /// Hook name.
    pub hook: String,
    /// Its specs.
    pub specs: Vec<BootstrapServiceSpec>,
}

/// A rendered, hashed desired spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Name.
    pub name: String,
    /// `declared` or the hook's name.
    pub source: String,
    /// Rendered spec.
    pub spec: BootstrapServiceSpec,
    /// Hash of the rendered spec.
    pub spec_hash: String,
    /// Hash without images and env.
    pub structure_hash: String,
}

/// A deduplication decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The contested name.
    pub name: String,
    /// The source whose spec was dropped.
    pub source: String,
    /// What was decided.
    pub message: String,
}

/// A spec that could not be rendered or is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The spec's name.
    pub name: String,
    /// Where it came from.
    pub source: String,
    /// What is wrong.
    pub message: String,
}

/// The result of [`build`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredSet {
    /// Specs to converge to, in priority order.
    pub items: Vec<Desired>,
    /// Deduplication decisions.
    pub notes: Vec<Note>,
    /// Specs that failed to render or validate (their names stay reserved).
    pub errors: Vec<SpecError>,
}

impl DesiredSet {
    /// Whether `name` is wanted (rendered or failed).
    pub fn claims(&self, name: &str) -> bool {
        self.items.iter().any(|d| d.name == name) || self.errors.iter().any(|e| e.name == name)
    }
}

/// Builds the desired set. `declared` was validated when it was stored;
/// hook specs are validated here.
pub fn build(
    dc: &DatacenterInfo,
    declared: &[BootstrapServiceSpec],
    contributions: &[Contribution],
) -> DesiredSet {
    let mut hooks: Vec<&Contribution> = contributions.iter().collect();
    hooks.sort_by(|a, b| a.hook.cmp(&b.hook));
    let candidates = declared.iter().map(|s| (SOURCE_DECLARED, s)).chain(
        hooks
            .iter()
            .flat_map(|c| c.specs.iter().map(move |s| (c.hook.as_str(), s))),
    );

    let mut out = DesiredSet::default();
    let mut winner: std::collections::BTreeMap<String, String> = Default::default();
    for (source, spec) in candidates {
        if let Some(first) = winner.get(&spec.name) {
            let why = if first == SOURCE_DECLARED {
                "declared wins".to_string()
            } else if first == source {
                format!("hook {first:?} contributed it twice; its first spec wins")
            } else {
                format!("hook {first:?} sorts first")
            };
            out.notes.push(Note {
                name: spec.name.clone(),
                source: source.to_string(),
                message: format!("{source}'s {:?} ignored: {why}", spec.name),
            });
            continue;
        }
        winner.insert(spec.name.clone(), source.to_string());
        if source != SOURCE_DECLARED {
            let mut v = Violations::new();
            validate::bootstrap_spec(&mut v, "spec", spec);
            if !v.is_empty() {
                out.errors.push(SpecError {
                    name: spec.name.clone(),
                    source: source.to_string(),
                    message: format!("invalid spec from hook {source:?}: {v}"),
                });
                continue;
            }
        }
        match render(spec, dc) {
            Ok(rendered) => out.items.push(Desired {
                name: rendered.name.clone(),
                source: source.to_string(),
                spec_hash: spec_hash(&rendered),
                structure_hash: structure_hash(&rendered),
                spec: rendered,
            }),
            Err(message) => out.errors.push(SpecError {
                name: spec.name.clone(),
                source: source.to_string(),
                message,
            }),
        }
    }
    out
}

/// Value of one template variable.
fn variable(dc: &DatacenterInfo, name: &str) -> Option<String> {
    let rest = name.strip_prefix("datacenter.")?;
    if let Some(key) = rest.strip_prefix("labels.") {
        return dc.labels.get(key).cloned();
    }
    Some(
        match rest {
            "id" => &dc.id,
            "name" => &dc.name,
            "slug" => &dc.slug,
            "region" => &dc.region,
            "zone" => &dc.zone,
            "provider" => &dc.provider_name,
            "tenant" => &dc.tenant_id,
            _ => return None,
        }
        .clone(),
    )
}

/// Renders one string: `${datacenter.…}` references are replaced; every
/// other `$` (shell variables like `${HOME}` or `$$`) is left as it is;
/// `$${datacenter.x}` writes a literal `${datacenter.x}`.
///
/// # Errors
/// A message naming the unknown variable or the unterminated reference.
pub fn render_str(s: &str, dc: &DatacenterInfo) -> Result<String, String> {
    const OPEN: &str = "${datacenter.";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(OPEN) {
        if rest[..i].ends_with('$') {
            // `$${datacenter.…}`: an escaped, literal reference.
            out.push_str(&rest[..i - 1]);
            out.push_str(OPEN);
            rest = &rest[i + OPEN.len()..];
            continue;
        }
        out.push_str(&rest[..i]);
        let tail = &rest[i + 2..];
        let end = tail
            .find('}')
            .ok_or_else(|| format!("unterminated variable reference in {s:?}"))?;
        let name = &tail[..end];
        let value = variable(dc, name).ok_or_else(|| {
            if let Some(label) = name.strip_prefix("datacenter.labels.") {
                format!("${{{name}}}: the datacenter has no label {label:?}")
            } else {
                format!(
                    "unknown variable ${{{name}}} (known: datacenter.id, .name, .slug, .region, .zone, .provider, .tenant, .labels.KEY)"
                )
            }
        })?;
        out.push_str(&value);
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Renders every templated field of a spec.
///
/// # Errors
/// The first failure, prefixed with the field's path.
pub fn render(
    spec: &BootstrapServiceSpec,
    dc: &DatacenterInfo,
) -> Result<BootstrapServiceSpec, String> {
    let at = |path: String| move |e: String| format!("spec {:?}: {path}: {e}", spec.name);
    let mut out = spec.clone();
    for (k, v) in out.labels.iter_mut() {
        *v = render_str(v, dc).map_err(at(format!("labels[{k}]")))?;
    }
    for (i, svc) in out.services.iter_mut().enumerate() {
        for (k, v) in svc.env.iter_mut() {
            *v = render_str(v, dc).map_err(at(format!("services[{i}].env[{k}]")))?;
        }
        for (j, a) in svc.args.iter_mut().enumerate() {
            *a = render_str(a, dc).map_err(at(format!("services[{i}].args[{j}]")))?;
        }
        for (j, c) in svc.command.iter_mut().enumerate() {
            *c = render_str(c, dc).map_err(at(format!("services[{i}].command[{j}]")))?;
        }
    }
    Ok(out)
}

fn hash_json(value: &serde_json::Value) -> String {
    // serde_json's map is a BTreeMap: keys serialize sorted, so equal specs
    // hash equally whatever their maps' iteration order.
    let digest = Sha256::digest(value.to_string().as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Hash of a whole spec.
pub fn spec_hash(spec: &BootstrapServiceSpec) -> String {
    hash_json(&serde_json::to_value(spec).expect("specs serialize"))
}

/// Hash of a spec without images and env (what `Deploy` changes in place).
pub fn structure_hash(spec: &BootstrapServiceSpec) -> String {
    let mut s = spec.clone();
    for svc in &mut s.services {
        svc.image.clear();
        svc.env.clear();
    }
    spec_hash(&s)
}

/// Names a spec list depends on that are not in it.
pub fn missing_dependencies(items: &[Desired]) -> BTreeSet<String> {
    let names: BTreeSet<&str> = items.iter().map(|d| d.name.as_str()).collect();
    items
        .iter()
        .flat_map(|d| d.spec.depends_on.iter())
        .filter(|n| !names.contains(n.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctrlplane_proto::provider::v1::ServiceSpec;

    fn dc() -> DatacenterInfo {
        DatacenterInfo {
            id: "dc_1".into(),
            tenant_id: "t1".into(),
            name: "Frankfurt".into(),
            slug: "frankfurt".into(),
            provider_name: "docker".into(),
            region: "eu".into(),
            zone: "eu-1a".into(),
            labels: [("team".to_string(), "infra".to_string())].into(),
            ..Default::default()
        }
    }

    fn spec(name: &str, image: &str) -> BootstrapServiceSpec {
        BootstrapServiceSpec {
            name: name.into(),
            services: vec![ServiceSpec {
                name: "main".into(),
                image: image.into(),
                command: vec!["run".into()],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn hook(name: &str, specs: Vec<BootstrapServiceSpec>) -> Contribution {
        Contribution {
            hook: name.into(),
            specs,
        }
    }

    #[test]
    fn declared_wins_then_hooks_by_name() {
        let set = build(
            &dc(),
            &[spec("logs", "declared")],
            &[
                hook("zeta", vec![spec("metrics", "zeta"), spec("logs", "zeta")]),
                hook(
                    "alpha",
                    vec![spec("metrics", "alpha"), spec("certs", "alpha")],
                ),
            ],
        );
        let got: Vec<(&str, &str, &str)> = set
            .items
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.source.as_str(),
                    d.spec.services[0].image.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("logs", "declared", "declared"),
                ("metrics", "alpha", "alpha"),
                ("certs", "alpha", "alpha")
            ]
        );
        let notes: Vec<&str> = set.notes.iter().map(|n| n.message.as_str()).collect();
        assert_eq!(
            notes,
            [
                "zeta's \"metrics\" ignored: hook \"alpha\" sorts first",
                "zeta's \"logs\" ignored: declared wins"
            ]
        );
        // The order of contributions as given does not matter.
        let again = build(
            &dc(),
            &[spec("logs", "declared")],
            &[
                hook(
                    "alpha",
                    vec![spec("metrics", "alpha"), spec("certs", "alpha")],
                ),
                hook("zeta", vec![spec("metrics", "zeta"), spec("logs", "zeta")]),
            ],
        );
        assert_eq!(again.items, set.items);
    }

    #[test]
    fn templating_renders_fields_and_rejects_unknowns() {
        let mut s = spec("logs", "img");
        s.services[0].env.insert(
            "DC".into(),
            "${datacenter.slug}-${datacenter.region}".into(),
        );
        s.services[0].args = vec![
            "--team=${datacenter.labels.team}".into(),
            "${HOME} $$ $1".into(),
            "$${datacenter.id}".into(),
        ];
        s.services[0].command = vec!["run-${datacenter.provider}".into()];
        s.labels.insert("dc".into(), "${datacenter.id}".into());
        let set = build(&dc(), &[s], &[]);
        let r = &set.items[0].spec;
        assert_eq!(r.services[0].env["DC"], "frankfurt-eu");
        assert_eq!(
            r.services[0].args,
            ["--team=infra", "${HOME} $$ $1", "${datacenter.id}"]
        );
        assert_eq!(r.services[0].command, ["run-docker"]);
        assert_eq!(r.labels["dc"], "dc_1");

        for (value, want) in [
            (
                "${datacenter.color}",
                "unknown variable ${datacenter.color}",
            ),
            ("${datacenter.labels.owner}", "no label \"owner\""),
            ("${datacenter.name", "unterminated"),
        ] {
            let mut bad = spec("bad", "img");
            bad.services[0].env.insert("X".into(), value.into());
            let set = build(&dc(), &[bad], &[]);
            assert!(set.items.is_empty());
            assert_eq!(set.errors.len(), 1);
            assert!(
                set.errors[0].message.contains(want),
                "{}",
                set.errors[0].message
            );
            assert!(
                set.errors[0].message.contains("services[0].env[X]"),
                "{}",
                set.errors[0].message
            );
            assert!(set.claims("bad"));
        }
    }

    #[test]
    fn invalid_hook_specs_are_errors_not_installs() {
        let mut bad = spec("broken", "img");
        bad.services.clear();
        let set = build(&dc(), &[], &[hook("h", vec![bad])]);
        assert!(set.items.is_empty());
        assert!(
            set.errors[0]
                .message
                .contains("invalid spec from hook \"h\""),
            "{:?}",
            set.errors
        );
    }

    #[test]
    fn hashes_tell_deployable_changes_from_structural_ones() {
        let a = spec("x", "img:1");
        let mut image = a.clone();
        image.services[0].image = "img:2".into();
        let mut env = a.clone();
        env.services[0].env.insert("K".into(), "V".into());
        let mut structural = a.clone();
        structural.services[0].command = vec!["other".into()];
        assert_ne!(spec_hash(&a), spec_hash(&image));
        assert_eq!(structure_hash(&a), structure_hash(&image));
        assert_eq!(structure_hash(&a), structure_hash(&env));
        assert_ne!(structure_hash(&a), structure_hash(&structural));

        // Map order does not change the hash.
        let mut m1 = a.clone();
        let mut m2 = a.clone();
        for (k, v) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")] {
            m1.services[0].env.insert(k.into(), v.into());
        }
        for (k, v) in [("d", "4"), ("c", "3"), ("b", "2"), ("a", "1")] {
            m2.services[0].env.insert(k.into(), v.into());
        }
        assert_eq!(spec_hash(&m1), spec_hash(&m2));
    }
}
