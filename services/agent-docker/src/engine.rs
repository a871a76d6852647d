//! The engine connection and the Docker calls the provider is built from,
//! with engine errors mapped to [`ProviderError`]s in one place.
//!
//! The client is created lazily and the API version negotiated on first
//! use, so an agent started before its engine (or with a wrong
//! `CP_DOCKER_HOST`) runs, reports itself unhealthy, and answers every
//! backend call `UNAVAILABLE` naming the address — never a panic.

use std::collections::HashMap;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerInspectResponse, ContainerSummary};
use bollard::query_parameters::{
    CreateImageOptionsBuilder, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
    StopContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use ctrlplane_agent::ProviderError;
use futures::StreamExt;
use tokio::sync::Mutex;

/// A lazily connected engine.
pub struct Engine {
    host: String,
    client: Mutex<Option<Docker>>,
}

/// Result alias.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// Whether an engine error is a 404.
pub fn is_not_found(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Whether an engine error is a 409 (conflict: name in use, already
/// removing…).
pub fn is_conflict(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// Whether an engine error is a 304 (already started / already stopped).
pub fn is_not_modified(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 304,
            ..
        }
    )
}

impl Engine {
    /// An engine at `host` (not connected yet).
    pub fn new(host: impl Into<String>) -> Self {
        Engine {
            host: host.into(),
            client: Mutex::new(None),
        }
    }

    /// The engine address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Maps an engine error of `what` to a provider error.
    pub fn err(&self, what: &str, e: DockerError) -> ProviderError {
        match &e {
            DockerError::DockerResponseServerError {
                status_code,
                message,
            } => match status_code {
                404 => ProviderError::NotFound(format!("{what}: {message}")),
                409 => ProviderError::FailedPrecondition(format!("{what}: {message}")),
                400 => ProviderError::FailedPrecondition(format!("{what}: {message}")),
                _ => ProviderError::Internal(format!(
                    "{what}: the Docker engine answered {status_code}: {message}"
                )),
            },
            DockerError::RequestTimeoutError => ProviderError::DeadlineExceeded(format!(
                "{what}: the Docker engine at {} did not answer in time",
                self.host
            )),
            DockerError::SocketNotFoundError(_)
            | DockerError::IOError { .. }
            | DockerError::HyperResponseError { .. }
            | DockerError::HyperLegacyError { .. } => ProviderError::Unavailable(format!(
                "{what}: no Docker engine at {}: {e}",
                self.host
            )),
            _ => ProviderError::Internal(format!("{what}: {e}")),
        }
    }

    /// The client, connecting and negotiating the API version first if
    /// needed.
    ///
    /// # Errors
    /// `UNAVAILABLE` naming the engine address when it cannot be reached.
    pub async fn client(&self) -> Result<Docker> {
        let mut guard = self.client.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let unavailable = |e: &dyn std::fmt::Display| {
            ProviderError::Unavailable(format!("no Docker engine at {}: {e}", self.host))
        };
        let docker = if let Some(path) = self.host.strip_prefix("unix://") {
            if !std::path::Path::new(path).exists() {
                return Err(unavailable(&format!("{path} does not exist")));
            }
            Docker::connect_with_unix(&self.host, 120, bollard::API_DEFAULT_VERSION)
        } else {
            let addr = self.host.replacen("tcp://", "http://", 1);
            Docker::connect_with_http(&addr, 120, bollard::API_DEFAULT_VERSION)
        }
        .map_err(|e| unavailable(&e))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| unavailable(&e))?;
        *guard = Some(docker.clone());
        Ok(docker)
    }

    /// The engine's version (for GetInfo and health).
    ///
    /// # Errors
    /// The engine is unreachable.
    pub async fn version(&self) -> Result<String> {
        let d = self.client().await?;
        let v = d.version().await.map_err(|e| self.err("version", e))?;
        Ok(format!(
            "Docker Engine {} (API {})",
            v.version.unwrap_or_default(),
            v.api_version.unwrap_or_default()
        ))
    }

    /// Containers (running or not) matching every `label=value` filter.
    ///
    /// # Errors
    /// Engine errors.
    pub async fn containers(&self, labels: &[String]) -> Result<Vec<ContainerSummary>> {
        let d = self.client().await?;
        let filters = HashMap::from([("label", labels.to_vec())]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        d.list_containers(Some(opts))
            .await
            .map_err(|e| self.err("list containers", e))
    }

    /// Inspects a container; `None` when it does not exist.
    ///
    /// # Errors
    /// Engine errors other than 404.
    pub async fn inspect(&self, name: &str) -> Result<Option<ContainerInspectResponse>> {
        let d = self.client().await?;
        match d.inspect_container(name, None).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.err(&format!("inspect container {name}"), e)),
        }
    }

    /// Networks matching every `label=value` filter: (name, labels,
    /// created).
    ///
    /// # Errors
    /// Engine errors.
    pub async fn networks(&self, labels: &[String]) -> Result<Vec<NetworkInfo>> {
        let d = self.client().await?;
        let filters = HashMap::from([("label", labels.to_vec())]);
        let opts = ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let nets = d
            .list_networks(Some(opts))
            .await
            .map_err(|e| self.err("list networks", e))?;
        Ok(nets
            .into_iter()
            .map(|n| NetworkInfo {
                name: n.name.unwrap_or_default(),
                labels: n.labels.unwrap_or_default(),
                created: n.created.map(|c| c.to_string()),
            })
            .collect())
    }

    /// Names of the volumes matching every `label=value` filter.
    ///
    /// # Errors
    /// Engine errors.
    pub async fn volumes(&self, labels: &[String]) -> Result<Vec<String>> {
        let d = self.client().await?;
        let filters = HashMap::from([("label", labels.to_vec())]);
        let opts = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let r = d
            .list_volumes(Some(opts))
            .await
            .map_err(|e| self.err("list volumes", e))?;
        Ok(r.volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect())
    }

    /// Makes sure `image` is present, pulling it when it is not.
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` naming the image when it is missing and the
    /// pull fails (no registry, unknown image, no access).
    pub async fn ensure_image(&self, image: &str) -> Result<()> {
        let d = self.client().await?;
        match d.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(self.err(&format!("inspect image {image}"), e)),
        }
        tracing::info!(image, "image not present; pulling it");
        let opts = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut pull = d.create_image(Some(opts), None, None);
        while let Some(item) = pull.next().await {
            match item {
                Ok(info) => {
                    if let Some(err) = info.error_detail.and_then(|d| d.message) {
                        return Err(pull_failed(image, &err));
                    }
                }
                Err(e) => return Err(pull_failed(image, &e.to_string())),
            }
        }
        match d.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(e) => Err(pull_failed(image, &e.to_string())),
        }
    }

    /// Stops a container (SIGTERM, SIGKILL after `grace_secs`); a stopped
    /// or missing container is fine.
    ///
    /// # Errors
    /// Other engine errors.
    pub async fn stop(&self, name: &str, grace_secs: i32) -> Result<()> {
        let d = self.client().await?;
        let opts = StopContainerOptionsBuilder::default().t(grace_secs).build();
        match d.stop_container(name, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) || is_not_modified(&e) => Ok(()),
            Err(e) => Err(self.err(&format!("stop container {name}"), e)),
        }
    }

    /// Starts a container; an already running one is fine.
    ///
    /// # Errors
    /// Engine errors (a port already in use, a missing container…).
    pub async fn start(&self, name: &str) -> Result<()> {
        let d = self.client().await?;
        match d.start_container(name, None).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_modified(&e) => Ok(()),
            Err(e) => Err(self.err(&format!("start container {name}"), e)),
        }
    }

    /// Removes a container and its anonymous volumes, running or not; a
    /// missing one is fine.
    ///
    /// # Errors
    /// Other engine errors.
    pub async fn remove(&self, name: &str) -> Result<()> {
        let d = self.client().await?;
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match d.remove_container(name, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // Already being removed (a concurrent Deprovision).
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(self.err(&format!("remove container {name}"), e)),
        }
    }

    /// Removes a volume; a missing one is fine.
    ///
    /// # Errors
    /// Other engine errors.
    pub async fn remove_volume(&self, name: &str) -> Result<()> {
        let d = self.client().await?;
        let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
        match d.remove_volume(name, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.err(&format!("remove volume {name}"), e)),
        }
    }

    /// Removes a network; a missing one is fine.
    ///
    /// # Errors
    /// Other engine errors.
    pub async fn remove_network(&self, name: &str) -> Result<()> {
        let d = self.client().await?;
        match d.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.err(&format!("remove network {name}"), e)),
        }
    }

    /// Writes files into a (created, not necessarily started) container:
    /// `(absolute path, content)` pairs.
    ///
    /// # Errors
    /// Engine errors.
    pub async fn put_files(&self, container: &str, files: &[(String, Vec<u8>)]) -> Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let d = self.client().await?;
        let tar = tar_of(files).map_err(|e| ProviderError::Internal(format!("build tar: {e}")))?;
        let opts = UploadToContainerOptionsBuilder::default().path("/").build();
        d.upload_to_container(container, Some(opts), bollard::body_full(tar.into()))
            .await
            .map_err(|e| self.err(&format!("write files into {container}"), e))
    }
}

/// A network as listed.
#[derive(Debug, Clone)]
pub struct NetworkInfo {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// Creation time as the engine reports it.
    pub created: Option<String>,
}

fn pull_failed(image: &str, why: &str) -> ProviderError {
    ProviderError::FailedPrecondition(format!(
        "image {image:?} is not on the Docker engine and pulling it failed: {why} \
         (build or load the image on the engine, or make its registry reachable)"
    ))
}

/// A tar archive of `(absolute path, content)` files with their parent
/// directories, paths relative to `/`.
fn tar_of(files: &[(String, Vec<u8>)]) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for (path, _) in files {
        let rel = path.trim_start_matches('/');
        let mut p = std::path::Path::new(rel).parent();
        while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(dir.to_path_buf());
            p = dir.parent();
        }
    }
    for dir in dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, &dir, std::io::empty())?;
    }
    for (path, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(content.len() as u64);
        b.append_data(&mut h, path.trim_start_matches('/'), content.as_slice())?;
    }
    b.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_holds_the_files_and_their_directories() {
        let tar = tar_of(&[
            ("/conf/app.yaml".to_string(), b"a: 1\n".to_vec()),
            ("/etc/x/y/z.txt".to_string(), b"z".to_vec()),
        ])
        .unwrap();
        let mut a = tar::Archive::new(tar.as_slice());
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            vec![
                "conf",
                "etc",
                "etc/x",
                "etc/x/y",
                "conf/app.yaml",
                "etc/x/y/z.txt"
            ]
        );
    }

    #[tokio::test]
    async fn a_missing_engine_is_unavailable_naming_the_address() {
        let e = Engine::new("unix:///nonexistent/docker.sock");
        let err = e.client().await.unwrap_err();
        assert!(matches!(err, ProviderError::Unavailable(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("no Docker engine at unix:///nonexistent/docker.sock"),
            "{err}"
        );
        let e = Engine::new("tcp://127.0.0.1:9");
        let err = e.client().await.unwrap_err();
        assert!(matches!(err, ProviderError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("tcp://127.0.0.1:9"), "{err}");
    }
}
