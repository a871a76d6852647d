//! `ctrlplane-bench`: the first benchmark of the control plane — a program,
//! not a test.
//!
//! It starts the real datacenter, bootstrap and scheduler services in this
//! process (each from its library `run`, on its own socket and database)
//! with a fast in-memory agent ([`agent::FastAgent`]) joined through the
//! registry, and measures:
//!
//! 1. **create → all running**: `--datacenters` M datacenters, each with
//!    `--services` K declared bootstrap services, are created through
//!    `DatacenterService.CreateDatacenter` (`--concurrency` calls at once);
//!    the scheduler's watch drives the reconciles (its periodic interval is
//!    an hour). Per datacenter, the time from its `CreateDatacenter` call to
//!    the bootstrap event that makes its last workload RUNNING
//!    (`BootstrapService.WatchEvents`). Prints p50/p90/p99/max and
//!    throughput.
//! 2. **no-op resync**: on a fresh stack, for each N of `--resync-sizes`
//!    (ascending, topping up), N datacenters are created concurrently and
//!    converge; then one full pass of the scheduler's `reconciler` worker
//!    (`SchedulerService.RunWorker`) is timed — every datacenter
//!    reconciled with nothing to do (the bootstrap events and agent
//!    provisions during the pass are counted to show it).
//!
//! Run it in release mode:
//!
//! ```text
//! cargo run --release -p ctrlplane-bench -- --quick
//! cargo run --release -p ctrlplane-bench -- --datacenters 200 --services 3 --resync-sizes 100,1000,10000
//! cargo run --release -p ctrlplane-bench -- --database postgres://user:pw@localhost/postgres
//! ```
//!
//! Every wait is bounded by `--timeout`; if convergence does not happen in
//! time the program exits non-zero saying how far it got.

mod agent;
mod stack;
mod tracker;

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1 as dcpb;
use ctrlplane_proto::provider::v1::ServiceSpec;
use ctrlplane_proto::scheduler::v1 as scpb;
use futures::StreamExt;
use tokio::time::Instant;

use crate::stack::{Database, Stack};
use crate::tracker::Tracker;

/// Creations at once while setting up the resync datacenters.
const SETUP_CONCURRENCY: usize = 64;

/// Benchmark of the ctrlplane control plane (in-process, fast agent).
#[derive(Debug, Parser)]
#[command(name = "ctrlplane-bench", version)]
struct Args {
    /// Datacenters created for the latency measurement [default: 200, --quick: 50].
    #[arg(long)]
    datacenters: Option<usize>,
    /// Declared bootstrap services per datacenter.
    #[arg(long, default_value_t = 3)]
    services: usize,
    /// CreateDatacenter calls in flight at once during the latency run.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Datacenter counts of the no-op resync, comma-separated
    /// [default: 100,1000,10000, --quick: 100,500]; empty to skip.
    #[arg(long, value_parser = parse_sizes)]
    resync_sizes: Option<Sizes>,
    /// `sqlite` (temp files) or a `postgres://` URL (fresh databases are
    /// created on that server).
    #[arg(long, default_value = "sqlite")]
    database: String,
    /// A short run: smaller defaults.
    #[arg(long)]
    quick: bool,
    /// The scheduler's leader lease (`CP_LEADER_LEASE`). Long by default:
    /// each renewal currently re-runs every periodic worker at once (see
    /// the README), which would run resyncs during the measurements.
    #[arg(long, default_value = "1h")]
    leader_lease: String,
    /// Upper bound of every wait, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ctrlplane-bench: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args));
    // Services still draining must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ctrlplane-bench: FAILED: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    let db = Database::parse(&args.database)?;
    let datacenters = args
        .datacenters
        .unwrap_or(if args.quick { 50 } else { 200 });
    let mut sizes = args.resync_sizes.clone().map(|s| s.0).unwrap_or_else(|| {
        if args.quick {
            vec![100, 500]
        } else {
            vec![100, 1000, 10_000]
        }
    });
    sizes.retain(|n| *n > 0);
    sizes.sort_unstable();
    sizes.dedup();
    if args.services == 0 {
        bail!("--services must be at least 1");
    }
    let timeout = Duration::from_secs(args.timeout);
    let concurrency = args.concurrency.max(1);

    let mut report = String::new();
    report.push_str(&header(&args, &db, datacenters, &sizes));
    eprint!("{report}");

