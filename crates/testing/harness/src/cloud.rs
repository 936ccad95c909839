//! The cloud a control plane manages: how a replica reaches it (provider, cloud-config, environment),
//! how the workload makes an instance for a node, the cloud's own record of who changed it when (for the
//! audit), and what it holds at the end.
//!
//! Three clouds: the fake cloud (its own log of applied changes, with callers), AWS (moto behind a
//! recording proxy: every request's action and `User-Agent`, as CloudTrail records them), and GCE (the
//! Compute double's log of write requests with their `User-Agent`). The AWS and GCE providers name the
//! calling controller in every request's `User-Agent`, so writes are attributed to a process and a
//! controller exactly as Kubernetes writes are.

use std::sync::Arc;

use anyhow::{Result, bail};
use ccm_audit::{CLOUD_VERB, RequestEntry, UserAgent};

use crate::Moto;
use crate::aws::{self, RecordingProxy};

/// The cloud of a control plane. Cheap to clone: the clouds are shared.
#[derive(Clone)]
pub enum Cloud {
    /// The fake cloud at a URL.
    Fake(kube_ccm_fake::FakeCloudClient),
    /// AWS: moto behind a recording proxy.
    Aws(Arc<AwsCloud>),
    /// GCE: the Compute double.
    #[cfg(feature = "gce")]
    Gce(Arc<GceCloud>),
}

/// A load balancer, as the cloud holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudLoadBalancer {
    /// Its name.
    pub name: String,
    /// Its address (DNS name or IP).
    pub address: String,
    /// The instances it sends traffic to.
    pub backends: usize,
}

/// What a cloud holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Instances (running or not, but not terminated).
    pub instances: usize,
    /// Load balancers.
    pub load_balancers: Vec<CloudLoadBalancer>,
    /// Routes to pod ranges.
    pub routes: usize,
}

/// The cloud's record of the changes made to it.
#[derive(Debug, Clone, Default)]
pub struct CloudWrites {
    /// Each successful change made by a controller manager, as the audit's request records (path
    /// `cloud:<operation>`, verb `cloud`, judged by time against its caller's tenure).
    pub attributed: Vec<RequestEntry>,
    /// Successful changes whose request named no controller manager: none may be, or the audit could not
    /// judge them. Their operations.
    pub unattributed: Vec<String>,
}

impl CloudWrites {
    fn add(&mut self, time_us: i64, operation: String, caller: Option<UserAgent>) {
        match caller {
            Some(caller) => self.attributed.push(RequestEntry {
                time_us,
                method: "POST".to_owned(),
                path: format!("cloud:{operation}"),
                user_agent: caller.render(),
                verb: Some(CLOUD_VERB.to_owned()),
                status: 200,
                resource_version: None,
                received_us: None,
            }),
            None => self.unattributed.push(operation),
        }
    }
}

impl Cloud {
    /// The fake cloud at `url`.
    pub fn fake(url: &str) -> Cloud {
        Cloud::Fake(kube_ccm_fake::FakeCloudClient::new(url))
    }

