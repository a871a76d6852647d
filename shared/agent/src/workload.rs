//! Facts about a workload's services every agent reads the same way:
//! roles, replica counts, start order, and the HTTP/TCP readiness probes.

use std::time::Duration;

use ctrlplane_proto::provider::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A service's role with UNSPECIFIED read as MAIN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Runs to completion before the others.
    Init,
    /// The workload's main service.
    Main,
    /// Runs next to main.
    Sidecar,
}

/// The role of a spec.
pub fn role(spec: &pb::ServiceSpec) -> Role {
    match pb::ServiceRole::try_from(spec.role) {
        Ok(pb::ServiceRole::Init) => Role::Init,
        Ok(pb::ServiceRole::Sidecar) => Role::Sidecar,
        _ => Role::Main,
    }
}

/// Desired replicas of a service (0 means 1; inits always run once).
pub fn replicas(spec: &pb::ServiceSpec) -> u32 {
    if role(spec) == Role::Init {
        return 1;
    }
    spec.resources
        .as_ref()
        .map_or(1, |r| r.replicas.max(1) as u32)
}

/// Indexes of the services `keep` selects, ordered so that every service
/// comes after the services it depends on; ties keep list order. Specs are
/// validated acyclic; a cycle would only leave its members in list order.
pub fn dependency_order(
    specs: &[pb::ServiceSpec],
    keep: impl Fn(&pb::ServiceSpec) -> bool,
) -> Vec<usize> {
    let selected: Vec<usize> = (0..specs.len()).filter(|&i| keep(&specs[i])).collect();
    let mut placed: Vec<usize> = Vec::with_capacity(selected.len());
    let mut remaining = selected.clone();
    while !remaining.is_empty() {
        let ready = remaining.iter().position(|&i| {
            specs[i].depends_on.iter().all(|dep| {
                !selected.iter().any(|&j| specs[j].name == *dep)
                    || placed.iter().any(|&j| specs[j].name == *dep)
            })
        });
        // A cycle (never after validation): place the first one anyway.
        let at = ready.unwrap_or(0);
        placed.push(remaining.remove(at));
    }
    placed
}

/// Applies what a Deploy changes of one service: the image (when given),
/// the whole env, the health check (when given), command and args (when
/// non-empty).
pub fn apply_deploy(spec: &mut pb::ServiceSpec, d: &pb::DeployService) {
    if !d.image.is_empty() {
        spec.image = d.image.clone();
    }
    spec.env = d.env.clone();
    if d.health_check.is_some() {
        spec.health_check = d.health_check.clone();
    }
    if !d.command.is_empty() {
        spec.command = d.command.clone();
    }
    if !d.args.is_empty() {
        spec.args = d.args.clone();
    }
}

/// Keeps, of `items` in order, the last `tail` of each stream (0 = all):
/// StreamLogs' `tail` counts stdout and stderr lines separately.
pub fn keep_tail<T, S: PartialEq>(items: &mut Vec<T>, tail: usize, stream_of: impl Fn(&T) -> S) {
    if tail == 0 {
        return;
    }
    let mut seen: Vec<(S, usize)> = Vec::new();
    let mut keep = vec![false; items.len()];
    for (i, item) in items.iter().enumerate().rev() {
        let s = stream_of(item);
        let n = match seen.iter_mut().find(|(k, _)| *k == s) {
            Some((_, n)) => n,
            None => {
                seen.push((s, 0));
                &mut seen.last_mut().expect("just pushed").1
            }
        };
        if *n < tail {
            *n += 1;
            keep[i] = true;
        }
    }
    let mut flags = keep.into_iter();
    items.retain(|_| flags.next().unwrap_or(false));
}

/// Whether `GET path` on `host:port` answers 2xx or 3xx within `timeout`.
pub async fn http_ok(host: &str, port: u16, path: &str, timeout: Duration) -> bool {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await?;
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: ctrlplane-agent\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut buf = Vec::with_capacity(256);
        let mut chunk = [0u8; 256];
        while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&buf);
        let code: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok::<bool, std::io::Error>((200..400).contains(&code))
    };
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(true)))
}

/// Whether a TCP connection to `host:port` opens within `timeout`.
pub async fn tcp_ok(host: &str, port: u16, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines_of_each_stream_in_order() {
        let mut v = vec![(1, 'o'), (2, 'e'), (3, 'o'), (4, 'o'), (5, 'e'), (6, 'o')];
        keep_tail(&mut v, 2, |x| x.1);
        assert_eq!(v, vec![(2, 'e'), (4, 'o'), (5, 'e'), (6, 'o')]);
        let mut all = vec![(1, 'o')];
        keep_tail(&mut all, 0, |x| x.1);
        assert_eq!(all, vec![(1, 'o')]);
    }
}
