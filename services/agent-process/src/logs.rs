//! Process output: capture into per-replica log files, and reading them
//! back for `StreamLogs` (tail, since, follow).
//!
//! Capture. Each process gets two named pipes (`.run/<service>-<replica>.out`
//! and `.err`) as its stdout and stderr, opened *read-write*: the process
//! itself then always holds a reader, so its writes never fail with EPIPE
//! while the agent is down — they block once the pipe buffer (raised to
//! 1 MiB where allowed) is full, and resume when a restarted agent opens the
//! pipes again and drains them. A pump task per pipe stamps every line with
//! the time it was read and appends it to `logs/<service>-<replica>.log`.
//! Lines written while the agent was down are stamped when it reads them.
//!
//! File format: one line per output line,
//! `<RFC 3339 UTC timestamp, nanoseconds> <stdout|stderr> <text>`.
//! A file past the size limit is renamed to `<name>.log.1` (replacing the
//! previous one) and a new file begun.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use ctrlplane_proto::provider::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

/// Longest line kept whole; longer output is cut into pieces this long.
pub const MAX_LINE: usize = 64 * 1024;

/// How often a following reader looks for new lines.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// Which output a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// The word used in log files.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// The protobuf value.
    pub fn to_pb(self) -> pb::LogStream {
        match self {
            Stream::Stdout => pb::LogStream::Stdout,
            Stream::Stderr => pb::LogStream::Stderr,
        }
    }
}

/// One parsed log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// When the agent read it.
    pub time: DateTime<Utc>,
    /// Which output.
    pub stream: Stream,
    /// The text, without the newline.
    pub line: String,
}

/// Formats a line for a log file.
pub fn format_line(time: DateTime<Utc>, stream: Stream, line: &str) -> String {
    format!(
        "{} {} {}\n",
        time.to_rfc3339_opts(SecondsFormat::Nanos, true),
        stream.as_str(),
        line
    )
}

/// Parses a log-file line (without its newline).
pub fn parse_line(text: &str) -> Option<Entry> {
    let (time, rest) = text.split_once(' ')?;
    let (stream, line) = match rest.split_once(' ') {
        Some((s, l)) => (s, l),
        None => (rest, ""),
    };
    let stream = match stream {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        _ => return None,
    };
    Some(Entry {
        time: DateTime::parse_from_rfc3339(time).ok()?.with_timezone(&Utc),
        stream,
        line: line.to_string(),
    })
}

/// The log file of one replica; shared by its stdout and stderr pumps.
#[derive(Debug)]
pub struct Sink {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Option<std::fs::File>>,
}

impl Sink {
    /// A sink appending to `path`, rotating past `max_bytes`.
    pub fn new(path: PathBuf, max_bytes: u64) -> Sink {
        Sink {
            path,
            max_bytes,
            file: Mutex::new(None),
        }
    }

    /// Appends lines, all stamped now, in one write.
    pub fn write(&self, stream: Stream, lines: &[String]) {
        if lines.is_empty() {
            return;
        }
        let now = Utc::now();
        let text: String = lines.iter().map(|l| format_line(now, stream, l)).collect();
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.append(&mut guard, text.as_bytes()) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot write log file");
            *guard = None;
        }
    }

    fn append(&self, file: &mut Option<std::fs::File>, bytes: &[u8]) -> io::Result<()> {
        if file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            *file = Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)?,
            );
        }
        let f = file.as_mut().expect("opened above");
        if f.metadata()?.len() + bytes.len() as u64 > self.max_bytes {
            std::fs::rename(&self.path, rotated(&self.path))?;
            *f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
        }
        f.write_all(bytes)
    }
}

/// The previous file of a rotated log.
pub fn rotated(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

/// Paths of a replica's two pipes.
pub fn pipe_paths(run_dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    (
        run_dir.join(format!("{stem}.out")),
        run_dir.join(format!("{stem}.err")),
    )
}

/// Creates fresh pipes for a new process and opens them read-write for
/// its stdout and stderr. Old pipes at the same paths are unlinked first (a
/// pump still draining one keeps it until the old process closes it).
///
/// # Errors
/// The pipes cannot be created.
pub fn create_pipes(run_dir: &Path, stem: &str) -> io::Result<(std::fs::File, std::fs::File)> {
    std::fs::create_dir_all(run_dir)?;
    let (out, err) = pipe_paths(run_dir, stem);
    let open = |path: &Path| -> io::Result<std::fs::File> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(io::Error::from)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        // Best effort: a bigger buffer rides out a longer agent restart.
        let _ = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        Ok(file)
    };
    Ok((open(&out)?, open(&err)?))
}

