//! `ctrlplane up --demo` end to end, with the real binaries as child
//! processes: the demo's services reach running, the scheduler leads,
//! SIGTERM stops every service (exit 0), and a second `up` reuses the
//! secret, the agent's identity and the databases.
//!
//! The service binaries come from the target directory (`cargo build
//! --workspace`). When one is missing the test is skipped with a message —
//! unless `CI` is set, where that is a failure.
//!
//! Workloads of the process agent outlive the agent by design (they are
//! re-adopted by the next `up`); the test kills them at the end, found by
//! the `CP_INSTANCE_ROOT` under its data directory in their environment.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctrlplane");
const SERVICES: [&str; 4] = [
    "ctrlplane-datacenter",
    "ctrlplane-bootstrap",
    "ctrlplane-scheduler",
    "ctrlplane-agent-process",
];

fn missing_binaries() -> Vec<String> {
    let dir = Path::new(BIN).parent().unwrap();
    SERVICES
        .iter()
        .filter(|b| !dir.join(b).exists())
        .map(|b| b.to_string())
        .collect()
}

/// A base port whose four derived ports (base, +100, +200, +301) are free.
fn free_base() -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        drop(l);
        if !(20000..=65000).contains(&p) {
            continue;
        }
        if [0u16, 100, 200, 301]
            .iter()
            .all(|o| TcpListener::bind(("127.0.0.1", p + o)).is_ok())
        {
            return p;
        }
    }
    panic!("no free base port found");
}

/// Pids of processes whose environment mentions `needle`.
fn pids_with_env(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env
            .split(|b| *b == 0)
            .any(|kv| String::from_utf8_lossy(kv).contains(needle))
        {
            out.push(pid);
        }
    }
    out
}

/// Service processes of this data dir (they get `CP_DATA_DIR`/`CP_STATE_DIR`
/// = DIR or DIR/agent and `CP_AUTH_SECRET_FILE` = DIR/secret).
fn service_pids(dir: &Path) -> Vec<i32> {
    pids_with_env(&format!("CP_AUTH_SECRET_FILE={}/secret", dir.display()))
}

/// Workload processes started by the agent of this data dir.
fn workload_pids(dir: &Path) -> Vec<i32> {
    pids_with_env(&format!("CP_INSTANCE_ROOT={}/agent/", dir.display()))
}

fn sig(pid: i32, s: &str) {
    let _ = Command::new("kill")
        .args([s, "--", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

struct Up {
    child: Child,
    dir: PathBuf,
    out: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            sig(self.child.id() as i32, "-TERM");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for pid in service_pids(&self.dir) {
            sig(pid, "-KILL");
        }
    }
}

fn start(dir: &Path, config: &Path, base: u16, n: u32) -> Up {
    let out = dir.with_extension(format!("up{n}.out"));
    let f = std::fs::File::create(&out).unwrap();
    let child = Command::new(BIN)
        .args(["up", "--demo", "--data-dir"])
        .arg(dir)
        .args(["--base-port", &base.to_string(), "--start-timeout", "120s"])
        .env("CP_CONFIG", config)
        .env_remove("CP_TOKEN")
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    Up {
        child,
        dir: dir.to_path_buf(),
        out,
    }
}

fn cli(config: &Path, args: &[&str]) -> (bool, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("CP_CONFIG", config)
        .env_remove("CP_TOKEN")
        .env_remove("CP_DATACENTER_ADDR")
        .env_remove("CP_BOOTSTRAP_ADDR")
        .env_remove("CP_SCHEDULER_ADDR")
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn wait_for<T>(up: &mut Up, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if let Ok(Some(status)) = up.child.try_wait() {
            panic!(
                "`up` exited ({status}) while waiting for {what}:\n{}",
                std::fs::read_to_string(&up.out).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; up's output:\n{}",
            std::fs::read_to_string(&up.out).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Runs `up` until the demo runs; returns (demo datacenter id, agent id).
fn run_once(dir: &Path, config: &Path, base: u16, n: u32) -> (String, String) {
    let mut up = start(dir, config, base, n);
    let dc = wait_for(&mut up, "the demo datacenter", || {
        let (ok, text) = cli(config, &["dc", "get", "--slug", "demo", "-o", "json"]);
        if !ok {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["id"].as_str().map(str::to_string)
    });
    wait_for(&mut up, "the demo's services to run", || {
        let (ok, text) = cli(config, &["bootstrap", "list", "--datacenter", &dc]);
        let rows: Vec<&str> = text.lines().skip(1).collect();
        (ok && rows.len() >= 2 && rows.iter().all(|r| r.contains(" running "))).then_some(())
    });
    let (ok, workers) = cli(config, &["workers", "list"]);
    assert!(ok, "{workers}");
    assert!(workers.starts_with("Leader: this scheduler"), "{workers}");
    let agent = std::fs::read_to_string(dir.join("agent/identity.json")).unwrap();
    let agent: serde_json::Value = serde_json::from_str(&agent).unwrap();
    let agent = agent["agent_id"].as_str().unwrap().to_string();

    assert!(!service_pids(dir).is_empty(), "the services run");
    sig(up.child.id() as i32, "-TERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = up.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "`up` did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&up.out).unwrap();
    assert!(status.success(), "`up` exited with {status}:\n{output}");
    assert!(output.contains("stopping scheduler"), "{output}");
    let left = service_pids(dir);
    assert!(
        left.is_empty(),
        "service processes left behind: {left:?}\n{output}"
    );
    (dc, agent)
}

#[test]
fn up_demo_stops_cleanly_and_reuses_its_state() {
    let missing = missing_binaries();
    if !missing.is_empty() {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
        assert!(
            !ci,
            "CI is set but these binaries are missing: {missing:?} (run `cargo build --workspace`)"
        );
        eprintln!(
            "skipping: binaries missing next to ctrlplane: {missing:?} (run `cargo build --workspace`)"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let config = tmp.path().join("config.json");
    let cleanup = Cleanup(dir.clone());

    let (dc1, agent1) = run_once(&dir, &config, free_base(), 1);
    let secret1 = std::fs::read(dir.join("secret")).unwrap();
    assert!(dir.join("datacenter.db").exists());
    assert!(dir.join("logs/datacenter.log").exists());

    let (dc2, agent2) = run_once(&dir, &config, free_base(), 2);
    assert_eq!(dc1, dc2, "the demo datacenter is reused");
    assert_eq!(agent1, agent2, "the agent restarts with its identity");
    assert_eq!(secret1, std::fs::read(dir.join("secret")).unwrap());
    let out2 = std::fs::read_to_string(dir.with_extension("up2.out")).unwrap();
    assert!(!out2.contains("minted a join token"), "{out2}");
    assert!(out2.contains("already exists"), "{out2}");
    drop(cleanup);
}

/// Kills the demo's workloads (they outlive the agent by design).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in workload_pids(&self.0) {
            // Each replica is its own process group.
            sig(-pid, "-KILL");
            sig(pid, "-KILL");
        }
        for pid in service_pids(&self.0) {
            sig(pid, "-KILL");
        }
    }
}
