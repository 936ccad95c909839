//! The three suites against the fake provider over its HTTP cloud (as the binary runs it: `endpoint` in the
//! cloud-config), with the negative controls: the same fixture with broken providers fails.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube_ccm_conformance::{
    CloudLoadBalancer, CloudProvider, CloudRoute, Fixture, FixtureError, async_trait,
};
use kube_ccm_fake::{
    AdminRequest, CloudRequest, CloudResponse, FakeCloud, FakeCloudConfig, FakeCloudServer, FakeInstance,
    FakeProvider, InstanceState, Knobs,
};

/// A fake cloud served over HTTP; each provider is a client of it.
struct FakeFixture {
    server: FakeCloudServer,
    knobs: Mutex<Knobs>,
    launched: Mutex<u32>,
}

async fn fake() -> FakeFixture {
    let server = FakeCloudServer::start(FakeCloud::default(), ([127, 0, 0, 1], 0).into())
        .await
        .expect("the fake cloud serves");
    FakeFixture {
        server,
        knobs: Mutex::new(Knobs::default()),
        launched: Mutex::new(0),
    }
}

impl FakeFixture {
    async fn admin(&self, request: AdminRequest) -> Result<CloudResponse, FixtureError> {
        match self.server.cloud().handle(CloudRequest::Admin(request)).await {
            CloudResponse::Error { message, .. } => Err(message.into()),
            answer => Ok(answer),
        }
    }

    async fn knobs(&self, change: impl FnOnce(&mut Knobs)) -> Result<(), FixtureError> {
        let knobs = {
            let mut knobs = self.knobs.lock();
            change(&mut knobs);
            *knobs
        };
        self.admin(AdminRequest::SetKnobs(knobs)).await.map(|_| ())
    }

    async fn set_state(&self, name: &str, state: InstanceState) -> Result<(), FixtureError> {
        let request = AdminRequest::SetInstanceState {
            name: name.into(),
            state,
        };
        self.admin(request).await.map(|_| ())
    }

    async fn snapshot(&self) -> Result<CloudResponse, FixtureError> {
        self.admin(AdminRequest::Snapshot).await
    }
}

#[async_trait]
impl Fixture for FakeFixture {
    async fn provider(&self) -> Result<Arc<dyn CloudProvider>, FixtureError> {
        let config = FakeCloudConfig {
            endpoint: Some(self.server.url().to_owned()),
            ..FakeCloudConfig::default()
        };
        Ok(Arc::new(FakeProvider::new(config)))
    }

    async fn launch(&self, name: &str) -> Result<Node, FixtureError> {
        let index = {
            let mut launched = self.launched.lock();
            *launched += 1;
            *launched
        };
        self.admin(AdminRequest::PutInstance(FakeInstance::running(name, index)))
            .await?;
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}}),
        )?)
    }

    async fn stop(&self, name: &str) -> Result<(), FixtureError> {
        self.set_state(name, InstanceState::Stopped).await
    }

    async fn terminate(&self, name: &str) -> Result<(), FixtureError> {
        self.set_state(name, InstanceState::Terminated).await
    }

    async fn load_balancers(&self) -> Result<Vec<CloudLoadBalancer>, FixtureError> {
        match self.snapshot().await? {
            CloudResponse::Snapshot { load_balancers, .. } => Ok(load_balancers
                .into_iter()
                .map(|lb| CloudLoadBalancer::new(lb.name, lb.nodes))
                .collect()),
            other => Err(format!("unexpected answer {other:?}").into()),
        }
    }

    async fn routes(&self) -> Result<Vec<CloudRoute>, FixtureError> {
        match self.snapshot().await? {
            CloudResponse::Snapshot { routes, .. } => Ok(routes
                .into_iter()
                .map(|r| CloudRoute::new(r.target_node, r.destination_cidr))
                .collect()),
            other => Err(format!("unexpected answer {other:?}").into()),
        }
    }

    async fn writes(&self) -> Result<u64, FixtureError> {
        match self.admin(AdminRequest::Writes { from: 0 }).await? {
            CloudResponse::Writes { writes } => Ok(writes.len() as u64),
            other => Err(format!("unexpected answer {other:?}").into()),
        }
    }

    async fn set_outage(&self, outage: bool) -> Result<(), FixtureError> {
        self.knobs(|k| k.error_rate = if outage { 1.0 } else { 0.0 })
            .await
    }

    async fn set_latency(&self, latency: Duration) -> Result<(), FixtureError> {
        let ms = u64::try_from(latency.as_millis())?;
        self.knobs(|k| k.latency_ms = ms).await
    }
}

kube_ccm_conformance::contract_suite!(fake);
kube_ccm_conformance::negative_controls!(fake);
kube_ccm_conformance::controllers_suite!(fake);
kube_ccm_conformance::fencing_suite!(fake);