    if datacenters > 0 {
        eprintln!(
            "\n[1/2] create → all running: {datacenters} datacenters × {} services",
            args.services
        );
        let stack = Stack::start(&db, &args.leader_lease, timeout).await?;
        let r = latency(&stack, datacenters, args.services, concurrency, timeout).await;
        stack.stop().await;
        report.push_str(&r?);
    }
    if !sizes.is_empty() {
        eprintln!("\n[2/2] no-op resync over {sizes:?} datacenters");
        let stack = Stack::start(&db, &args.leader_lease, timeout).await?;
        let r = resync(&stack, &sizes, args.services, timeout).await;
        stack.stop().await;
        report.push_str(&r?);
    }
    println!("{report}");
    Ok(())
}

/// `--resync-sizes`: comma-separated counts, possibly none.
#[derive(Debug, Clone)]
struct Sizes(Vec<usize>);

fn parse_sizes(s: &str) -> Result<Sizes, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<usize>().map_err(|e| format!("{p:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()
        .map(Sizes)
}

fn header(args: &Args, db: &Database, datacenters: usize, sizes: &[usize]) -> String {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let profile = if cfg!(debug_assertions) {
        "debug (numbers are not meaningful: use --release)"
    } else {
        "release"
    };
    format!(
        "ctrlplane-bench {} — {}\n\
         machine: {cores} cores ({cpu}), {} {}, build profile: {profile}\n\
         database: {}\n\
         parameters: --datacenters {datacenters} --services {} --concurrency {} \
         --resync-sizes {} --leader-lease {} --timeout {}{}\n",
        env!("CARGO_PKG_VERSION"),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        db.describe(),
        args.services,
        args.concurrency,
        sizes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        args.leader_lease,
        args.timeout,
        if args.quick { " --quick" } else { "" },
    )
}

fn specs(services: usize) -> Vec<BootstrapServiceSpec> {
    (0..services)
        .map(|k| BootstrapServiceSpec {
            name: format!("svc-{k}"),
            services: vec![ServiceSpec {
                name: "main".into(),
                image: "bench/noop:1".into(),
                command: vec!["sleep".into(), "infinity".into()],
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect()
}

/// Creates datacenters `from..to` with `concurrency` calls in flight;
/// returns (id, call start, call duration) of each.
async fn create(
    stack: &Stack,
    from: usize,
    to: usize,
    services: usize,
    concurrency: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<(String, Instant, Duration)>> {
    let specs = specs(services);
    let results: Vec<anyhow::Result<(String, Instant, Duration)>> = futures::stream::iter(from..to)
        .map(|i| {
            let mut client = stack.datacenters.clone();
            let specs = specs.clone();
            async move {
                let mut req = tonic::Request::new(dcpb::CreateDatacenterRequest {
                    datacenter: Some(dcpb::Datacenter {
                        name: format!("bench-{i}"),
                        provider_name: stack::PROVIDER.into(),
                        region: "bench".into(),
                        bootstrap_services: specs,
                        ..Default::default()
                    }),
                });
                req.set_timeout(timeout);
                let start = Instant::now();
                let dc = client
                    .create_datacenter(req)
                    .await
                    .with_context(|| format!("CreateDatacenter bench-{i}"))?
                    .into_inner()
                    .datacenter
                    .context("CreateDatacenter: empty answer")?;
                Ok((dc.id, start, start.elapsed()))
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn latency(
    stack: &Stack,
    datacenters: usize,
    services: usize,
    concurrency: usize,
    timeout: Duration,
) -> anyhow::Result<String> {
    let tracker = Tracker::start(stack, services).await?;
    let t0 = Instant::now();
    let created = create(stack, 0, datacenters, services, concurrency, timeout).await?;
    let created_in = t0.elapsed();
    let ids: Vec<String> = created.iter().map(|c| c.0.clone()).collect();
    let done = tracker.wait_done(&ids, timeout).await?;
    let mut e2e: Vec<Duration> = created
        .iter()
        .zip(&done)
        .map(|((_, start, _), end)| end.saturating_duration_since(*start))
        .collect();
    let mut calls: Vec<Duration> = created.iter().map(|c| c.2).collect();
    let total = done
        .iter()
        .max()
        .map_or(Duration::ZERO, |last| last.saturating_duration_since(t0));
    let counts = tracker.counts();
    let workloads = datacenters * services;
    let mut out = format!(
        "\n## create → all running ({datacenters} datacenters × {services} services, \
         {concurrency} creates in flight, watch-driven)\n\n\
         | measure | p50 | p90 | p99 | max |\n|---|---|---|---|---|\n"
    );
    out.push_str(&row("CreateDatacenter → all RUNNING", &mut e2e));
    out.push_str(&row("CreateDatacenter call alone", &mut calls));
    out.push_str(&format!(
        "\nall {datacenters} created in {}; all running after {}: \
         throughput {:.1} datacenters/s ({:.1} workloads/s); \
         {} bootstrap events, {} `failed`; fast agent: {} provisions, {} instances\n\
         scheduler worker runs since start (1 = only the run at start): {}\n",
        fmt(created_in),
        fmt(total),
        per_sec(datacenters, total),
        per_sec(workloads, total),
        counts.events,
        counts.failed,
        stack.agent.provisions(),
        stack.agent.len(),
        stack.worker_runs().await?,
    ));
    Ok(out)
}

async fn resync(
    stack: &Stack,
    sizes: &[usize],
    services: usize,
    timeout: Duration,
) -> anyhow::Result<String> {
    let tracker = Tracker::start(stack, services).await?;
    let mut out = format!(
        "\n## no-op resync: one RunWorker(\"reconciler\") pass over N converged \
         datacenters ({services} services each)\n\n\
         | N | setup: create + converge | resync pass (client) | per datacenter | \
         worker last_duration | events / provisions during pass |\n\
         |---|---|---|---|---|---|\n"
    );
    let mut have = 0;
    for &n in sizes {
        eprintln!("  creating datacenters {have}..{n} and waiting for convergence");
        let t0 = Instant::now();
        let created = create(stack, have, n, services, SETUP_CONCURRENCY, timeout).await?;
        let ids: Vec<String> = created.into_iter().map(|c| c.0).collect();
        tracker.wait_done(&ids, timeout).await?;
        let setup = t0.elapsed();
        have = n;
        // The last watch-driven reconciles may still be writing.
        tracker.wait_quiet(Duration::from_secs(1), timeout).await?;
        let before = (tracker.counts(), stack.agent.provisions());
        eprintln!("  {n} converged in {}; running the reconciler", fmt(setup));
        let mut req = tonic::Request::new(scpb::RunWorkerRequest {
            name: "reconciler".into(),
            datacenter_id: String::new(),
        });
        req.set_timeout(timeout);
        let start = Instant::now();
        let info = stack
            .scheduler
            .clone()
            .run_worker(req)
            .await
            .context("RunWorker reconciler")?
            .into_inner()
            .worker
            .context("RunWorker: no worker in the answer")?;
        let pass = start.elapsed();
        if !info.last_error.is_empty() {
            bail!(
                "the reconciler pass over {n} datacenters failed: {}",
                info.last_error
            );
        }
        // Anything the pass caused would show up as events shortly after.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = (tracker.counts(), stack.agent.provisions());
        let server = info
            .last_duration
            .map(|d| {
                Duration::new(
                    u64::try_from(d.seconds).unwrap_or(0),
                    u32::try_from(d.nanos).unwrap_or(0),
                )
            })
            .map_or_else(|| "-".to_string(), fmt);
        let line = format!(
            "| {n} | {} | {} | {} | {server} | {} / {} |\n",
            fmt(setup),
            fmt(pass),
            fmt(pass / u32::try_from(n).unwrap_or(u32::MAX)),
            after.0.events - before.0.events,
            after.1 - before.1,
        );
        eprint!("  {line}");
        out.push_str(&line);
    }
    out.push_str(&format!(
        "\nscheduler worker runs since start (1 at start + {} RunWorker for the reconciler): {}\n",
        sizes.len(),
        stack.worker_runs().await?
    ));
    Ok(out)
}

/// A table row of percentiles (sorts `v`).
fn row(name: &str, v: &mut [Duration]) -> String {
    v.sort_unstable();
    format!(
        "| {name} | {} | {} | {} | {} |\n",
        fmt(pct(v, 50.0)),
        fmt(pct(v, 90.0)),
        fmt(pct(v, 99.0)),
        fmt(v.last().copied().unwrap_or_default()),
    )
}

/// Nearest-rank percentile of a sorted slice.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[allow(clippy::cast_precision_loss)]
fn per_sec(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// `1.23 s`, `45.6 ms` or `789 µs`.
fn fmt(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 0.001 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(pct(&v, 50.0), Duration::from_millis(50));
        assert_eq!(pct(&v, 99.0), Duration::from_millis(99));
        assert_eq!(pct(&v, 100.0), Duration::from_millis(100));
        assert_eq!(pct(&[], 50.0), Duration::ZERO);
        assert_eq!(pct(&v[..1], 1.0), Duration::from_millis(1));
    }

    #[test]
    fn resync_sizes_parse() {
        assert_eq!(
            parse_sizes("100, 1000,10000").unwrap().0,
            [100, 1000, 10_000]
        );
        assert!(parse_sizes("").unwrap().0.is_empty());
        assert!(parse_sizes("10k").is_err());
    }
}
