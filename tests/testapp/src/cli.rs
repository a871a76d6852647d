//! Command-line parsing: argv → [`Command`].
//!
//! Hand-written (no clap) to keep the binary dependency-free. Every
//! subcommand and flag of the conformance contract is here; anything else is
//! a [`UsageError`], which `main` reports with the usage text and exit
//! code 2.

use std::path::PathBuf;
use std::time::Duration;

/// Usage text, printed on stderr for a usage error.
pub const USAGE: &str = "\
usage: ctrlplane-testapp <command> [options]

commands:
  serve [--port P] [--log-every MS] [--busy]
        answer HTTP 200 \"ok\" on 0.0.0.0:$CP_PORT_<P> (or P; default 8080),
        print `tick <n>` on stdout every MS ms (default 200) and
        `warn <n>` on stderr every 5th tick; --busy burns a CPU core;
        exit 0 on SIGTERM
  exit <CODE> [--after MS] [--message TEXT]
        print TEXT (default `exit <CODE>`), wait MS ms (default 0), exit CODE
  env [--once]
        print every environment variable as KEY=VALUE, sorted, then wait for
        SIGTERM (--once: exit 0 at once)
  args <ARGS...>
        print each argument on its own line, then wait for SIGTERM
  cat <PATH>
        print the file (exit 1 if it cannot be read)
  write <PATH> <TEXT>
        write TEXT to the file, creating parent directories
  sleep [--ignore-term]
        wait for SIGTERM (exit 0); --ignore-term: ignore SIGTERM
";

/// Default `serve` port.
pub const DEFAULT_PORT: u16 = 8080;
/// Default `serve` tick period.
pub const DEFAULT_TICK: Duration = Duration::from_millis(200);

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// HTTP server with periodic log lines.
    Serve {
        /// Declared (container) port; the real port may come from
        /// `CP_PORT_<port>`.
        port: u16,
        /// Time between `tick` lines.
        tick: Duration,
        /// Burn CPU in a thread.
        busy: bool,
    },
    /// Print a message, wait, exit with a code.
    Exit {
        /// Exit code.
        code: i32,
        /// Wait before exiting.
        after: Duration,
        /// Line printed on stdout at start.
        message: String,
    },
    /// Print the environment.
    Env {
        /// Exit right after printing.
        once: bool,
    },
    /// Print the arguments.
    Args(Vec<String>),
    /// Print a file.
    Cat(PathBuf),
    /// Write a file.
    Write(PathBuf, String),
    /// Wait for SIGTERM.
    Sleep {
        /// Ignore SIGTERM: only SIGKILL ends the process.
        ignore_term: bool,
    },
}

/// A command line that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Takes the value of `flag` from `it`.
fn value(flag: &str, it: &mut impl Iterator<Item = String>) -> Result<String, UsageError> {
    match it.next() {
        Some(v) => Ok(v),
        None => err(format!("{flag} needs a value")),
    }
}

fn number<T: std::str::FromStr>(what: &str, v: &str) -> Result<T, UsageError> {
    v.parse()
        .map_err(|_| UsageError(format!("{what}: not a valid number: {v:?}")))
}

