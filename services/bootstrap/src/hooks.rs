//! Hooks: sources of bootstrap specs for datacenters of a given shape.
//!
//! - **Rule hooks** come from a JSON file (`CP_BOOTSTRAP_HOOKS_FILE`): a
//!   selector on provider, region, zone and labels → specs, e.g. "every
//!   kubernetes datacenter gets cert-manager".
//! - **Remote hooks** are `BootstrapHookService` servers in any language,
//!   registered with `RegisterHook` (or listed in the same file). Each call
//!   has a timeout. A hook that fails or times out contributes its **last
//!   known** specs for that datacenter, so a transient failure never
//!   retires what it installed; an event says why.
//!
//! File format:
//! ```json
//! {
//!   "rules": [
//!     {"name": "cert-manager", "selector": {"provider": "kubernetes", "labels": {"env": "prod"}},
//!      "services": [ {BootstrapServiceSpec in proto JSON}, … ]}
//!   ],
//!   "remote": [ {"name": "inventory", "endpoint": "http://127.0.0.1:9000", "timeout": "5s"} ]
//! }
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_core::{Violations, validate};
use ctrlplane_proto::bootstrap::v1::{
    BootstrapServiceSpec, ContributeServicesRequest, DatacenterInfo,
    bootstrap_hook_service_client::BootstrapHookServiceClient,
};
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::client::{BearerInterceptor, authed_channel};
use serde::Deserialize;

use crate::desired::Contribution;
use crate::error::{Error, Result};
use crate::model::NewEvent;
use crate::store::Store;

/// Default timeout of a remote hook call.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest timeout of a remote hook call.
pub const MAX_HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Which datacenters a rule applies to; empty fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// Provider name.
    #[serde(default)]
    pub provider: String,
    /// Region.
    #[serde(default)]
    pub region: String,
    /// Zone.
    #[serde(default)]
    pub zone: String,
    /// Every label must be present with this value.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl Selector {
    /// Whether the datacenter matches.
    pub fn matches(&self, dc: &DatacenterInfo) -> bool {
        (self.provider.is_empty() || self.provider == dc.provider_name)
            && (self.region.is_empty() || self.region == dc.region)
            && (self.zone.is_empty() || self.zone == dc.zone)
            && self.labels.iter().all(|(k, v)| dc.labels.get(k) == Some(v))
    }

    /// A readable form, e.g. `provider=kubernetes,labels.env=prod`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("provider", &self.provider),
            ("region", &self.region),
            ("zone", &self.zone),
        ] {
            if !v.is_empty() {
                parts.push(format!("{k}={v}"));
            }
        }
        parts.extend(self.labels.iter().map(|(k, v)| format!("labels.{k}={v}")));
        if parts.is_empty() {
            "every datacenter".to_string()
        } else {
            parts.join(",")
        }
    }
}

/// A rule hook.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleHook {
    /// Hook name (DNS label).
    pub name: String,
    /// Which datacenters.
    #[serde(default)]
    pub selector: Selector,
    /// What they get.
    pub services: Vec<BootstrapServiceSpec>,
}

/// A remote hook listed in the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteHookConfig {
    /// Name.
    pub name: String,
    /// Endpoint.
    pub endpoint: String,
    /// Timeout, e.g. `5s`.
    #[serde(default)]
    pub timeout: Option<String>,
}

/// The hooks file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksFile {
    /// Rule hooks.
    #[serde(default)]
    pub rules: Vec<RuleHook>,
    /// Remote hooks to register at start.
    #[serde(default)]
    pub remote: Vec<RemoteHookConfig>,
}

impl HooksFile {
    /// Parses and validates a hooks file.
    ///
    /// # Errors
    /// A message naming the file and every problem.
    pub fn load(path: &Path) -> std::result::Result<HooksFile, String> {
        let raw = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file: HooksFile =
            serde_json::from_str(&raw).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut v = Violations::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, r) in file.rules.iter().enumerate() {
            validate::dns_label(&mut v, &format!("rules[{i}].name"), &r.name);
            if !names.insert(r.name.clone()) {
                v.add(
                    format!("rules[{i}].name"),
                    format!("duplicate hook name {:?}", r.name),
                );
            }
            validate::bootstrap_specs(&mut v, &format!("rules[{i}].services"), &r.services);
        }
        for (i, r) in file.remote.iter().enumerate() {
            validate::dns_label(&mut v, &format!("remote[{i}].name"), &r.name);
            if !names.insert(r.name.clone()) {
                v.add(
                    format!("remote[{i}].name"),
                    format!("duplicate hook name {:?}", r.name),
                );
            }
            if let Some(t) = &r.timeout
                && let Err(e) = ctrlplane_runtime::config::parse_duration(t)
            {
                v.add(format!("remote[{i}].timeout"), e);
            }
        }
        v.into_result()
            .map_err(|v| format!("{}: {v}", path.display()))?;
        Ok(file)
    }
}

