//! The conformance suite (`kube-ccm-conformance`) against the GCE provider on the Compute test double:
//! a double of its own per check, read back directly (its instances, target pools, routes and write log),
//! with its fault and latency knobs for the outage and the slow cloud.

use std::sync::Arc;
use std::time::Duration;

use compute_double::{ComputeDouble, Fault};
use google_cloud_compute_v1::model;
use k8s_openapi::api::core::v1::Node;
use kube_ccm_conformance::{CloudLoadBalancer, CloudRoute, Fixture, FixtureError, async_trait};
use kube_ccm_gce::{CloudConfig, GceProvider};
use kube_ccm_provider::CloudProvider;

const PROJECT: &str = "test-project";
const ZONE: &str = "us-central1-a";

struct GceFixture {
    double: ComputeDouble,
    launched: parking_lot::Mutex<u32>,
}

async fn gce() -> GceFixture {
    GceFixture {
        double: ComputeDouble::start().await.expect("the Compute double starts"),
        launched: parking_lot::Mutex::new(0),
    }
}

/// The last segment of a Compute URL (an instance's name in a target pool's list).
fn last_segment(url: &str) -> String {
    url.rsplit('/').next().unwrap_or_default().to_owned()
}

#[async_trait]
impl Fixture for GceFixture {
    async fn provider(&self) -> Result<Arc<dyn CloudProvider>, FixtureError> {
        let text = format!(
            "[global]\nproject-id = {PROJECT}\nlocal-zone = {ZONE}\nnetwork-name = default\nnode-tags = cluster-node\napi-endpoint = {}\n",
            self.double.endpoint()
        );
        let provider = GceProvider::new(CloudConfig::parse(&text)?.config).await?;
        provider.set_cluster_id("c1d2e3f4a5b6c7d8");
        Ok(Arc::new(provider))
    }

    async fn launch(&self, name: &str) -> Result<Node, FixtureError> {
        let n = {
            let mut launched = self.launched.lock();
            *launched += 1;
            *launched
        };
        let instance: model::Instance = serde_json::from_value(serde_json::json!({
            "name": name,
            "status": "RUNNING",
            "machineType": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/e2-standard-4"),
            "networkInterfaces": [{"networkIP": format!("10.0.0.{n}")}],
        }))?;
        self.double.put_instance(PROJECT, ZONE, instance);
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}}),
        )?)
    }

    async fn stop(&self, name: &str) -> Result<(), FixtureError> {
        // Compute calls a stopped instance TERMINATED; it still exists.
        if !self.double.set_instance_status(PROJECT, ZONE, name, "TERMINATED") {
            return Err(format!("no instance {name}").into());
        }
        Ok(())
    }

    async fn terminate(&self, name: &str) -> Result<(), FixtureError> {
        if !self.double.delete_instance(PROJECT, ZONE, name) {
            return Err(format!("no instance {name}").into());
        }
        Ok(())
    }

    async fn load_balancers(&self) -> Result<Vec<CloudLoadBalancer>, FixtureError> {
        Ok(self
            .double
            .target_pools(PROJECT)
            .into_iter()
            .map(|pool| {
                let nodes = pool.instances.iter().map(|url| last_segment(url));
                CloudLoadBalancer::new(pool.name.unwrap_or_default(), nodes)
            })
            .collect())
    }

    async fn routes(&self) -> Result<Vec<CloudRoute>, FixtureError> {
        Ok(self
            .double
            .routes(PROJECT)
            .into_iter()
            .filter_map(|route| {
                let node = last_segment(route.next_hop_instance.as_deref()?);
                Some(CloudRoute::new(node, route.dest_range?))
            })
            .collect())
    }

    async fn writes(&self) -> Result<u64, FixtureError> {
        Ok(self.double.writes().len() as u64)
    }

    async fn set_outage(&self, outage: bool) -> Result<(), FixtureError> {
        if outage {
            self.double.fail_requests(Fault {
                method: None,
                path_contains: "/compute/".into(),
                status: 503,
                reason: "backendError".into(),
                times: u32::MAX,
            });
        } else {
            self.double.clear_faults();
        }
        Ok(())
    }

    async fn set_latency(&self, latency: Duration) -> Result<(), FixtureError> {
        self.double.set_latency(latency);
        Ok(())
    }
}

kube_ccm_conformance::contract_suite!(gce);
kube_ccm_conformance::negative_controls!(gce);
kube_ccm_conformance::controllers_suite!(gce);
kube_ccm_conformance::fencing_suite!(gce);