/// Starts the pumps of a replica's pipes: each reads until every writer is
/// gone (the process group ended) or `cancel` fires (agent shutdown: the
/// unread output stays in the pipe for the next agent). Missing pipes are
/// skipped.
pub fn start_pumps(
    tracker: &tokio_util::task::TaskTracker,
    run_dir: &Path,
    stem: &str,
    sink: Arc<Sink>,
    cancel: CancellationToken,
) {
    let (out, err) = pipe_paths(run_dir, stem);
    for (path, stream) in [(out, Stream::Stdout), (err, Stream::Stderr)] {
        let rx = match tokio::net::unix::pipe::OpenOptions::new().open_receiver(&path) {
            Ok(rx) => rx,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no output pipe to read");
                continue;
            }
        };
        tracker.spawn(pump(rx, stream, sink.clone(), cancel.clone()));
    }
}

async fn pump(
    mut rx: tokio::net::unix::pipe::Receiver,
    stream: Stream,
    sink: Arc<Sink>,
    cancel: CancellationToken,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            () = cancel.cancelled() => return,
            r = rx.read(&mut chunk) => match r {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            },
        };
        if n == 0 {
            if !pending.is_empty() {
                sink.write(stream, &[String::from_utf8_lossy(&pending).into_owned()]);
            }
            return;
        }
        pending.extend_from_slice(&chunk[..n]);
        let mut lines = Vec::new();
        while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = pending.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            lines.push(String::from_utf8_lossy(&line).into_owned());
        }
        while pending.len() >= MAX_LINE {
            let piece: Vec<u8> = pending.drain(..MAX_LINE).collect();
            lines.push(String::from_utf8_lossy(&piece).into_owned());
        }
        sink.write(stream, &lines);
    }
}

/// A log file of one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// Service name.
    pub service: String,
    /// Replica index.
    pub replica: u32,
    /// The current file.
    pub path: PathBuf,
}

/// The log files under `logs_dir` of the given services (including replicas
/// scaled away since). `<service>-<n>.log` is unambiguous because service
/// names are DNS labels: the part after the service's name must be digits.
pub fn log_files(logs_dir: &Path, services: &[String]) -> Vec<LogFile> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(logs_dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".log") else {
            continue;
        };
        for service in services {
            let Some(rest) = stem
                .strip_prefix(service.as_str())
                .and_then(|r| r.strip_prefix('-'))
            else {
                continue;
            };
            if let Ok(replica) = rest.parse::<u32>()
                && !rest.starts_with('+')
            {
                out.push(LogFile {
                    service: service.clone(),
                    replica,
                    path: entry.path(),
                });
            }
        }
    }
    out.sort_by(|a, b| (&a.service, a.replica).cmp(&(&b.service, b.replica)));
    out
}

/// Every entry of a replica's log (the rotated file first).
pub fn read_all(path: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    for p in [rotated(path), path.to_path_buf()] {
        if let Ok(text) = std::fs::read_to_string(&p) {
            out.extend(text.lines().filter_map(parse_line));
        }
    }
    out
}

/// What a StreamLogs call asks for.
#[derive(Debug, Clone)]
pub struct Query {
    /// Only lines at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Last N lines of each (replica, stream); 0 = all.
    pub tail: usize,
    /// Keep streaming new lines.
    pub follow: bool,
}

/// Applies `since` and `tail` to one replica's entries: `tail` keeps the
/// last N lines of stdout and the last N of stderr.
pub fn select(entries: Vec<Entry>, query: &Query) -> Vec<Entry> {
    let mut entries: Vec<Entry> = entries
        .into_iter()
        .filter(|e| query.since.is_none_or(|s| e.time >= s))
        .collect();
    ctrlplane_agent::workload::keep_tail(&mut entries, query.tail, |e| e.stream);
    entries
}

/// Converts an entry for the wire.
pub fn to_pb(file: &LogFile, e: Entry) -> pb::StreamLogsResponse {
    pb::StreamLogsResponse {
        timestamp: Some(ctrlplane_proto::pbjson_types::Timestamp {
            seconds: e.time.timestamp(),
            nanos: e.time.timestamp_subsec_nanos() as i32,
        }),
        service_name: file.service.clone(),
        replica: file.replica as i32,
        stream: e.stream.to_pb() as i32,
        line: e.line,
    }
}

