//! Host ports: one per declared port per replica, handed to the process in
//! its environment and reported as endpoints.
//!
//! A declared `host` port is used as given. Otherwise the kernel picks a free
//! one (bind to port 0, note the number, close); the agent also skips ports
//! it has already handed out, since a stopped replica keeps its ports for
//! its next start. The process learns its ports from
//! `CP_PORT_<container>=<host>` and `PORT=<host port of the first port>`.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};

use ctrlplane_proto::provider::v1 as pb;

use crate::model::{PortAlloc, ReplicaKey};

/// Host address endpoints are reported with.
pub const ENDPOINT_HOST: &str = "127.0.0.1";

fn udp(protocol: i32) -> bool {
    protocol == pb::PortProtocol::Udp as i32
}

/// Picks host ports for `ports`, avoiding `taken` (and adding the picks to
/// it).
///
/// # Errors
/// No free port could be bound.
pub fn allocate(ports: &[pb::PortSpec], taken: &mut HashSet<i32>) -> io::Result<Vec<PortAlloc>> {
    let mut out = Vec::with_capacity(ports.len());
    // Keep the probe sockets open until every port is picked, so one call
    // never hands out the same port twice.
    let mut holders: Vec<Box<dyn std::any::Any>> = Vec::new();
    for port in ports {
        let host = if port.host != 0 {
            port.host
        } else {
            let mut picked = None;
            for _ in 0..64 {
                let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
                let (p, holder): (u16, Box<dyn std::any::Any>) = if udp(port.protocol) {
                    let s = UdpSocket::bind(any)?;
                    (s.local_addr()?.port(), Box::new(s))
                } else {
                    let s = TcpListener::bind(any)?;
                    (s.local_addr()?.port(), Box::new(s))
                };
                holders.push(holder);
                if !taken.contains(&i32::from(p)) {
                    picked = Some(i32::from(p));
                    break;
                }
            }
            picked.ok_or_else(|| io::Error::other("no free host port found"))?
        };
        taken.insert(host);
        out.push(PortAlloc {
            container: port.container,
            host,
            protocol: if port.protocol == 0 {
                pb::PortProtocol::Tcp as i32
            } else {
                port.protocol
            },
            name: port.name.clone(),
        });
    }
    Ok(out)
}

/// The environment variables describing a replica's ports.
pub fn env(allocs: &[PortAlloc]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = allocs
        .iter()
        .map(|a| (format!("CP_PORT_{}", a.container), a.host.to_string()))
        .collect();
    if let Some(first) = allocs.first() {
        out.push(("PORT".to_string(), first.host.to_string()));
    }
    out
}

/// The host port a replica listens on for a container port (the port
/// itself when it is not declared).
pub fn host_port(allocs: &[PortAlloc], container: i32) -> i32 {
    allocs
        .iter()
        .find(|a| a.container == container && !udp(a.protocol))
        .or_else(|| allocs.iter().find(|a| a.container == container))
        .map_or(container, |a| a.host)
}

/// The endpoints of one replica.
pub fn endpoints(key: &ReplicaKey, allocs: &[PortAlloc]) -> Vec<pb::Endpoint> {
    allocs
        .iter()
        .map(|a| pb::Endpoint {
            service_name: key.service.clone(),
            port_name: if a.name.is_empty() {
                a.container.to_string()
            } else {
                a.name.clone()
            },
            protocol: a.protocol,
            host: ENDPOINT_HOST.to_string(),
            port: a.host,
            container_port: a.container,
            replica: key.replica as i32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_distinct_free_ports_and_keeps_fixed_ones() {
        let specs = vec![
            pb::PortSpec {
                container: 8080,
                ..Default::default()
            },
            pb::PortSpec {
                container: 53,
                protocol: pb::PortProtocol::Udp as i32,
                ..Default::default()
            },
            pb::PortSpec {
                container: 9000,
                host: 19000,
                name: "admin".to_string(),
                ..Default::default()
            },
        ];
        let mut taken = HashSet::new();
        let a = allocate(&specs, &mut taken).unwrap();
        let b = allocate(&specs, &mut taken).unwrap();
        assert_ne!(a[0].host, 0);
        assert_ne!(a[0].host, b[0].host);
        assert_eq!(a[2].host, 19000);
        assert_eq!(a[0].protocol, pb::PortProtocol::Tcp as i32);
        let env = env(&a);
        assert!(env.contains(&("CP_PORT_8080".to_string(), a[0].host.to_string())));
        assert!(env.contains(&("PORT".to_string(), a[0].host.to_string())));
        assert_eq!(host_port(&a, 9000), 19000);
        assert_eq!(host_port(&a, 7), 7);
        let eps = endpoints(&ReplicaKey::new("web", 1), &a);
        assert_eq!(eps[2].port_name, "admin");
        assert_eq!(eps[0].port_name, "8080");
        assert_eq!(eps[0].replica, 1);
    }
}
