//! The instance root and what a process finds in it: config files, secret
//! files, volume directories and its environment.
//!
//! Layout of `instances/<id>/` (the cwd of every process of the instance):
//! - config files and file secrets at the relative paths the specs give;
//! - `volumes/<name>` (deployments: shared by the replicas) or
//!   `volumes/<name>-<replica>` (stateful sets: one per replica), kept
//!   across Stop/Start, restarts and agent restarts, removed only by
//!   Deprovision. Processes cannot be given arbitrary mount points without
//!   containers, so a volume's `mount_path` is only recorded; the process
//!   finds the directory in `CP_VOLUME_<NAME>`;
//! - `logs/<service>-<replica>.log` and `.run/` (output pipes).
//!
//! The environment is deliberately not the agent's own: it would leak the
//! agent's secrets (`CP_AUTH_SECRET`, `CP_JOIN_TOKEN`). A process gets a
//! small allow-list of the agent's variables (PATH, HOME, locale, …), then
//! the spec's env and env secrets, then the agent's `CP_*` variables, which
//! win.
//!
//! Secrets are looked up as files `CP_STATE_DIR/secrets/<key>` (the agent
//! has no other secret store); one trailing newline is dropped.

use std::io;
use std::path::{Component, Path, PathBuf};

use ctrlplane_proto::provider::v1 as pb;

use crate::model::PortAlloc;
use crate::ports;

/// Variables passed through from the agent's environment.
pub const PASSED_THROUGH: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

/// PATH when the agent has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The log directory of an instance root.
pub fn logs_dir(root: &Path) -> PathBuf {
    root.join("logs")
}

/// The pipe directory of an instance root.
pub fn run_dir(root: &Path) -> PathBuf {
    root.join(".run")
}

/// The directory of a volume for a replica.
pub fn volume_dir(root: &Path, stateful: bool, name: &str, replica: u32) -> PathBuf {
    let dir = if stateful {
        format!("{name}-{replica}")
    } else {
        name.to_string()
    };
    root.join("volumes").join(dir)
}

/// The env variable naming a volume's directory.
pub fn volume_var(name: &str) -> String {
    format!("CP_VOLUME_{}", name.to_ascii_uppercase().replace('-', "_"))
}

/// Why a config-file path cannot be used by this agent.
pub fn relative_path_problem(path: &str) -> Option<&'static str> {
    let p = Path::new(path);
    if p.is_absolute() {
        Some(
            "must be a path relative to the instance root (the process agent has no container filesystem)",
        )
    } else if p.components().any(|c| c == Component::ParentDir) {
        Some("must not contain a '..' component")
    } else if p.components().all(|c| c == Component::CurDir) {
        Some("must name a file")
    } else {
        None
    }
}

/// Why a secret key cannot name a file under the secrets directory.
pub fn secret_key_problem(key: &str) -> Option<&'static str> {
    relative_path_problem(key).map(|_| {
        "must be a relative name without '..' (secrets are read from files under CP_STATE_DIR/secrets)"
    })
}

/// Reads a secret's value.
///
/// # Errors
/// A message naming the key and where it was looked for.
pub fn read_secret(secrets_dir: &Path, key: &str) -> Result<String, String> {
    if secret_key_problem(key).is_some() {
        return Err(format!("secret key {key:?} is not a valid file name"));
    }
    let path = secrets_dir.join(key);
    match std::fs::read_to_string(&path) {
        Ok(mut v) => {
            if v.ends_with('\n') {
                v.pop();
            }
            Ok(v)
        }
        Err(e) => Err(format!(
            "secret {key:?} not found: cannot read {}: {e}",
            path.display()
        )),
    }
}

fn write_file(root: &Path, rel: &str, content: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = root.join(rel);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, content)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
}

/// Writes every service's config files and file secrets under `root`.
///
/// # Errors
/// A message naming the file that could not be written or the secret that
/// could not be read.
pub fn write_files(
    root: &Path,
    secrets_dir: &Path,
    specs: &[pb::ServiceSpec],
) -> Result<(), String> {
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    for spec in specs {
        for file in &spec.config_files {
            write_file(root, &file.path, file.content.as_bytes(), 0o644).map_err(|e| {
                format!(
                    "service {:?}: cannot write config file {:?}: {e}",
                    spec.name, file.path
                )
            })?;
        }
        for secret in &spec.secrets {
            if secret.r#type != pb::SecretType::File as i32 {
                continue;
            }
            let value = read_secret(secrets_dir, &secret.key)
                .map_err(|e| format!("service {:?}: {e}", spec.name))?;
            let target = if secret.target.is_empty() {
                &secret.key
            } else {
                &secret.target
            };
            write_file(root, target, value.as_bytes(), 0o600).map_err(|e| {
                format!(
                    "service {:?}: cannot write secret file {target:?}: {e}",
                    spec.name
                )
            })?;
        }
    }
    Ok(())
}

