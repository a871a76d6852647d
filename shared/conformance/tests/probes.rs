//! The kit's own probes against the real test app (no agent involved):
//! `testapp_path` finds the binary, `http_get` sees its 200, and
//! `wait_port_closed` notices when it is gone.

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};

use ctrlplane_conformance::kit::{http_get, wait_http_ok, wait_port_closed};
use ctrlplane_conformance::testapp_path;

#[tokio::test]
async fn probes_see_the_testapp_serve_and_go_away() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(testapp_path())
        .arg("serve")
        .env("CP_PORT_8080", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the testapp");
    wait_http_ok("127.0.0.1", port).await;
    let resp = http_get("127.0.0.1", port, "/healthz").await.unwrap();
    assert!(resp.ends_with("ok"), "{resp:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    wait_port_closed("127.0.0.1", port).await;
    assert!(http_get("127.0.0.1", port, "/").await.is_err());
}
