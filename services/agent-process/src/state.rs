//! The state directory: where instance records and instance files live.
//!
//! Layout under `CP_STATE_DIR`:
//! - `identity.json`, `join-key`: the agent's join identity
//!   (`ctrlplane_agent::join`);
//! - `records/<instance_id>.json`: the [`InstanceRecord`] of each instance;
//! - `instances/<instance_id>/`: the instance root — the working directory
//!   of its processes, its config files, `volumes/`, `logs/` and `.run/`
//!   (the pipes its processes write their output to);
//! - `secrets/<key>`: values of secrets services refer to.
//!
//! Invariants: a record is written before its instance root is created and
//! removed after the root is gone, so the record is what makes an instance
//! exist; records are replaced atomically (temp file + rename), so a crash
//! leaves the old or the new version, never a torn one.

use std::io;
use std::path::{Path, PathBuf};

use crate::model::InstanceRecord;

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating) the state directory. The path is made absolute, so
    /// the paths handed to processes stay valid whatever their cwd.
    ///
    /// # Errors
    /// The directories cannot be created.
    pub fn open(dir: &Path) -> io::Result<Store> {
        std::fs::create_dir_all(dir)?;
        let dir = std::fs::canonicalize(dir)?;
        for sub in ["records", "instances", "secrets"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        Ok(Store { dir })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The root directory of an instance.
    pub fn instance_root(&self, id: &str) -> PathBuf {
        self.dir.join("instances").join(id)
    }

    /// Where secret values are looked up.
    pub fn secrets_dir(&self) -> PathBuf {
        self.dir.join("secrets")
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join("records").join(format!("{id}.json"))
    }

    /// Every readable record; unreadable ones are logged and skipped (their
    /// files are left for an operator to inspect).
    pub fn load_all(&self) -> Vec<InstanceRecord> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("records")) else {
            return out;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(rec) => out.push(rec),
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "skipping unreadable instance record");
                }
            }
        }
        out.sort_by(|a: &InstanceRecord, b| a.instance_id.cmp(&b.instance_id));
        out
    }

    /// Writes a record atomically.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&self, rec: &InstanceRecord) -> io::Result<()> {
        let path = self.record_path(&rec.instance_id);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(rec).map_err(io::Error::other)?;
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    }

    /// Removes a record (missing is fine).
    ///
    /// # Errors
    /// The file exists but cannot be removed.
    pub fn remove(&self, id: &str) -> io::Result<()> {
        match std::fs::remove_file(self.record_path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes an instance root and everything in it (missing is fine).
    ///
    /// # Errors
    /// Something in it cannot be removed.
    pub fn remove_root(&self, id: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.instance_root(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Desired, RunRecord};

    fn record(id: &str) -> InstanceRecord {
        InstanceRecord {
            instance_id: id.to_string(),
            tenant_id: "t".to_string(),
            name: "n".to_string(),
            kind: 1,
            labels: Default::default(),
            created_at_ms: 1,
            services: vec![ctrlplane_proto::provider::v1::ServiceSpec {
                name: "main".to_string(),
                command: vec!["/bin/true".to_string()],
                ..Default::default()
            }],
            desired: Desired::Running,
            deleting: false,
            run: RunRecord::default(),
            replicas: Default::default(),
            ports: Default::default(),
            release: "initial".to_string(),
            releases: Vec::new(),
        }
    }

    #[test]
    fn records_round_trip_and_corrupt_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.save(&record("b")).unwrap();
        store.save(&record("a")).unwrap();
        std::fs::write(dir.path().join("records/bad.json"), "{").unwrap();
        let all = store.load_all();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], record("a"));
        store.remove("a").unwrap();
        store.remove("a").unwrap();
        assert_eq!(store.load_all().len(), 1);
        assert!(store.instance_root("x").starts_with(store.dir()));
    }
}
