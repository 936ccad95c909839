//! The conformance suites against this provider, as a vendor runs them: a fixture over the cloud (here the
//! state file; for a real cloud, a test account or an emulator), then one line per suite and one for the
//! negative controls.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube_ccm::k8s_openapi::api::core::v1::Node;
use kube_ccm::provider::CloudProvider;
use kube_ccm_conformance::{CloudLoadBalancer, CloudRoute, Fixture, FixtureError, async_trait};
use provider_example::cloud::{Instance, State};

// ANCHOR: fixture
/// The cloud in a temporary state file. Changes the fixture makes go to the file directly, not through
/// the cloud's API, so they are not in its audit log.
struct ExampleFixture {
    dir: tempfile::TempDir,
}

async fn example() -> ExampleFixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("state.json"), "{}").expect("an empty cloud");
    ExampleFixture { dir }
}

impl ExampleFixture {
    fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    fn read(&self) -> Result<State, FixtureError> {
        Ok(serde_json::from_slice(&std::fs::read(self.state_path())?)?)
    }

    fn change(&self, change: impl FnOnce(&mut State)) -> Result<(), FixtureError> {
        let mut state = self.read()?;
        change(&mut state);
        std::fs::write(self.state_path(), serde_json::to_vec(&state)?)?;
        Ok(())
    }

    fn set_instance_state(&self, name: &str, to: &str) -> Result<(), FixtureError> {
        self.change(|state| {
            for instance in state.instances.iter_mut().filter(|i| i.name == name) {
                instance.state = to.into();
            }
        })
    }
}

#[async_trait]
impl Fixture for ExampleFixture {
    async fn provider(&self) -> Result<Arc<dyn CloudProvider>, FixtureError> {
        let config = serde_json::json!({ "state": self.state_path() });
        provider_example::factory(Some(config.to_string().into_bytes())).await
    }

    async fn launch(&self, name: &str) -> Result<Node, FixtureError> {
        self.change(|state| {
            let n = state.instances.len() + 1;
            state.instances.push(Instance {
                id: format!("i-{n}"),
                name: name.into(),
                instance_type: "small".into(),
                zone: "zone-a".into(),
                address: format!("10.0.0.{n}"),
                state: "running".into(),
                tags: Default::default(),
                pod_cidrs: Vec::new(),
            });
        })?;
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}}),
        )?)
    }

    async fn stop(&self, name: &str) -> Result<(), FixtureError> {
        self.set_instance_state(name, "stopped")
    }

    async fn terminate(&self, name: &str) -> Result<(), FixtureError> {
        self.set_instance_state(name, "terminated")
    }

    async fn load_balancers(&self) -> Result<Vec<CloudLoadBalancer>, FixtureError> {
        Ok(self
            .read()?
            .load_balancers
            .into_iter()
            .map(|lb| CloudLoadBalancer::new(lb.name, lb.nodes))
            .collect())
    }

    async fn routes(&self) -> Result<Vec<CloudRoute>, FixtureError> {
        Ok(self
            .read()?
            .routes
            .into_iter()
            .map(|r| CloudRoute::new(r.node, r.cidr))
            .collect())
    }

    async fn writes(&self) -> Result<u64, FixtureError> {
        match std::fs::read_to_string(self.dir.path().join("state.writes")) {
            Ok(log) => Ok(log.lines().count() as u64),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    async fn set_outage(&self, outage: bool) -> Result<(), FixtureError> {
        // The state file out of the cloud's reach: every request fails.
        let away = self.dir.path().join("state.away");
        if outage {
            std::fs::rename(self.state_path(), away)?;
        } else {
            std::fs::rename(away, self.state_path())?;
        }
        Ok(())
    }

    async fn set_latency(&self, latency: Duration) -> Result<(), FixtureError> {
        let ms = u64::try_from(latency.as_millis())?;
        self.change(|state| state.latency_ms = ms)
    }
}

kube_ccm_conformance::contract_suite!(example);
kube_ccm_conformance::negative_controls!(example);
kube_ccm_conformance::controllers_suite!(example);
kube_ccm_conformance::fencing_suite!(example);
// ANCHOR_END: fixture
