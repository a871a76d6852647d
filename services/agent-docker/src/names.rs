//! How the agent names and labels what it creates. Every object carries the
//! labels below, so the agent finds its workloads again after a restart
//! from the engine alone (it keeps no records of its own).
//!
//! Names (scope `ctrlplane` by default):
//! - network `SCOPE.INSTANCE`;
//! - container `SCOPE.INSTANCE.SERVICE.REPLICA`; the previous generation
//!   of a replica, kept after a Deploy for its logs and for Rollback, gets
//!   the suffix `.prev`;
//! - volume `SCOPE.INSTANCE.SERVICE.VOLUME`, with `.REPLICA` appended for
//!   `stateful_set` workloads (a volume per replica).

/// Label: the agent that created the object (always [`AGENT_VALUE`]).
/// Not `ctrlplane.io/managed-by`: that one is the caller's (the bootstrap
/// service labels its workloads `managed-by=bootstrap`), kept as given.
pub const AGENT: &str = "ctrlplane.io/agent";
/// Value of [`AGENT`].
pub const AGENT_VALUE: &str = "ctrlplane-agent-docker";
/// Label: the agent's scope.
pub const SCOPE: &str = "ctrlplane.io/scope";
/// Label: instance id.
pub const INSTANCE: &str = "ctrlplane.io/instance";
/// Label: tenant id.
pub const TENANT: &str = "ctrlplane.io/tenant";
/// Label: the instance's name.
pub const NAME: &str = "ctrlplane.io/name";
/// Label: `deployment` or `stateful_set`.
pub const KIND: &str = "ctrlplane.io/kind";
/// Label (network): the request's labels as JSON, for ListManaged.
pub const REQUEST_LABELS: &str = "ctrlplane.io/labels";
/// Label: service name.
pub const SERVICE: &str = "ctrlplane.io/service";
/// Label: `init`, `main` or `sidecar`.
pub const ROLE: &str = "ctrlplane.io/role";
/// Label: replica index.
pub const REPLICA: &str = "ctrlplane.io/replica";
/// Label (container): the service spec the container was created from,
/// as proto JSON.
pub const SPEC: &str = "ctrlplane.io/spec";
/// Label (container): hash of [`SPEC`].
pub const SPEC_HASH: &str = "ctrlplane.io/spec-hash";
/// Label (container): the release the container belongs to.
pub const RELEASE: &str = "ctrlplane.io/release";
/// Release of containers created by Provision.
pub const INITIAL_RELEASE: &str = "initial";
/// Name suffix of a replica's previous generation.
pub const PREV_SUFFIX: &str = ".prev";

/// Object names of one agent scope.
#[derive(Debug, Clone)]
pub struct Names {
    scope: String,
}

impl Names {
    /// Names in `scope`.
    pub fn new(scope: impl Into<String>) -> Self {
        Names {
            scope: scope.into(),
        }
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The instance's network.
    pub fn network(&self, instance: &str) -> String {
        format!("{}.{instance}", self.scope)
    }

    /// A replica's container.
    pub fn container(&self, instance: &str, service: &str, replica: u32) -> String {
        format!("{}.{instance}.{service}.{replica}", self.scope)
    }

    /// A replica's previous generation.
    pub fn prev_container(&self, instance: &str, service: &str, replica: u32) -> String {
        format!(
            "{}{PREV_SUFFIX}",
            self.container(instance, service, replica)
        )
    }

    /// A volume: shared by the replicas, or per replica (`Some`).
    pub fn volume(
        &self,
        instance: &str,
        service: &str,
        volume: &str,
        replica: Option<u32>,
    ) -> String {
        match replica {
            Some(r) => format!("{}.{instance}.{service}.{volume}.{r}", self.scope),
            None => format!("{}.{instance}.{service}.{volume}", self.scope),
        }
    }

    /// Label filters selecting every object of this scope (`key=value`).
    pub fn scope_filter(&self) -> Vec<String> {
        vec![
            format!("{AGENT}={AGENT_VALUE}"),
            format!("{SCOPE}={}", self.scope),
        ]
    }

    /// Label filters selecting the objects of one instance.
    pub fn instance_filter(&self, instance: &str) -> Vec<String> {
        let mut f = self.scope_filter();
        f.push(format!("{INSTANCE}={instance}"));
        f
    }
}

/// Whether a container name (as the engine reports it, maybe with a
/// leading `/`) is a previous generation.
pub fn is_prev(container_name: &str) -> bool {
    container_name.ends_with(PREV_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_derived_from_scope_instance_service_and_replica() {
        let n = Names::new("ctrlplane");
        assert_eq!(n.network("wl_1"), "ctrlplane.wl_1");
        assert_eq!(n.container("wl_1", "main", 2), "ctrlplane.wl_1.main.2");
        assert_eq!(
            n.prev_container("wl_1", "main", 2),
            "ctrlplane.wl_1.main.2.prev"
        );
        assert!(is_prev("/ctrlplane.wl_1.main.2.prev"));
        assert!(!is_prev("/ctrlplane.wl_1.main.2"));
        assert_eq!(
            n.volume("wl_1", "db", "data", Some(1)),
            "ctrlplane.wl_1.db.data.1"
        );
        assert_eq!(
            n.volume("wl_1", "db", "data", None),
            "ctrlplane.wl_1.db.data"
        );
        assert_eq!(
            n.instance_filter("wl_1"),
            vec![
                "ctrlplane.io/agent=ctrlplane-agent-docker",
                "ctrlplane.io/scope=ctrlplane",
                "ctrlplane.io/instance=wl_1"
            ]
        );
    }
}
