//! What the agent reads from `/proc`: process liveness (with pid-reuse
//! detection through the kernel start time), process group membership and
//! CPU/memory counters.
//!
//! A pid alone does not name a process for long: once it exits and is
//! reaped the number is recycled. The agent therefore always pairs a pid
//! with the start time the kernel recorded for it (field 22 of
//! `/proc/<pid>/stat`, clock ticks since boot); a process "is" the one the
//! agent started only if both match.

use std::path::Path;

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The pid.
    pub pid: i32,
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Process group id.
    pub pgrp: i32,
    /// User CPU time in clock ticks.
    pub utime: u64,
    /// System CPU time in clock ticks.
    pub stime: u64,
    /// Start time in clock ticks since boot.
    pub start_ticks: u64,
    /// Resident set size in pages.
    pub rss_pages: u64,
}

impl Stat {
    /// Whether the process still runs (not a zombie, not dead).
    pub fn running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses the text of `/proc/<pid>/stat`. The command name (field 2) is in
/// parentheses and may itself contain spaces and parentheses, so fields
/// are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state): field N is rest[N - 3].
    let field = |n: usize| rest.get(n - 3).copied();
    Some(Stat {
        pid,
        state: field(3)?.chars().next()?,
        pgrp: field(5)?.parse().ok()?,
        utime: field(14)?.parse().ok()?,
        stime: field(15)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
        rss_pages: field(24)?.parse().ok()?,
    })
}

/// The stat of a process, if it exists.
pub fn stat(pid: i32) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether the process started at `start_ticks` with this pid still runs.
pub fn alive(pid: i32, start_ticks: u64) -> bool {
    stat(pid).is_some_and(|s| s.start_ticks == start_ticks && s.running())
}

/// Every running process whose process group is `pgid`.
pub fn group_members(pgid: i32) -> Vec<Stat> {
    all_processes()
        .into_iter()
        .filter(|s| s.pgrp == pgid && s.running())
        .collect()
}

/// Stats of every process visible in `/proc`.
pub fn all_processes() -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

/// The value of one variable in a process's environment, if readable.
pub fn environ_var(pid: i32, name: &str) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    bytes.split(|b| *b == 0).find_map(|entry| {
        let entry = std::str::from_utf8(entry).ok()?;
        let (k, v) = entry.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

/// Clock ticks per second (`_SC_CLK_TCK`, almost always 100).
pub fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|v| *v > 0)
        .map_or(100, |v| v as u64)
}

/// Bytes per memory page.
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .filter(|v| *v > 0)
        .map_or(4096, |v| v as u64)
}

/// Seconds since boot (`/proc/uptime`).
pub fn uptime_secs() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Bytes used by the regular files under `dir` (not following symlinks;
/// stops counting after 100 000 entries so a huge tree cannot stall a
/// status call).
pub fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut budget = 100_000usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            if budget == 0 {
                return total;
            }
            budget -= 1;
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let text = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194304 100 0 0 0 7 3 0 0 20 0 1 0 123456 1000000 250 18446744073709551615";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.state, 'S');
        assert_eq!(s.pgrp, 4242);
        assert_eq!((s.utime, s.stime), (7, 3));
        assert_eq!(s.start_ticks, 123456);
        assert_eq!(s.rss_pages, 250);
        assert!(s.running());
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert!(alive(me, s.start_ticks));
        assert!(!alive(me, s.start_ticks + 1));
        assert!(clock_ticks() > 0 && page_size() > 0);
        assert!(uptime_secs().unwrap() > 0.0);
        assert!(environ_var(me, "PATH").is_some() || std::env::var("PATH").is_err());
    }
}
