//! The provider against moto, a real AWS API emulator (`moto_server`, installed by `cargo xtask test`
//! into `<target>/venv`), started here on 127.0.0.1. The provider reaches it through the cloud-config's
//! `[ServiceOverride]`, as an operator's endpoint override would. Without moto the tests say they were
//! skipped.

#![allow(clippy::print_stderr)]

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use k8s_openapi::api::core::v1::Node;
use kube_ccm_aws::{AwsProvider, CloudConfig};
use kube_ccm_provider::{CallContext, CloudError, CloudProvider};

mod budget;
mod conformance;
mod dual_stack;
mod elb;
mod instances;
mod nlb;
mod orphans;
mod routes;

/// moto, and the SDK configuration that reaches it.
struct Moto(harness::Moto);

impl Moto {
    fn start() -> Option<Moto> {
        harness::Moto::for_test().map(Moto)
    }

    fn sdk(&self) -> SdkConfig {
        SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "testing", "testing", None, None, "test",
            )))
            .http_client(aws_smithy_http_client::Builder::new().build_http())
            .build()
    }

    /// A client for seeding the cloud, straight at moto.
    fn ec2(&self) -> aws_sdk_ec2::Client {
        aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::config::Builder::from(&self.sdk())
                .endpoint_url(self.0.url())
                .build(),
        )
    }

    /// The provider, reaching moto through the cloud-config's endpoint override.
    fn provider(&self, extra: &str) -> AwsProvider {
        self.provider_via(self.0.url(), extra)
    }

    /// The provider, reaching moto at `url` (a proxy in front of it).
    fn provider_via(&self, url: &str, extra: &str) -> AwsProvider {
        let text = format!(
            "[Global]\nRegion = us-east-1\nKubernetesClusterID = test\n{extra}\n[ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n\n[ServiceOverride \"2\"]\nService = elasticloadbalancing\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n\n[ServiceOverride \"3\"]\nService = elasticloadbalancingv2\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n",
            url = url
        );
        AwsProvider::new(CloudConfig::parse(&text).unwrap().config, &self.sdk())
    }
}

/// Starts `count` instances tagged for cluster `test`; their IDs.
async fn run_instances(
    ec2: &aws_sdk_ec2::Client,
    count: i32,
    tagged: bool,
) -> Vec<aws_sdk_ec2::types::Instance> {
    run_typed_instances(ec2, count, tagged, InstanceType::M5Large).await
}

/// Starts `count` tagged instances of `kind`.
async fn run_instances_of(
    ec2: &aws_sdk_ec2::Client,
    count: i32,
    kind: InstanceType,
) -> Vec<aws_sdk_ec2::types::Instance> {
    run_typed_instances(ec2, count, true, kind).await
}

async fn run_typed_instances(
    ec2: &aws_sdk_ec2::Client,
    count: i32,
    tagged: bool,
    kind: InstanceType,
) -> Vec<aws_sdk_ec2::types::Instance> {
    let mut request = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(kind)
        .min_count(count)
        .max_count(count);
    if tagged {
        request = request.tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(
                    Tag::builder()
                        .key("kubernetes.io/cluster/test")
                        .value("owned")
                        .build(),
                )
                .build(),
        );
    }
    request.send().await.unwrap().instances().to_vec()
}

fn node(name: &str, provider_id: Option<&str>) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "spec": {"providerID": provider_id}}),
        )
        .unwrap(),
    )
}

/// The provider's requests that change something, by operation.
fn writes(provider: &AwsProvider) -> std::collections::BTreeMap<String, u64> {
    provider
        .requests()
        .snapshot()
        .into_iter()
        .filter(|(operation, _)| !operation.contains(":Describe"))
        .collect()
}

fn cx() -> CallContext {
    CallContext::with_timeout(Duration::from_secs(30))
}

/// A VPC with two cluster subnets in two zones (the first with the ELB role tag), an untagged subnet,
/// a cluster-tagged node security group, and `count` instances in it.
struct Network {
    vpc: String,
    subnets: Vec<String>,
    node_group: String,
    instances: Vec<aws_sdk_ec2::types::Instance>,
}

async fn network(ec2: &aws_sdk_ec2::Client, count: i32) -> Network {
    let cluster = || {
        Tag::builder()
            .key("kubernetes.io/cluster/test")
            .value("shared")
            .build()
    };
    let vpc = ec2.create_vpc().cidr_block("10.3.0.0/16").send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
    let mut subnets = Vec::new();
    for (cidr, zone, tags) in [
        (
            "10.3.1.0/24",
            "us-east-1a",
            vec![
                cluster(),
                Tag::builder().key("kubernetes.io/role/elb").value("1").build(),
            ],
        ),
        ("10.3.2.0/24", "us-east-1b", vec![cluster()]),
        ("10.3.3.0/24", "us-east-1b", vec![]),
    ] {
        let subnet = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(cidr)
            .availability_zone(zone)
            .send()
            .await
            .unwrap();
        let id = subnet.subnet().unwrap().subnet_id().unwrap().to_owned();
        if !tags.is_empty() {
            ec2.create_tags()
                .resources(&id)
                .set_tags(Some(tags))
                .send()
                .await
                .unwrap();
        }
        subnets.push(id);
    }
    let group = ec2
        .create_security_group()
        .group_name("nodes")
        .description("nodes")
        .vpc_id(&vpc)
        .send()
        .await
        .unwrap();
    let node_group = group.group_id().unwrap().to_owned();
    ec2.create_tags()
        .resources(&node_group)
        .tags(cluster())
        .send()
        .await
        .unwrap();
    let started = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .min_count(count)
        .max_count(count)
        .subnet_id(&subnets[0])
        .security_group_ids(&node_group)
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
        .await
        .unwrap();
    Network {
        vpc,
        subnets,
        node_group,
        instances: started.instances().to_vec(),
    }
}

