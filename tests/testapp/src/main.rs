//! `ctrlplane-testapp`: the workload every provider conformance test runs.
//!
//! One small static binary with a subcommand per behaviour the conformance
//! kit observes (see [`cli::USAGE`] and `shared/conformance`): an HTTP
//! server that logs on both streams, a program that exits with a chosen code
//! after a chosen time, printers for the environment, the arguments and a
//! file, a file writer, and sleepers that do or do not honour SIGTERM.
//!
//! Invariants the kit relies on:
//! - long-running commands install their SIGTERM handler before printing
//!   anything, so a SIGTERM sent after the first output line always ends the
//!   process with exit code 0 (and never ends `sleep --ignore-term`);
//! - every output line is written whole (stdout is line-buffered) and write
//!   errors are ignored: a process whose log pipe is gone keeps running;
//! - `serve` binds the port given by `CP_PORT_<P>` when the agent sets it,
//!   so parallel workloads on one host never fight over a fixed port.
//!
//! std + signal-hook only: the binary is built static for a FROM scratch
//! image.

#![forbid(unsafe_code)]

mod cli;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::exit;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use cli::Command;

/// HTTP answer to every request.
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\
Content-Type: text/plain\r\n\
Content-Length: 2\r\n\
Connection: close\r\n\
\r\n\
ok";

/// Time a client has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

fn main() {
    let cmd = match cli::parse(std::env::args().skip(1)) {
        Ok(cmd) => cmd,
        Err(e) => {
            eprint!("ctrlplane-testapp: {e}\n\n{}", cli::USAGE);
            exit(2);
        }
    };
    match cmd {
        Command::Serve { port, tick, busy } => serve(port, tick, busy),
        Command::Exit {
            code,
            after,
            message,
        } => {
            out(&message);
            thread::sleep(after);
            exit(code);
        }
        Command::Env { once } => {
            let term = (!once).then(term_signals);
            let mut vars: Vec<_> = std::env::vars_os().collect();
            vars.sort();
            for (k, v) in vars {
                out(&format!("{}={}", k.to_string_lossy(), v.to_string_lossy()));
            }
            if let Some(term) = term {
                wait_and_exit(term);
            }
        }
        Command::Args(args) => {
            let term = term_signals();
            for a in args {
                out(&a);
            }
            wait_and_exit(term);
        }
        Command::Cat(path) => cat(&path),
        Command::Write(path, text) => write(&path, &text),
        Command::Sleep { ignore_term: false } => wait_and_exit(term_signals()),
        Command::Sleep { ignore_term: true } => {
            // A handler that only sets a flag nobody reads: SIGTERM is
            // caught and ignored, so only SIGKILL ends the process.
            let ignored = Arc::new(AtomicBool::new(false));
            if let Err(e) = signal_hook::flag::register(SIGTERM, ignored) {
                fail(1, &format!("cannot install the SIGTERM handler: {e}"));
            }
            loop {
                thread::park();
            }
        }
    }
}

/// Prints one line on stdout, ignoring a closed pipe.
fn out(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Prints one line on stderr, ignoring a closed pipe.
fn err(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Reports an error on stderr and exits with `code`.
fn fail(code: i32, msg: &str) -> ! {
    err(&format!("ctrlplane-testapp: {msg}"));
    exit(code);
}

/// Catches SIGTERM and SIGINT (installed before any output).
fn term_signals() -> Signals {
    Signals::new([SIGTERM, SIGINT])
        .unwrap_or_else(|e| fail(1, &format!("cannot install signal handlers: {e}")))
}

/// Blocks until SIGTERM or SIGINT, then exits 0.
fn wait_and_exit(mut signals: Signals) -> ! {
    // `forever` only ends if the handle is closed, which nothing does.
    let _ = signals.forever().next();
    let _ = std::io::stdout().flush();
    exit(0);
}

fn serve(port: u16, tick: Duration, busy: bool) -> ! {
    let term = term_signals();
    let var = format!("CP_PORT_{port}");
    let bind_port = match std::env::var(&var) {
        Ok(v) => v
            .trim()
            .parse::<u16>()
            .unwrap_or_else(|_| fail(1, &format!("{var}={v:?} is not a port"))),
        Err(_) => port,
    };
    let listener = TcpListener::bind(("0.0.0.0", bind_port))
        .unwrap_or_else(|e| fail(1, &format!("cannot listen on 0.0.0.0:{bind_port}: {e}")));
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            thread::spawn(move || answer(conn));
        }
    });
    if busy {
        thread::spawn(burn);
    }
    thread::spawn(move || {
        let start = Instant::now();
        for n in 1u64.. {
            out(&format!("tick {n}"));
            if n % 5 == 0 {
                err(&format!("warn {n}"));
            }
            // Scheduled from the start, so ticks do not drift.
            let next = start + tick.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
            thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    });
    wait_and_exit(term)
}

/// Reads the request head (up to the blank line) and answers `200 ok`.
fn answer(mut conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(READ_TIMEOUT));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = conn.write_all(RESPONSE);
    let _ = conn.flush();
}

/// Keeps one core busy.
fn burn() {
    let mut x: u64 = 1;
    loop {
        for _ in 0..1_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

fn cat(path: &Path) -> ! {
    match std::fs::read(path) {
        Ok(bytes) => {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(&bytes);
            let _ = stdout.flush();
            exit(0);
        }
        Err(e) => fail(1, &format!("cat {}: {e}", path.display())),
    }
}

fn write(path: &Path, text: &str) -> ! {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        fail(1, &format!("write {}: {e}", path.display()));
    }
    match std::fs::write(path, text) {
        Ok(()) => exit(0),
        Err(e) => fail(1, &format!("write {}: {e}", path.display())),
    }
}
