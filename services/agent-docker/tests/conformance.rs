//! The provider conformance kit against the Docker agent and the real
//! Docker engine, one fresh agent (with its own scope) per check.

mod common;

use common::{Sweeper, TestAgent, docker_config, require_testapp_image, scope};
use ctrlplane_conformance::Harness;

async fn start_agent() -> Harness {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    require_testapp_image();
    let dir = tempfile::tempdir().expect("temp dir");
    let scope = scope();
    let agent = TestAgent::start(docker_config(dir.path(), &scope)).await;
    let harness = agent.harness(Box::new(()));
    Harness {
        // Dropped in order: the agent stops, then the scope is swept.
        guard: Box::new((agent, Sweeper(scope), dir)),
        ..harness
    }
}

ctrlplane_conformance::conformance_tests!(start_agent);
