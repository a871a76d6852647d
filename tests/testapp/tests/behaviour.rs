//! The test app's observable behaviour, checked on the real binary: what
//! the conformance kit relies on (output, exit codes, ports, signals).
//!
//! Signals are sent with the system's `kill` command (no unsafe code here);
//! before sending SIGTERM a test waits until the process has installed its
//! handler (`SigCgt` in `/proc/<pid>/status`), so no test races the
//! start-up.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctrlplane-testapp");
const DEADLINE: Duration = Duration::from_secs(20);

fn app() -> Command {
    let mut c = Command::new(BIN);
    c.env_clear();
    c
}

fn run(args: &[&str]) -> Output {
    app().args(args).output().expect("run the testapp")
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the testapp")
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} failed");
}

/// Waits until the process catches SIGTERM (bit 15 of SigCgt).
fn wait_term_handler(child: &Child) {
    let path = format!("/proc/{}/status", child.id());
    let until = Instant::now() + DEADLINE;
    loop {
        let status = std::fs::read_to_string(&path).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (15 - 1)) != 0 {
            return;
        }
        assert!(Instant::now() < until, "no SIGTERM handler installed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the child to exit, killing it on timeout.
fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            panic!("process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    Some(resp)
}

fn read_lines(r: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[test]
fn serve_answers_http_on_the_port_from_env_and_ticks() {
    let port = free_port();
    let mut child = spawn(
        app()
            .args(["serve", "--log-every", "20"])
            .env("CP_PORT_8080", port.to_string()),
    );
    let stdout = read_lines(child.stdout.take().unwrap());
    let stderr = read_lines(child.stderr.take().unwrap());

    let until = Instant::now() + DEADLINE;
    let resp = loop {
        if let Some(r) = http_get(port) {
            break r;
        }
        assert!(Instant::now() < until, "serve never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp:?}");
    assert!(resp.ends_with("\r\n\r\nok"), "{resp:?}");

    for n in 1..=10 {
        assert_eq!(stdout.recv_timeout(DEADLINE).unwrap(), format!("tick {n}"));
    }
    assert_eq!(stderr.recv_timeout(DEADLINE).unwrap(), "warn 5");
    assert_eq!(stderr.recv_timeout(DEADLINE).unwrap(), "warn 10");

    wait_term_handler(&child);
    signal(&child, "TERM");
    let status = wait_exit(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn serve_uses_the_declared_port_without_env_and_busy_burns_cpu() {
    let port = free_port();
    let mut child = spawn(app().args(["serve", "--port", &port.to_string(), "--busy"]));
    let until = Instant::now() + DEADLINE;
    while http_get(port).is_none() {
        assert!(Instant::now() < until, "serve never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // utime + stime (fields 14 and 15 of /proc/<pid>/stat) grow.
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let until = Instant::now() + DEADLINE;
    while ticks() < 10 {
        assert!(Instant::now() < until, "--busy used no CPU");
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_term_handler(&child);
    signal(&child, "TERM");
    assert_eq!(wait_exit(&mut child, DEADLINE).code(), Some(0));
}

#[test]
fn serve_fails_on_a_bad_port_env() {
    let out = app()
        .args(["serve"])
        .env("CP_PORT_8080", "nope")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CP_PORT_8080"));
}

#[test]
fn exit_prints_waits_and_exits_with_the_code() {
    let out = run(&["exit", "7", "--message", "hello"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(out.stdout, b"hello\n");
    assert!(out.stderr.is_empty());

    let out = run(&["exit", "3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"exit 3\n");

    let t0 = Instant::now();
    let out = run(&["exit", "0", "--after", "150", "--message", "init-a"]);
    assert!(t0.elapsed() >= Duration::from_millis(150));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"init-a\n");
}

#[test]
fn env_once_prints_sorted_variables() {
    let out = app()
        .args(["env", "--once"])
        .env("ZED", "last")
        .env("ALPHA", "two words")
        .env("MID", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "ALPHA=two words\nMID=\nZED=last\n"
    );
}

#[test]
fn env_and_args_print_then_wait_for_sigterm() {
    let mut child = spawn(app().args(["env"]).env("GREETING", "hi there"));
    let lines = read_lines(child.stdout.take().unwrap());
    assert_eq!(lines.recv_timeout(DEADLINE).unwrap(), "GREETING=hi there");
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.try_wait().unwrap().is_none(), "env exited early");
    wait_term_handler(&child);
    signal(&child, "TERM");
    assert_eq!(wait_exit(&mut child, DEADLINE).code(), Some(0));

    let mut child = spawn(app().args(["args", "one", "two words", "--three"]));
    let lines = read_lines(child.stdout.take().unwrap());
    for want in ["one", "two words", "--three"] {
        assert_eq!(lines.recv_timeout(DEADLINE).unwrap(), want);
    }
    assert!(child.try_wait().unwrap().is_none(), "args exited early");
    wait_term_handler(&child);
    signal(&child, "TERM");
    assert_eq!(wait_exit(&mut child, DEADLINE).code(), Some(0));
}

#[test]
fn write_then_cat_round_trips_and_cat_of_a_missing_file_fails() {
    let dir = std::env::temp_dir().join(format!("ctrlplane-testapp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("conf/deep/app.yaml");
    let content = "key: value\nlist:\n  - a\n";
    let out = run(&["write", path.to_str().unwrap(), content]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), content);

    let out = run(&["cat", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, content.as_bytes());

    let out = run(&["cat", dir.join("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));

    // Relative paths resolve against the working directory.
    let out = app()
        .args(["cat", "conf/deep/app.yaml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(out.stdout, content.as_bytes());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sleep_exits_zero_on_sigterm() {
    let mut child = spawn(app().args(["sleep"]));
    wait_term_handler(&child);
    assert!(child.try_wait().unwrap().is_none());
    signal(&child, "TERM");
    assert_eq!(wait_exit(&mut child, DEADLINE).code(), Some(0));
}

#[test]
fn sleep_ignore_term_survives_sigterm_and_dies_on_sigkill() {
    let mut child = spawn(app().args(["sleep", "--ignore-term"]));
    wait_term_handler(&child);
    signal(&child, "TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "--ignore-term exited on SIGTERM"
    );
    signal(&child, "KILL");
    let status = wait_exit(&mut child, DEADLINE);
    assert_eq!(status.signal(), Some(9), "{status:?}");
}

#[test]
fn usage_errors_exit_2_with_usage_on_stderr() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["serve", "--nope"],
        &["exit"],
        &["cat"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("usage: ctrlplane-testapp"),
            "{args:?}"
        );
    }
}
