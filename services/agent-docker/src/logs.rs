//! StreamLogs and Exec over the engine's log and exec APIs.
//!
//! Logs: every container of the selected services is read with engine
//! timestamps (nanosecond precision), including each replica's previous
//! generation, so the output of a replaced container stays visible after a
//! Deploy. `since` is applied to the exact timestamps and `tail` keeps the
//! last N lines of each (service, replica, stream); lines are merged in
//! time order. `follow` then streams new lines of the current containers,
//! starting right after the last line already sent for each, so nothing is
//! lost or repeated between the two parts.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::LogsOptionsBuilder;
use chrono::{DateTime, Utc};
use ctrlplane_agent::provider::Result;
use ctrlplane_agent::{LogStream, ProviderError};
use ctrlplane_proto::provider::v1 as pb;
use futures::{StreamExt, stream};
use tokio::io::AsyncWriteExt;

use crate::engine::Engine;
use crate::state::{Instance, timestamp};

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Engine timestamp.
    pub time: DateTime<Utc>,
    /// stdout or stderr.
    pub stream: pb::LogStream,
    /// The line, without its newline.
    pub line: String,
}

/// Parses one engine log frame (`TIMESTAMP line\n…`, possibly several
/// lines).
pub fn parse_frame(out: &LogOutput) -> Vec<Entry> {
    let (stream, bytes) = match out {
        LogOutput::StdOut { message } => (pb::LogStream::Stdout, message),
        LogOutput::StdErr { message } => (pb::LogStream::Stderr, message),
        _ => return Vec::new(),
    };
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| {
            let (ts, rest) = l.split_once(' ').unwrap_or((l, ""));
            let time = DateTime::parse_from_rfc3339(ts).ok()?.with_timezone(&Utc);
            Some(Entry {
                time,
                stream,
                line: rest.to_string(),
            })
        })
        .collect()
}

/// Keeps the entries at or after `since`, then the last `tail` of each
/// stream (0 = all).
pub fn select(mut entries: Vec<Entry>, since: Option<DateTime<Utc>>, tail: usize) -> Vec<Entry> {
    entries.retain(|e| since.is_none_or(|s| e.time >= s));
    entries.sort_by_key(|e| e.time);
    ctrlplane_agent::workload::keep_tail(&mut entries, tail, |e| e.stream);
    entries
}

fn opts(follow: bool, since_secs: i64) -> bollard::query_parameters::LogsOptions {
    LogsOptionsBuilder::default()
        .follow(follow)
        .stdout(true)
        .stderr(true)
        .timestamps(true)
        .since(i32::try_from(since_secs.max(0)).unwrap_or(0))
        .tail("all")
        .build()
}

fn to_pb(service: &str, replica: u32, e: Entry) -> pb::StreamLogsResponse {
    pb::StreamLogsResponse {
        timestamp: Some(timestamp(e.time)),
        service_name: service.to_string(),
        replica: replica as i32,
        stream: e.stream as i32,
        line: e.line,
    }
}

/// The StreamLogs answer for an instance.
///
/// # Errors
/// Engine errors while reading the history.
pub async fn stream(
    docker: Docker,
    engine: &Engine,
    inst: Instance,
    req: pb::StreamLogsRequest,
) -> Result<LogStream> {
    let since = req
        .since
        .as_ref()
        .and_then(|t| DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32));
    let since_secs = since.map_or(0, |s| s.timestamp());
    let t0 = Utc::now();
    let selected: Vec<_> = inst
        .containers
        .iter()
        .filter(|c| req.service_name.is_empty() || c.service == req.service_name)
        .collect();
    // History, per (service, replica) across generations.
    let mut history: HashMap<(String, u32), Vec<Entry>> = HashMap::new();
    let mut last_seen: HashMap<String, DateTime<Utc>> = HashMap::new();
    for c in &selected {
        let mut s = docker.logs(&c.name, Some(opts(false, since_secs)));
        let mut entries = Vec::new();
        while let Some(frame) = s.next().await {
            match frame {
                Ok(f) => entries.extend(parse_frame(&f)),
                Err(e) => return Err(engine.err(&format!("logs of {}", c.name), e)),
            }
        }
        if let Some(max) = entries.iter().map(|e| e.time).max() {
            last_seen.insert(c.name.clone(), max);
        }
        history
            .entry((c.service.clone(), c.replica))
            .or_default()
            .extend(entries);
    }
    let tail = usize::try_from(req.tail.max(0)).unwrap_or(0);
    let mut lines: Vec<pb::StreamLogsResponse> = Vec::new();
    for ((service, replica), entries) in history {
        for e in select(entries, since, tail) {
            lines.push(to_pb(&service, replica, e));
        }
    }
    lines.sort_by_key(|l| l.timestamp.as_ref().map(|t| (t.seconds, t.nanos)));
    let head = stream::iter(lines.into_iter().map(Ok));
    if !req.follow {
        return Ok(Box::pin(head));
    }
    let followers = selected
        .into_iter()
        .filter(|c| !c.prev)
        .map(|c| {
            let after = last_seen
                .get(&c.name)
                .copied()
                .unwrap_or(t0)
                .max(since.unwrap_or(t0));
            let service = c.service.clone();
            let replica = c.replica;
            let name = c.name.clone();
            docker
                .logs(&c.name, Some(opts(true, after.timestamp())))
                .flat_map(move |frame| {
                    let items: Vec<Result<pb::StreamLogsResponse>> = match frame {
                        Ok(f) => parse_frame(&f)
                            .into_iter()
                            .filter(|e| e.time > after)
                            .map(|e| Ok(to_pb(&service, replica, e)))
                            .collect(),
                        Err(e) => vec![Err(ProviderError::Unavailable(format!(
                            "following the logs of {name}: {e}"
                        )))],
                    };
                    stream::iter(items)
                })
                .boxed()
        })
        .collect::<Vec<_>>();
    // Streams of containers that are not running end at once; the call
    // stays open until the client goes away.
    let tail_stream = stream::select_all(followers).chain(stream::pending());
    Ok(Box::pin(head.chain(tail_stream)))
}

