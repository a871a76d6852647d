//! The provider conformance kit against the process agent, started
//! in-process on a free port with an empty state directory per check.

mod common;

use common::{Sweeper, TestAgent, agent_config};
use ctrlplane_conformance::Harness;

/// A fresh agent; its guard halts it (killing its process groups), sweeps
/// any process left under its state dir, then removes the dir.
async fn start_agent() -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = TestAgent::start(agent_config(dir.path())).await;
    let sweeper = Sweeper(dir.path().to_path_buf());
    let harness = agent.harness(Box::new(()));
    Harness {
        guard: Box::new((agent, sweeper, dir)),
        ..harness
    }
}

ctrlplane_conformance::conformance_tests!(start_agent);