/// Creates a replica's volume directories and returns `(name, path)` pairs.
///
/// # Errors
/// A directory cannot be created.
pub fn ensure_volumes(
    root: &Path,
    stateful: bool,
    spec: &pb::ServiceSpec,
    replica: u32,
) -> io::Result<Vec<(String, PathBuf)>> {
    spec.volumes
        .iter()
        .map(|v| {
            let dir = volume_dir(root, stateful, &v.name, replica);
            std::fs::create_dir_all(&dir)?;
            Ok((v.name.clone(), dir))
        })
        .collect()
}

/// The allow-listed part of the agent's environment.
pub fn base_env() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = PASSED_THROUGH
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    if !out.iter().any(|(k, _)| k == "PATH") {
        out.push(("PATH".to_string(), DEFAULT_PATH.to_string()));
    }
    out
}

/// What identifies a process within its instance.
#[derive(Debug, Clone)]
pub struct Identity<'a> {
    /// The instance id.
    pub instance_id: &'a str,
    /// The instance root.
    pub root: &'a Path,
    /// Replica index.
    pub replica: u32,
}

/// The full environment of a process of `spec`.
///
/// # Errors
/// An env secret that cannot be read.
pub fn process_env(
    base: &[(String, String)],
    who: &Identity<'_>,
    spec: &pb::ServiceSpec,
    allocs: &[PortAlloc],
    volumes: &[(String, PathBuf)],
    secrets_dir: &Path,
) -> Result<Vec<(String, String)>, String> {
    let mut env: std::collections::BTreeMap<String, String> = base.iter().cloned().collect();
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    for secret in &spec.secrets {
        if secret.r#type == pb::SecretType::File as i32 {
            continue;
        }
        let name = if secret.target.is_empty() {
            &secret.key
        } else {
            &secret.target
        };
        env.insert(name.clone(), read_secret(secrets_dir, &secret.key)?);
    }
    env.insert("CP_INSTANCE_ID".to_string(), who.instance_id.to_string());
    env.insert("CP_SERVICE_NAME".to_string(), spec.name.clone());
    env.insert("CP_REPLICA".to_string(), who.replica.to_string());
    env.insert(
        "CP_INSTANCE_ROOT".to_string(),
        who.root.display().to_string(),
    );
    env.extend(ports::env(allocs));
    for (name, dir) in volumes {
        env.insert(volume_var(name), dir.display().to_string());
    }
    Ok(env.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_stay_inside_the_root() {
        assert!(relative_path_problem("conf/app.yaml").is_none());
        assert!(relative_path_problem("/etc/passwd").is_some());
        assert!(relative_path_problem("a/../../x").is_some());
        assert!(relative_path_problem(".").is_some());
        assert!(secret_key_problem("db/password").is_none());
        assert!(secret_key_problem("../x").is_some());
    }

    #[test]
    fn files_volumes_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let secrets = dir.path().join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::write(secrets.join("token"), "s3cret\n").unwrap();
        let spec = pb::ServiceSpec {
            name: "web".to_string(),
            env: [
                ("A".to_string(), "1".to_string()),
                ("CP_REPLICA".to_string(), "x".to_string()),
            ]
            .into(),
            config_files: vec![pb::ConfigFile {
                name: "app".to_string(),
                path: "conf/app.yaml".to_string(),
                content: "k: v\n".to_string(),
                ..Default::default()
            }],
            secrets: vec![
                pb::SecretRef {
                    key: "token".to_string(),
                    ..Default::default()
                },
                pb::SecretRef {
                    key: "token".to_string(),
                    r#type: pb::SecretType::File as i32,
                    target: "secret/token".to_string(),
                },
            ],
            volumes: vec![pb::VolumeSpec {
                name: "data-dir".to_string(),
                mount_path: "/data".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        };
        write_files(&root, &secrets, std::slice::from_ref(&spec)).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("conf/app.yaml")).unwrap(),
            "k: v\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("secret/token")).unwrap(),
            "s3cret"
        );
        let vols = ensure_volumes(&root, true, &spec, 2).unwrap();
        assert!(root.join("volumes/data-dir-2").is_dir());
        let allocs = vec![PortAlloc {
            container: 80,
            host: 30080,
            protocol: 1,
            name: String::new(),
        }];
        let who = Identity {
            instance_id: "bws_1",
            root: &root,
            replica: 2,
        };
        let env = process_env(&base_env(), &who, &spec, &allocs, &vols, &secrets).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("A"), Some("1"));
        assert_eq!(get("token"), Some("s3cret"));
        assert_eq!(get("CP_REPLICA"), Some("2"), "the agent's variables win");
        assert_eq!(get("CP_INSTANCE_ID"), Some("bws_1"));
        assert_eq!(get("CP_PORT_80"), Some("30080"));
        assert_eq!(get("PORT"), Some("30080"));
        assert!(
            get("CP_VOLUME_DATA_DIR")
                .unwrap()
                .ends_with("volumes/data-dir-2")
        );
        assert!(get("PATH").is_some());
        let missing = pb::ServiceSpec {
            secrets: vec![pb::SecretRef {
                key: "nope".to_string(),
                ..Default::default()
            }],
            ..spec
        };
        let err = process_env(&[], &who, &missing, &[], &[], &secrets).unwrap_err();
        assert!(err.contains("nope"), "{err}");
    }
}