/// Reads new complete lines of a followed file from `offset` on, advancing
/// it. A file that shrank was rotated: reading starts over.
pub fn read_new(path: &Path, offset: &mut u64) -> Vec<Entry> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len < *offset {
        *offset = 0;
    }
    if len == *offset || f.seek(SeekFrom::Start(*offset)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.take(len - *offset).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
        return Vec::new();
    };
    *offset += end as u64 + 1;
    String::from_utf8_lossy(&buf[..end])
        .lines()
        .filter_map(parse_line)
        .collect()
}

/// Current length of a file (0 if missing).
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let t = Utc::now();
        let text = format_line(t, Stream::Stderr, "warn 5 with  spaces");
        let e = parse_line(text.trim_end_matches('\n')).unwrap();
        assert_eq!(e.time, t);
        assert_eq!(e.stream, Stream::Stderr);
        assert_eq!(e.line, "warn 5 with  spaces");
        assert_eq!(
            parse_line(format_line(t, Stream::Stdout, "").trim_end_matches('\n'))
                .unwrap()
                .line,
            ""
        );
        assert!(parse_line("nonsense").is_none());
    }

    #[test]
    fn tail_is_per_stream_and_since_filters() {
        let t0 = Utc::now();
        let mut entries = Vec::new();
        for i in 0..10 {
            let stream = if i % 3 == 0 {
                Stream::Stderr
            } else {
                Stream::Stdout
            };
            entries.push(Entry {
                time: t0 + chrono::Duration::milliseconds(i),
                stream,
                line: i.to_string(),
            });
        }
        let q = Query {
            since: None,
            tail: 2,
            follow: false,
        };
        let lines: Vec<String> = select(entries.clone(), &q)
            .into_iter()
            .map(|e| e.line)
            .collect();
        assert_eq!(lines, ["6", "7", "8", "9"]);
        let q = Query {
            since: Some(t0 + chrono::Duration::milliseconds(8)),
            tail: 0,
            follow: false,
        };
        assert_eq!(select(entries, &q).len(), 2);
    }

    #[test]
    fn log_files_match_services_exactly() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a-0.log", "a-1-0.log", "a-1.log.1", "b-x.log", "a-2.log"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let files = log_files(dir.path(), &["a".to_string(), "a-1".to_string()]);
        let got: Vec<(String, u32)> = files.into_iter().map(|f| (f.service, f.replica)).collect();
        assert_eq!(
            got,
            [
                ("a".to_string(), 0),
                ("a".to_string(), 2),
                ("a-1".to_string(), 0)
            ]
        );
    }

    #[test]
    fn sink_rotates_and_follow_reads_complete_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/m-0.log");
        let sink = Sink::new(path.clone(), 200);
        let mut offset = 0;
        sink.write(Stream::Stdout, &["one".to_string(), "two".to_string()]);
        let got = read_new(&path, &mut offset);
        assert_eq!(got.len(), 2);
        assert!(read_new(&path, &mut offset).is_empty());
        for i in 0..5 {
            sink.write(Stream::Stdout, &[format!("line {i}")]);
        }
        assert!(rotated(&path).exists(), "rotated past 200 bytes");
        let all: Vec<String> = read_all(&path).into_iter().map(|e| e.line).collect();
        assert!(all.ends_with(&["line 3".to_string(), "line 4".to_string()]));
        // The file shrank: following starts over without losing new lines.
        let got = read_new(&path, &mut offset);
        assert!(!got.is_empty());
    }

    #[tokio::test]
    async fn pumps_capture_output_through_pipes() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join(".run");
        let (out, err) = create_pipes(&run, "m-0").unwrap();
        let sink = Arc::new(Sink::new(dir.path().join("m-0.log"), 1 << 20));
        let tracker = tokio_util::task::TaskTracker::new();
        start_pumps(&tracker, &run, "m-0", sink, CancellationToken::new());
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "echo hello; echo oops >&2; printf partial"])
            .stdout(out)
            .stderr(err);
        assert!(cmd.status().await.unwrap().success());
        drop(cmd);
        tracker.close();
        tokio::time::timeout(Duration::from_secs(20), tracker.wait())
            .await
            .expect("pumps end when the writers are gone");
        let entries = read_all(&dir.path().join("m-0.log"));
        let mut got: Vec<(Stream, String)> =
            entries.into_iter().map(|e| (e.stream, e.line)).collect();
        got.sort();
        assert_eq!(
            got,
            [
                (Stream::Stdout, "hello".to_string()),
                (Stream::Stdout, "partial".to_string()),
                (Stream::Stderr, "oops".to_string()),
            ]
        );
    }
}