/// A failed remote hook call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookFailure {
    /// Hook name.
    pub hook: String,
    /// Why.
    pub error: String,
    /// Specs used instead (from its last success), if any.
    pub fallback: usize,
}

/// Gathers contributions from every hook.
#[derive(Clone)]
pub struct Hooks {
    rules: Arc<Vec<RuleHook>>,
    store: Store,
    auth: Arc<Authenticator>,
}

impl Hooks {
    /// Hooks over `rules` and the remote hooks registered in `store`.
    pub fn new(rules: Vec<RuleHook>, store: Store, auth: Arc<Authenticator>) -> Self {
        Hooks {
            rules: Arc::new(rules),
            store,
            auth,
        }
    }

    /// The authenticator hooks and agents are called with.
    pub fn auth(&self) -> Arc<Authenticator> {
        self.auth.clone()
    }

    /// The rule hooks.
    pub fn rules(&self) -> &[RuleHook] {
        &self.rules
    }

    /// Whether a rule hook has this name.
    pub fn is_rule(&self, name: &str) -> bool {
        self.rules.iter().any(|r| r.name == name)
    }

    /// Every hook's specs for `dc`. With `record`, successful remote answers
    /// refresh the cache and failures are recorded as events; without it
    /// (dry runs) nothing is written.
    ///
    /// # Errors
    /// Database failures.
    pub async fn contributions(
        &self,
        dc: &DatacenterInfo,
        record: bool,
    ) -> Result<(Vec<Contribution>, Vec<HookFailure>)> {
        let mut out: Vec<Contribution> = self
            .rules
            .iter()
            .filter(|r| r.selector.matches(dc))
            .map(|r| Contribution {
                hook: r.name.clone(),
                specs: r.services.clone(),
            })
            .collect();
        let remotes = self.store.hooks().await?;
        let calls = remotes.iter().map(|h| async move {
            let res = call_hook(&h.endpoint, h.timeout, self.auth.clone(), dc).await;
            (h, res)
        });
        let mut failures = Vec::new();
        for (hook, res) in futures::future::join_all(calls).await {
            match res {
                Ok(specs) => {
                    if record {
                        self.store.cache_specs(&hook.name, &dc.id, &specs).await?;
                        self.store.hook_outcome(&hook.name, None).await?;
                    }
                    out.push(Contribution {
                        hook: hook.name.clone(),
                        specs,
                    });
                }
                Err(error) => {
                    let cached = self
                        .store
                        .cached_specs(&hook.name, &dc.id)
                        .await?
                        .unwrap_or_default();
                    let failure = HookFailure {
                        hook: hook.name.clone(),
                        error: error.clone(),
                        fallback: cached.len(),
                    };
                    if record {
                        self.store.hook_outcome(&hook.name, Some(&error)).await?;
                        self.store
                            .record_event(
                                &dc.id,
                                "",
                                &NewEvent::transition(
                                    "hook_failed",
                                    None,
                                    None,
                                    format!(
                                        "hook {:?} failed ({error}); using its last known specs ({} services)",
                                        hook.name,
                                        cached.len()
                                    ),
                                ),
                            )
                            .await?;
                    }
                    tracing::warn!(hook = %hook.name, datacenter = %dc.id, %error, fallback = cached.len(), "hook failed");
                    out.push(Contribution {
                        hook: hook.name.clone(),
                        specs: cached,
                    });
                    failures.push(failure);
                }
            }
        }
        Ok((out, failures))
    }
}