    /// `--cloud-provider`.
    pub fn provider(&self) -> &'static str {
        match self {
            Cloud::Fake(_) => "fake",
            Cloud::Aws(_) => "aws",
            #[cfg(feature = "gce")]
            Cloud::Gce(_) => "gce",
        }
    }

    /// The replicas' `--cloud-config` file's content.
    pub fn cloud_config(&self) -> String {
        match self {
            Cloud::Fake(client) => format!("endpoint: {}\n", client.url()),
            Cloud::Aws(cloud) => aws::cloud_config(&cloud.proxy.url, None),
            #[cfg(feature = "gce")]
            Cloud::Gce(cloud) => cloud.cloud_config(),
        }
    }

    /// The replicas' environment for this cloud (credentials, metadata server).
    pub fn environment(&self) -> Vec<(String, String)> {
        let pairs: Vec<(&str, String)> = match self {
            Cloud::Fake(_) => Vec::new(),
            Cloud::Aws(_) => aws::MOTO_ENVIRONMENT
                .iter()
                .map(|&(key, value)| (key, value.to_owned()))
                .collect(),
            #[cfg(feature = "gce")]
            Cloud::Gce(cloud) => vec![("GCE_METADATA_HOST", cloud.double.addr().to_string())],
        };
        pairs
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect()
    }

    /// Makes the instance of node `index`; returns the node's name (the name the provider finds the
    /// instance by).
    pub async fn add_instance(&self, index: u32) -> Result<String> {
        match self {
            Cloud::Fake(client) => {
                use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, FakeInstance};
                let name = format!("node-{index}");
                let request =
                    CloudRequest::Admin(AdminRequest::PutInstance(FakeInstance::running(&name, index)));
                if let CloudResponse::Error { message, .. } = client.call(&request).await {
                    bail!("cannot add instance {name}: {message}");
                }
                Ok(name)
            }
            Cloud::Aws(cloud) => {
                let names = aws::run_instances(cloud.moto.url(), 1).await?;
                Ok(names.into_iter().next().unwrap_or_default())
            }
            #[cfg(feature = "gce")]
            Cloud::Gce(cloud) => Ok(cloud.add_instance(index)),
        }
    }

    /// The changes made to the cloud so far, by whom.
    pub async fn writes(&self) -> Result<CloudWrites> {
        let mut writes = CloudWrites::default();
        match self {
            Cloud::Fake(client) => {
                let url = client.url().to_owned();
                writes.attributed = crate::cloud_writes(&url).await?;
            }
            Cloud::Aws(cloud) => {
                for request in cloud.proxy.requests() {
                    if request.is_write() && (200..300).contains(&request.status) {
                        writes.add(request.time_us, request.action.clone(), request.caller());
                    }
                }
            }
            #[cfg(feature = "gce")]
            Cloud::Gce(cloud) => {
                for write in cloud.double.writes() {
                    if (200..300).contains(&write.status) {
                        let operation = format!("{} {}", write.method, write.path);
                        writes.add(write.time_us, operation, UserAgent::parse(&write.user_agent));
                    }
                }
            }
        }
        Ok(writes)
    }

    /// What the cloud holds now.
    pub async fn inventory(&self) -> Result<Inventory> {
        match self {
            Cloud::Fake(client) => {
                use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse};
                match client.call(&CloudRequest::Admin(AdminRequest::Snapshot)).await {
                    CloudResponse::Snapshot {
                        instances,
                        load_balancers,
                        routes,
                        ..
                    } => Ok(Inventory {
                        instances: instances.len(),
                        load_balancers: load_balancers
                            .into_iter()
                            .map(|lb| CloudLoadBalancer {
                                name: lb.name,
                                address: lb.ip,
                                backends: lb.nodes.len(),
                            })
                            .collect(),
                        routes: routes.len(),
                    }),
                    other => bail!("the fake cloud answered a snapshot with {other:?}"),
                }
            }
            Cloud::Aws(cloud) => cloud.inventory().await,
            #[cfg(feature = "gce")]
            Cloud::Gce(cloud) => Ok(cloud.inventory()),
        }
    }
}

/// moto, set up as a cluster's account (its default subnet in [`aws::ZONE`] and the default VPC's main
/// route table tagged for the cluster, so load balancers and routes find them), behind a
/// [`RecordingProxy`] the replicas are pointed at.
pub struct AwsCloud {
    moto: Moto,
    proxy: RecordingProxy,
    route_table: String,
}

impl AwsCloud {
    /// Sets `moto` up and starts the proxy in front of it.
    pub async fn start(moto: Moto) -> Result<AwsCloud> {
        let url = moto.url().to_owned();
        let subnet = aws::default_subnet(&url).await?;
        aws::tag_for_cluster(&url, &subnet, "shared").await?;
        let subnets = aws::ec2_query(
            &url,
            &[
                ("Action", "DescribeSubnets".to_owned()),
                ("SubnetId.1", subnet.clone()),
            ],
        )
        .await?;
        let Some(vpc) = aws::xml_values(&subnets, "vpcId").into_iter().next() else {
            bail!("moto's subnet {subnet} has no VPC");
        };
        let tables = aws::ec2_query(
            &url,
            &[
                ("Action", "DescribeRouteTables".to_owned()),
                ("Filter.1.Name", "vpc-id".to_owned()),
                ("Filter.1.Value.1", vpc.clone()),
                ("Filter.2.Name", "association.main".to_owned()),
                ("Filter.2.Value.1", "true".to_owned()),
            ],
        )
        .await?;
        let Some(route_table) = aws::xml_values(&tables, "routeTableId").into_iter().next() else {
            bail!("moto's VPC {vpc} has no main route table");
        };
        aws::tag_for_cluster(&url, &route_table, "owned").await?;
        let proxy = RecordingProxy::start(&url).await?;
        Ok(AwsCloud {
            moto,
            proxy,
            route_table,
        })
    }

    /// moto itself (not through the proxy).
    pub fn moto_url(&self) -> &str {
        self.moto.url()
    }

    /// The proxy the replicas use.
    pub fn proxy(&self) -> &RecordingProxy {
        &self.proxy
    }

