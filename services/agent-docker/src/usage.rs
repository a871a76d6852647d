//! GetResources from the engine's stats: one sample per running container
//! (the engine measures CPU over about a second), summed per instance.
//! `disk_bytes` is not reported (it would need a size scan of every
//! container's writable layer).

use bollard::models::ContainerStatsResponse;
use bollard::query_parameters::StatsOptionsBuilder;
use ctrlplane_agent::provider::Result;
use ctrlplane_proto::provider::v1 as pb;
use futures::StreamExt;
use futures::future::join_all;

use crate::engine::Engine;
use crate::state::{Instance, timestamp};

/// CPU percent (100 = one core) and memory in use (without the page
/// cache) of one stats sample.
pub fn usage_of(s: &ContainerStatsResponse) -> (f64, i64) {
    let cpu = (|| {
        let cur = s.cpu_stats.as_ref()?;
        let pre = s.precpu_stats.as_ref()?;
        let total = cur.cpu_usage.as_ref()?.total_usage? as f64;
        let pre_total = pre.cpu_usage.as_ref()?.total_usage.unwrap_or(0) as f64;
        let system = cur.system_cpu_usage? as f64;
        let pre_system = pre.system_cpu_usage.unwrap_or(0) as f64;
        let cpus = f64::from(cur.online_cpus.unwrap_or(1).max(1));
        let (d, ds) = (total - pre_total, system - pre_system);
        (d > 0.0 && ds > 0.0).then(|| d / ds * cpus * 100.0)
    })()
    .unwrap_or(0.0);
    let mem = s.memory_stats.as_ref().map_or(0, |m| {
        let usage = m.usage.unwrap_or(0);
        let cache = m
            .stats
            .as_ref()
            .and_then(|st| st.get("inactive_file").or_else(|| st.get("cache")).copied())
            .unwrap_or(0);
        usage.saturating_sub(cache) as i64
    });
    (cpu, mem)
}

/// The instance's usage now.
///
/// # Errors
/// Engine errors.
pub async fn collect(engine: &Engine, inst: &Instance) -> Result<pb::ResourceUsage> {
    let d = engine.client().await?;
    let running: Vec<_> = inst.current().filter(|c| c.running()).collect();
    let samples = join_all(running.iter().map(|c| {
        let d = d.clone();
        async move {
            let opts = StatsOptionsBuilder::default().stream(false).build();
            let mut s = d.stats(&c.name, Some(opts));
            match s.next().await {
                Some(Ok(stats)) => Ok(Some(stats)),
                Some(Err(e)) if crate::engine::is_not_found(&e) => Ok(None),
                Some(Err(e)) => Err(engine.err(&format!("stats of {}", c.name), e)),
                None => Ok(None),
            }
        }
    }))
    .await;
    let mut usage = pb::ResourceUsage {
        sample_time: Some(timestamp(chrono::Utc::now())),
        ..Default::default()
    };
    for (c, sample) in running.iter().zip(samples) {
        let Some(stats) = sample? else { continue };
        let (cpu, mem) = usage_of(&stats);
        usage.cpu_percent += cpu;
        usage.memory_bytes += mem;
        usage.services.push(pb::ServiceUsage {
            service_name: c.service.clone(),
            replica: c.replica as i32,
            cpu_percent: cpu,
            memory_bytes: mem,
            disk_bytes: 0,
        });
    }
    Ok(usage)
}