/// Parses the arguments after the program name.
///
/// # Errors
/// A [`UsageError`] naming what is wrong.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, UsageError> {
    let mut it = args.into_iter();
    let Some(cmd) = it.next() else {
        return err("missing command");
    };
    match cmd.as_str() {
        "serve" => {
            let (mut port, mut tick, mut busy) = (DEFAULT_PORT, DEFAULT_TICK, false);
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--port" => {
                        port = number("--port", &value("--port", &mut it)?)?;
                        if port == 0 {
                            return err("--port must be 1-65535");
                        }
                    }
                    "--log-every" => {
                        let ms: u64 = number("--log-every", &value("--log-every", &mut it)?)?;
                        if ms == 0 {
                            return err("--log-every must be at least 1");
                        }
                        tick = Duration::from_millis(ms);
                    }
                    "--busy" => busy = true,
                    other => return err(format!("serve: unknown argument {other:?}")),
                }
            }
            Ok(Command::Serve { port, tick, busy })
        }
        "exit" => {
            let Some(code) = it.next() else {
                return err("exit: missing CODE");
            };
            let code: i32 = number("exit CODE", &code)?;
            if !(0..=255).contains(&code) {
                return err("exit: CODE must be 0-255");
            }
            let (mut after, mut message) = (Duration::ZERO, format!("exit {code}"));
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--after" => {
                        after =
                            Duration::from_millis(number("--after", &value("--after", &mut it)?)?);
                    }
                    "--message" => message = value("--message", &mut it)?,
                    other => return err(format!("exit: unknown argument {other:?}")),
                }
            }
            Ok(Command::Exit {
                code,
                after,
                message,
            })
        }
        "env" => match it.next().as_deref() {
            None => Ok(Command::Env { once: false }),
            Some("--once") if it.next().is_none() => Ok(Command::Env { once: true }),
            Some(other) => err(format!("env: unknown argument {other:?}")),
        },
        "args" => Ok(Command::Args(it.collect())),
        "cat" => match (it.next(), it.next()) {
            (Some(path), None) => Ok(Command::Cat(path.into())),
            _ => err("cat: expected exactly one PATH"),
        },
        "write" => match (it.next(), it.next(), it.next()) {
            (Some(path), Some(text), None) => Ok(Command::Write(path.into(), text)),
            _ => err("write: expected PATH and TEXT"),
        },
        "sleep" => match it.next().as_deref() {
            None => Ok(Command::Sleep { ignore_term: false }),
            Some("--ignore-term") if it.next().is_none() => {
                Ok(Command::Sleep { ignore_term: true })
            }
            Some(other) => err(format!("sleep: unknown argument {other:?}")),
        },
        other => err(format!("unknown command {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn serve_defaults_and_flags() {
        assert_eq!(
            p(&["serve"]).unwrap(),
            Command::Serve {
                port: 8080,
                tick: DEFAULT_TICK,
                busy: false
            }
        );
        assert_eq!(
            p(&["serve", "--port", "9090", "--log-every", "50", "--busy"]).unwrap(),
            Command::Serve {
                port: 9090,
                tick: Duration::from_millis(50),
                busy: true
            }
        );
        assert!(p(&["serve", "--port"]).is_err());
        assert!(p(&["serve", "--port", "0"]).is_err());
        assert!(p(&["serve", "--port", "70000"]).is_err());
        assert!(p(&["serve", "--log-every", "0"]).is_err());
        assert!(p(&["serve", "--nope"]).is_err());
    }

    #[test]
    fn exit_forms() {
        assert_eq!(
            p(&["exit", "3"]).unwrap(),
            Command::Exit {
                code: 3,
                after: Duration::ZERO,
                message: "exit 3".into()
            }
        );
        assert_eq!(
            p(&["exit", "0", "--after", "150", "--message", "init-a"]).unwrap(),
            Command::Exit {
                code: 0,
                after: Duration::from_millis(150),
                message: "init-a".into()
            }
        );
        assert!(p(&["exit"]).is_err());
        assert!(p(&["exit", "x"]).is_err());
        assert!(p(&["exit", "256"]).is_err());
        assert!(p(&["exit", "1", "--message"]).is_err());
    }

    #[test]
    fn other_commands() {
        assert_eq!(p(&["env"]).unwrap(), Command::Env { once: false });
        assert_eq!(p(&["env", "--once"]).unwrap(), Command::Env { once: true });
        assert!(p(&["env", "--twice"]).is_err());
        assert_eq!(
            p(&["args", "a", "--b", "c d"]).unwrap(),
            Command::Args(vec!["a".into(), "--b".into(), "c d".into()])
        );
        assert_eq!(p(&["args"]).unwrap(), Command::Args(vec![]));
        assert_eq!(p(&["cat", "x/y"]).unwrap(), Command::Cat("x/y".into()));
        assert!(p(&["cat"]).is_err());
        assert!(p(&["cat", "a", "b"]).is_err());
        assert_eq!(
            p(&["write", "a/b", "t"]).unwrap(),
            Command::Write("a/b".into(), "t".into())
        );
        assert!(p(&["write", "a"]).is_err());
        assert_eq!(
            p(&["sleep"]).unwrap(),
            Command::Sleep { ignore_term: false }
        );
        assert_eq!(
            p(&["sleep", "--ignore-term"]).unwrap(),
            Command::Sleep { ignore_term: true }
        );
        assert!(p(&[]).is_err());
        assert!(p(&["frobnicate"]).is_err());
    }
}
