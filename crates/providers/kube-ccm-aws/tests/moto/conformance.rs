//! The conformance suite (`kube-ccm-conformance`) against the AWS provider on moto: a fixture over a
//! moto of its own per check, the provider reaching it through a recording proxy (the cloud's writes
//! counted as CloudTrail would, an outage and a latency made there), and the cloud read straight from moto.

use parking_lot::Mutex;
use std::collections::BTreeMap;

use kube_ccm_conformance::{CloudLoadBalancer, CloudRoute, Fixture, FixtureError, async_trait};

use super::*;

struct AwsFixture {
    cloud: Option<Cloud>,
}

/// moto, the proxy in front of it, and the network the cluster's instances run in.
struct Cloud {
    moto: Moto,
    proxy: harness::aws::RecordingProxy,
    net: Network,
    route_table: String,
    /// The fixture's instance names → (instance ID, private DNS name: the node's name).
    instances: Mutex<BTreeMap<String, (String, String)>>,
}

async fn aws() -> AwsFixture {
    let Some(moto) = Moto::start() else {
        return AwsFixture { cloud: None };
    };
    let ec2 = moto.ec2();
    let net = network(&ec2, 1).await;
    let table = ec2.create_route_table().vpc_id(&net.vpc).send().await.unwrap();
    let route_table = table.route_table().unwrap().route_table_id().unwrap().to_owned();
    ec2.create_tags()
        .resources(&route_table)
        .tags(
            Tag::builder()
                .key("kubernetes.io/cluster/test")
                .value("owned")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let proxy = harness::aws::RecordingProxy::start(moto.0.url()).await.unwrap();
    // moto lacks DescribeInstanceTopology: EC2's answer for types without a topology.
    proxy.answer("DescribeInstanceTopology", harness::aws::no_instance_topology);
    AwsFixture {
        cloud: Some(Cloud {
            moto,
            proxy,
            net,
            route_table,
            instances: Mutex::default(),
        }),
    }
}

impl AwsFixture {
    fn cloud(&self) -> Result<&Cloud, FixtureError> {
        self.cloud.as_ref().ok_or_else(|| "moto is not installed".into())
    }

    fn instance(&self, name: &str) -> Result<(String, String), FixtureError> {
        let cloud = self.cloud()?;
        let instances = cloud.instances.lock();
        instances
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no instance was launched for {name}").into())
    }

    /// Private DNS names by instance ID, for every instance the fixture launched.
    fn names_by_id(&self) -> Result<BTreeMap<String, String>, FixtureError> {
        let cloud = self.cloud()?;
        let instances = cloud.instances.lock();
        Ok(instances
            .values()
            .map(|(id, dns)| (id.clone(), dns.clone()))
            .collect())
    }
}

#[async_trait]
impl Fixture for AwsFixture {
    fn unavailable(&self) -> Option<String> {
        self.cloud
            .is_none()
            .then(|| "moto is not installed under the target directory (cargo xtask test installs it)".into())
    }

    async fn provider(&self) -> Result<Arc<dyn CloudProvider>, FixtureError> {
        let cloud = self.cloud()?;
        Ok(Arc::new(cloud.moto.provider_via(&cloud.proxy.url, "")))
    }

    async fn launch(&self, name: &str) -> Result<Node, FixtureError> {
        let cloud = self.cloud()?;
        let started = cloud
            .moto
            .ec2()
            .run_instances()
            .image_id("ami-12c6146b")
            .instance_type(InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .subnet_id(&cloud.net.subnets[0])
            .security_group_ids(&cloud.net.node_group)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Instance)
                    .tags(
                        Tag::builder()
                            .key("kubernetes.io/cluster/test")
                            .value("owned")
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await?;
        let instance = started
            .instances()
            .first()
            .ok_or("RunInstances started nothing")?;
        let id = instance.instance_id().ok_or("no instance ID")?.to_owned();
        let dns = instance
            .private_dns_name()
            .ok_or("no private DNS name")?
            .to_owned();
        cloud.instances.lock().insert(name.to_owned(), (id, dns.clone()));
        // The kubelet registers the node under the instance's private DNS name.
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": dns}}),
        )?)
    }

    async fn stop(&self, name: &str) -> Result<(), FixtureError> {
        let (id, _) = self.instance(name)?;
        self.cloud()?
            .moto
            .ec2()
            .stop_instances()
            .instance_ids(id)
            .send()
            .await?;
        Ok(())
    }

    async fn terminate(&self, name: &str) -> Result<(), FixtureError> {
        let (id, _) = self.instance(name)?;
        self.cloud()?
            .moto
            .ec2()
            .terminate_instances()
            .instance_ids(id)
            .send()
            .await?;
        Ok(())
    }

    async fn load_balancers(&self) -> Result<Vec<CloudLoadBalancer>, FixtureError> {
        let names = self.names_by_id()?;
        let described = elb(&self.cloud()?.moto).describe_load_balancers().send().await?;
        Ok(described
            .load_balancer_descriptions()
            .iter()
            .map(|lb| {
                let nodes = lb
                    .instances()
                    .iter()
                    .filter_map(|i| i.instance_id())
                    .map(|id| names.get(id).cloned().unwrap_or_else(|| id.to_owned()));
                CloudLoadBalancer::new(lb.load_balancer_name().unwrap_or_default(), nodes)
            })
            .collect())
    }

    async fn routes(&self) -> Result<Vec<CloudRoute>, FixtureError> {
        let names = self.names_by_id()?;
        let cloud = self.cloud()?;
        let tables = cloud
            .moto
            .ec2()
            .describe_route_tables()
            .route_table_ids(&cloud.route_table)
            .send()
            .await?;
        Ok(tables
            .route_tables()
            .iter()
            .flat_map(|t| t.routes())
            .filter_map(|r| {
                let id = r.instance_id()?;
                let node = names.get(id).cloned().unwrap_or_else(|| id.to_owned());
                Some(CloudRoute::new(node, r.destination_cidr_block()?))
            })
            .collect())
    }

    async fn writes(&self) -> Result<u64, FixtureError> {
        let requests = self.cloud()?.proxy.requests();
        Ok(requests.iter().filter(|r| r.is_write()).count() as u64)
    }

    async fn set_outage(&self, outage: bool) -> Result<(), FixtureError> {
        self.cloud()?.proxy.set_outage(outage);
        Ok(())
    }

    async fn set_latency(&self, latency: Duration) -> Result<(), FixtureError> {
        self.cloud()?.proxy.set_latency(latency);
        Ok(())
    }
}

kube_ccm_conformance::contract_suite!(aws);
kube_ccm_conformance::negative_controls!(aws);
kube_ccm_conformance::controllers_suite!(aws);
kube_ccm_conformance::fencing_suite!(aws);