fn elb(moto: &Moto) -> aws_sdk_elasticloadbalancing::Client {
    aws_sdk_elasticloadbalancing::Client::from_conf(
        aws_sdk_elasticloadbalancing::config::Builder::from(&moto.sdk())
            .endpoint_url(moto.0.url())
            .build(),
    )
}

fn web_service(ports: serde_json::Value) -> k8s_openapi::api::core::v1::Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"},
        "spec": {"type": "LoadBalancer", "ports": ports},
    }))
    .unwrap()
}

const ELB_NAME: &str = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";

fn nodes_of(instances: &[aws_sdk_ec2::types::Instance]) -> Vec<Arc<Node>> {
    instances
        .iter()
        .map(|i| {
            node(
                i.private_dns_name().unwrap(),
                Some(&format!("aws:///us-east-1a/{}", i.instance_id().unwrap())),
            )
        })
        .collect()
}

/// Which groups admit traffic from `from`.
async fn admitting(ec2: &aws_sdk_ec2::Client, vpc: &str, from: &str) -> Vec<String> {
    let groups = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(vpc)
                .build(),
        )
        .send()
        .await
        .unwrap();
    groups
        .security_groups()
        .iter()
        .filter(|g| {
            g.ip_permissions()
                .iter()
                .flat_map(|p| p.user_id_group_pairs())
                .any(|p| p.group_id() == Some(from))
        })
        .map(|g| g.group_id().unwrap().to_owned())
        .collect()
}

fn elbv2(moto: &Moto) -> aws_sdk_elasticloadbalancingv2::Client {
    aws_sdk_elasticloadbalancingv2::Client::from_conf(
        aws_sdk_elasticloadbalancingv2::config::Builder::from(&moto.sdk())
            .endpoint_url(moto.0.url())
            .build(),
    )
}

fn nlb_service(ports: serde_json::Value) -> k8s_openapi::api::core::v1::Service {
    let mut service = web_service(ports);
    service.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/aws-load-balancer-type".to_owned(),
            "nlb".to_owned(),
        )]
        .into(),
    );
    service
}

/// `(port, protocol, target group name)` per listener, and each group's registered `(instance, port)`.
async fn nlb_state(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
) -> (Vec<(i32, String, String)>, Vec<Vec<(String, i32)>>) {
    let lbs = elbv2
        .describe_load_balancers()
        .names(ELB_NAME)
        .send()
        .await
        .unwrap();
    let arn = lbs.load_balancers()[0].load_balancer_arn().unwrap().to_owned();
    let listeners = elbv2
        .describe_listeners()
        .load_balancer_arn(&arn)
        .send()
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut targets = Vec::new();
    for listener in listeners.listeners() {
        let group_arn = listener.default_actions()[0].target_group_arn().unwrap();
        let group = elbv2
            .describe_target_groups()
            .target_group_arns(group_arn)
            .send()
            .await
            .unwrap();
        let name = group.target_groups()[0].target_group_name().unwrap().to_owned();
        out.push((
            listener.port().unwrap(),
            listener.protocol().unwrap().as_str().to_owned(),
            name,
        ));
        let health = elbv2
            .describe_target_health()
            .target_group_arn(group_arn)
            .send()
            .await
            .unwrap();
        let mut registered: Vec<(String, i32)> = health
            .target_health_descriptions()
            .iter()
            .map(|d| {
                (
                    d.target().unwrap().id().unwrap().to_owned(),
                    d.target().unwrap().port().unwrap(),
                )
            })
            .collect();
        registered.sort();
        targets.push(registered);
    }
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by_key(|&i| out[i].0);
    (
        order.iter().map(|&i| out[i].clone()).collect(),
        order.iter().map(|&i| targets[i].clone()).collect(),
    )
}

/// The NLB rules (`kubernetes.io/rule/nlb/…`) of `group`: `(protocol, port, cidr, description)`, sorted.
async fn nlb_rules(ec2: &aws_sdk_ec2::Client, group: &str) -> Vec<(String, i32, String, String)> {
    let groups = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await
        .unwrap();
    let mut rules: Vec<(String, i32, String, String)> = groups.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges()
                .iter()
                .filter(|r| {
                    r.description()
                        .is_some_and(|d| d.starts_with("kubernetes.io/rule/nlb/"))
                })
                .map(move |r| {
                    (
                        p.ip_protocol().unwrap().to_owned(),
                        p.from_port().unwrap(),
                        r.cidr_ip().unwrap().to_owned(),
                        r.description().unwrap().to_owned(),
                    )
                })
        })
        .collect();
    rules.sort();
    rules
}