/// Runs a command in a container: exit code, stdout and stderr.
///
/// # Errors
/// Engine errors; `DEADLINE_EXCEEDED` after `timeout`.
pub async fn exec(
    engine: &Engine,
    container: &str,
    command: Vec<String>,
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<pb::ExecResponse> {
    let d = engine.client().await?;
    let created = d
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(!stdin.is_empty()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(command.clone()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| engine.err(&format!("exec in {container}"), e))?;
    let run = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        match d
            .start_exec(&created.id, None)
            .await
            .map_err(|e| engine.err(&format!("exec in {container}"), e))?
        {
            StartExecResults::Attached {
                mut output,
                mut input,
            } => {
                if !stdin.is_empty() {
                    let _ = input.write_all(&stdin).await;
                }
                let _ = input.shutdown().await;
                drop(input);
                while let Some(chunk) = output.next().await {
                    match chunk.map_err(|e| engine.err(&format!("exec in {container}"), e))? {
                        LogOutput::StdOut { message } | LogOutput::Console { message } => {
                            out.extend_from_slice(&message)
                        }
                        LogOutput::StdErr { message } => err.extend_from_slice(&message),
                        LogOutput::StdIn { .. } => {}
                    }
                }
            }
            StartExecResults::Detached => {}
        }
        Ok::<_, ProviderError>((out, err))
    };
    let (stdout, stderr) = tokio::time::timeout(timeout, run).await.map_err(|_| {
        ProviderError::DeadlineExceeded(format!(
            "{command:?} in {container} did not finish within {timeout:?}"
        ))
    })??;
    let inspect = d
        .inspect_exec(&created.id)
        .await
        .map_err(|e| engine.err(&format!("exec in {container}"), e))?;
    Ok(pb::ExecResponse {
        exit_code: inspect.exit_code.unwrap_or(-1) as i32,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(secs: i64, stream: pb::LogStream, line: &str) -> Entry {
        Entry {
            time: DateTime::from_timestamp(secs, 0).unwrap(),
            stream,
            line: line.to_string(),
        }
    }

    #[test]
    fn frames_parse_with_nanosecond_timestamps() {
        let f = LogOutput::StdErr {
            message: "2026-11-21T10:00:00.123456789Z warn 1\n".into(),
        };
        let v = parse_frame(&f);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].stream, pb::LogStream::Stderr);
        assert_eq!(v[0].line, "warn 1");
        assert_eq!(v[0].time.timestamp_subsec_nanos(), 123_456_789);
    }

    #[test]
    fn tail_is_per_stream_and_since_is_inclusive() {
        use pb::LogStream::{Stderr, Stdout};
        let all = vec![
            e(1, Stdout, "a"),
            e(2, Stderr, "x"),
            e(3, Stdout, "b"),
            e(4, Stdout, "c"),
            e(5, Stderr, "y"),
        ];
        let t = select(all.clone(), None, 1);
        assert_eq!(
            t.iter().map(|e| e.line.as_str()).collect::<Vec<_>>(),
            vec!["c", "y"]
        );
        let s = select(all, DateTime::from_timestamp(3, 0), 0);
        assert_eq!(
            s.iter().map(|e| e.line.as_str()).collect::<Vec<_>>(),
            vec!["b", "c", "y"]
        );
    }
}