/// Calls one remote hook.
async fn call_hook(
    endpoint: &str,
    timeout: Duration,
    auth: Arc<Authenticator>,
    dc: &DatacenterInfo,
) -> std::result::Result<Vec<BootstrapServiceSpec>, String> {
    let channel = authed_channel(endpoint, BearerInterceptor::service(auth, "bootstrap"))
        .map_err(|e| e.to_string())?;
    let mut client = BootstrapHookServiceClient::new(channel);
    let mut req = tonic::Request::new(ContributeServicesRequest {
        datacenter: Some(dc.clone()),
    });
    req.set_timeout(timeout);
    match tokio::time::timeout(timeout, client.contribute_services(req)).await {
        Err(_) => Err(format!("no answer within {timeout:?}")),
        // The deadline sent along (grpc-timeout) may fire first.
        Ok(Err(s))
            if matches!(
                s.code(),
                tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
            ) =>
        {
            Err(format!(
                "no answer within {timeout:?} ({:?}: {})",
                s.code(),
                s.message()
            ))
        }
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Ok(Ok(r)) => Ok(r.into_inner().services),
    }
}

/// Validates a hook registration.
///
/// # Errors
/// `InvalidArgument` naming every bad field.
pub fn check_registration(
    name: &str,
    endpoint: &str,
    timeout: Option<Duration>,
) -> Result<Duration> {
    let mut v = Violations::new();
    validate::dns_label(&mut v, "name", name);
    let ok = endpoint
        .parse::<tonic::codegen::http::Uri>()
        .ok()
        .is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
        });
    if !ok {
        v.add(
            "endpoint",
            "must be an http(s) URL, e.g. http://127.0.0.1:9000",
        );
    }
    let timeout = timeout.unwrap_or(DEFAULT_HOOK_TIMEOUT);
    if timeout.is_zero() || timeout > MAX_HOOK_TIMEOUT {
        v.add(
            "timeout",
            format!("must be between 1ms and {}s", MAX_HOOK_TIMEOUT.as_secs()),
        );
    }
    v.into_result().map_err(Error::from)?;
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_on_every_given_field() {
        let dc = DatacenterInfo {
            provider_name: "kubernetes".into(),
            region: "eu".into(),
            zone: "eu-1".into(),
            labels: [("env".to_string(), "prod".to_string())].into(),
            ..Default::default()
        };
        assert!(Selector::default().matches(&dc));
        let mut s = Selector {
            provider: "kubernetes".into(),
            ..Default::default()
        };
        assert!(s.matches(&dc));
        s.labels.insert("env".into(), "prod".into());
        assert!(s.matches(&dc));
        s.labels.insert("team".into(), "x".into());
        assert!(!s.matches(&dc));
        let docker = Selector {
            provider: "docker".into(),
            ..Default::default()
        };
        assert!(!docker.matches(&dc));
        assert_eq!(docker.describe(), "provider=docker");
    }

    #[test]
    fn the_example_rules_file_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/examples/hooks/rules.json");
        let f = HooksFile::load(&path).unwrap();
        let names: Vec<&str> = f.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["node-agent", "cert-manager"]);
        let process = DatacenterInfo {
            provider_name: "process".into(),
            ..Default::default()
        };
        assert!(f.rules[0].selector.matches(&process) && !f.rules[1].selector.matches(&process));
    }

    #[test]
    fn hooks_files_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hooks.json");
        std::fs::write(
            &p,
            r#"{"rules":[{"name":"certs","selector":{"provider":"kubernetes"},
                "services":[{"name":"cert-manager","services":[{"name":"main","command":["cm"]}]}]}],
               "remote":[{"name":"inv","endpoint":"http://127.0.0.1:9","timeout":"2s"}]}"#,
        )
        .unwrap();
        let f = HooksFile::load(&p).unwrap();
        assert_eq!(f.rules[0].services[0].name, "cert-manager");
        std::fs::write(
            &p,
            r#"{"rules":[{"name":"Bad Name","services":[{"name":"x","services":[]}]}],"remote":[{"name":"Bad Name","endpoint":"x","timeout":"soon"}]}"#,
        )
        .unwrap();
        let err = HooksFile::load(&p).unwrap_err();
        for want in [
            "rules[0].name",
            "rules[0].services[0].services",
            "remote[0].name",
            "remote[0].timeout",
        ] {
            assert!(err.contains(want), "{want} missing: {err}");
        }
        std::fs::write(&p, r#"{"rulez":[]}"#).unwrap();
        assert!(HooksFile::load(&p).unwrap_err().contains("unknown field"));
    }
}