    async fn inventory(&self) -> Result<Inventory> {
        let url = self.moto.url();
        let instances = aws::ec2_query(
            url,
            &[
                ("Action", "DescribeInstances".to_owned()),
                ("Filter.1.Name", "instance-state-name".to_owned()),
                ("Filter.1.Value.1", "running".to_owned()),
                ("Filter.1.Value.2", "stopped".to_owned()),
            ],
        )
        .await?;
        let elbs = aws::query(
            url,
            "elasticloadbalancing",
            &[
                ("Action", "DescribeLoadBalancers".to_owned()),
                ("Version", "2012-06-01".to_owned()),
            ],
        )
        .await?;
        // Each description begins with its name (the API's member order): one chunk per load balancer.
        let load_balancers = elbs
            .split("<LoadBalancerName>")
            .skip(1)
            .filter_map(|chunk| {
                let (name, description) = chunk.split_once("</LoadBalancerName>")?;
                Some(CloudLoadBalancer {
                    name: name.to_owned(),
                    address: aws::xml_values(description, "DNSName")
                        .into_iter()
                        .next()
                        .unwrap_or_default(),
                    backends: aws::xml_values(description, "InstanceId").len(),
                })
            })
            .collect();
        let tables = aws::ec2_query(
            url,
            &[
                ("Action", "DescribeRouteTables".to_owned()),
                ("RouteTableId.1", self.route_table.clone()),
            ],
        )
        .await?;
        Ok(Inventory {
            instances: aws::xml_values(&instances, "instanceId").len(),
            load_balancers,
            // Routes to instances (the VPC's own local route has none).
            routes: aws::xml_values(&tables, "instanceId").len(),
        })
    }
}

/// The Compute double as a cluster's project: instances in one zone, the metadata server's project and
/// zone set.
#[cfg(feature = "gce")]
pub struct GceCloud {
    double: compute_double::ComputeDouble,
}

#[cfg(feature = "gce")]
impl GceCloud {
    /// The project.
    pub const PROJECT: &'static str = "demo-project";
    /// The zone of the instances (and the managers' local zone).
    pub const ZONE: &'static str = "us-central1-a";

    /// A double on a free port, answering as the metadata server of an instance in [`GceCloud::ZONE`].
    pub async fn start() -> Result<GceCloud> {
        let double = compute_double::ComputeDouble::start().await?;
        double.set_metadata("project/project-id", Self::PROJECT);
        double.set_metadata(
            "instance/zone",
            &format!("projects/123456789/zones/{}", Self::ZONE),
        );
        Ok(GceCloud { double })
    }

    /// The double.
    pub fn double(&self) -> &compute_double::ComputeDouble {
        &self.double
    }

    fn cloud_config(&self) -> String {
        format!(
            "[global]\nnetwork-name = default\nnode-tags = cluster-node\napi-endpoint = {}\n",
            self.double.endpoint()
        )
    }

    fn add_instance(&self, index: u32) -> String {
        let name = format!("node-{index}");
        let (high, low) = (index / 250, index % 250 + 2);
        let instance = google_cloud_compute_v1::model::Instance::new()
            .set_name(name.clone())
            .set_machine_type(format!(
                "https://www.googleapis.com/compute/v1/projects/{}/zones/{}/machineTypes/e2-standard-4",
                Self::PROJECT,
                Self::ZONE
            ))
            .set_tags(google_cloud_compute_v1::model::Tags::new().set_items(["cluster-node"]))
            .set_network_interfaces([google_cloud_compute_v1::model::NetworkInterface::new()
                .set_network_ip(format!("10.128.{high}.{low}"))
                .set_access_configs([google_cloud_compute_v1::model::AccessConfig::new()
                    .set_nat_ip(format!("34.66.{high}.{low}"))])]);
        self.double.put_instance(Self::PROJECT, Self::ZONE, instance);
        name
    }

    fn inventory(&self) -> Inventory {
        let project = Self::PROJECT;
        let pools = self.double.target_pools(project);
        Inventory {
            instances: self.double.instances(project).len(),
            load_balancers: self
                .double
                .forwarding_rules(project)
                .into_iter()
                .map(|rule| {
                    let name = rule.name.unwrap_or_default();
                    let backends = pools
                        .iter()
                        .find(|pool| pool.name.as_deref() == Some(name.as_str()))
                        .map_or(0, |pool| pool.instances.len());
                    CloudLoadBalancer {
                        name,
                        address: rule.ip_address.unwrap_or_default(),
                        backends,
                    }
                })
                .collect(),
            routes: self.double.routes(project).len(),
        }
    }
}
