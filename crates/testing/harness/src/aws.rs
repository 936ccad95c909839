//! AWS as the harness sees it: moto's EC2 Query API spoken directly (no SDK: the harness must not compile
//! it), the provider's cloud-config for moto, and a recording proxy in front of moto that logs every
//! request with its action, caller and answer, as an account's CloudTrail would.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use ccm_audit::UserAgent;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// The cluster ID the instances are tagged with and the manager is configured for.
pub const CLUSTER_ID: &str = "test";
/// The region and zone everything is made in.
pub const REGION: &str = "us-east-1";
/// The zone of the instances.
pub const ZONE: &str = "us-east-1a";

/// The AWS provider's environment against moto: moto's dummy credentials (any are accepted), and no
/// instance metadata service to ask.
pub const MOTO_ENVIRONMENT: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

/// The AWS provider's cloud-config for moto at `url`: EC2 and the ELBs overridden (named by the AWS SDK
/// for Go v2's service IDs, as cloud-provider-aws compares them since it moved to that SDK), the cluster
/// ID set, and, with `network`, the VPC and subnet of a control plane outside AWS (which
/// cloud-provider-aws needs where there is no instance metadata service to ask).
pub fn cloud_config(url: &str, network: Option<&Network>) -> String {
    let mut config = format!("[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n");
    if let Some(network) = network {
        config.push_str(&format!("VPC = {}\nSubnetID = {}\n", network.vpc, network.subnet));
    }
    for (number, service) in ["EC2", "Elastic Load Balancing", "Elastic Load Balancing v2"]
        .iter()
        .enumerate()
    {
        config.push_str(&format!(
            "\n[ServiceOverride \"{number}\"]\nService = {service}\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\n"
        ));
    }
    config
}

/// EC2's answer to `DescribeInstanceTopology` for instances whose type has no topology (any but HPC,
/// Trainium and P types: they are left out of the set): moto 5 lacks the action, and its error (a 500)
/// would have cloud-provider-aws retry for every node, where EC2's empty answer has it ask once per
/// instance type.
pub fn no_instance_topology(_request: &str) -> (u16, String) {
    (
        200,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstanceTopologyResponse \
         xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>00000000-0000-0000-0000-000000000000</requestId>\
         <instanceSet/></DescribeInstanceTopologyResponse>"
            .to_owned(),
    )
}

/// moto's default VPC and its default subnet in [`ZONE`].
#[derive(Debug, Clone)]
pub struct Network {
    /// The VPC ID.
    pub vpc: String,
    /// The subnet ID.
    pub subnet: String,
}

impl Network {
    /// moto's defaults at `moto_url`.
    pub async fn default_of(moto_url: &str) -> Result<Network> {
        let vpcs = ec2_query(
            moto_url,
            &[
                ("Action", "DescribeVpcs".to_owned()),
                ("Filter.1.Name", "is-default".to_owned()),
                ("Filter.1.Value.1", "true".to_owned()),
            ],
        )
        .await?;
        let vpc = xml_values(&vpcs, "vpcId")
            .into_iter()
            .next()
            .context("moto has no default VPC")?;
        Ok(Network {
            vpc,
            subnet: default_subnet(moto_url).await?,
        })
    }
}

/// One Query API request of `service` (`ec2`, `elasticloadbalancing`) to moto (a dummy signature: moto
/// checks none unless asked to); the answer's XML.
pub async fn query(moto_url: &str, service: &str, form: &[(&str, String)]) -> Result<String> {
    let body = form
        .iter()
        .map(|(key, value)| format!("{}={}", encode(key), encode(value)))
        .collect::<Vec<_>>()
        .join("&");
    let action = form
        .iter()
        .find(|(key, _)| *key == "Action")
        .map_or("", |(_, value)| value.as_str())
        .to_owned();
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::post(format!("{}/", moto_url.trim_end_matches('/')))
        .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        // moto routes a request by the service its credential scope names (S3 without one).
        .header(
            http::header::AUTHORIZATION,
            format!(
                "AWS4-HMAC-SHA256 Credential=testing/20260101/{REGION}/{service}/aws4_request, SignedHeaders=host, Signature=00"
            ),
        )
        .body(Full::new(Bytes::from(body)))?;
    let response = client
        .request(request)
        .await
        .with_context(|| format!("{action} in moto"))?;
    let status = response.status();
    let text = String::from_utf8_lossy(&response.into_body().collect().await?.to_bytes()).into_owned();
    if !status.is_success() {
        bail!("{action} in moto answered {status}: {text}");
    }
    Ok(text)
}

/// An EC2 Query API request (API version 2016-11-15).
pub async fn ec2_query(moto_url: &str, form: &[(&str, String)]) -> Result<String> {
    let mut form = form.to_vec();
    form.push(("Version", "2016-11-15".to_owned()));
    query(moto_url, "ec2", &form).await
}

/// The text of every `<tag>…</tag>` in `xml`, in order.
pub fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split_once(&close).map(|(value, _)| value.to_owned()))
        .collect()
}

/// The default subnet of [`ZONE`].
pub async fn default_subnet(moto_url: &str) -> Result<String> {
    let subnets = ec2_query(
        moto_url,
        &[
            ("Action", "DescribeSubnets".to_owned()),
            ("Filter.1.Name", "default-for-az".to_owned()),
            ("Filter.1.Value.1", "true".to_owned()),
            ("Filter.2.Name", "availability-zone".to_owned()),
            ("Filter.2.Value.1", ZONE.to_owned()),
        ],
    )
    .await?;
    xml_values(&subnets, "subnetId")
        .into_iter()
        .next()
        .with_context(|| format!("moto has no default subnet in {ZONE}"))
}

/// The default subnets of the region, [`ZONE`]'s first.
async fn default_subnets(moto_url: &str) -> Result<Vec<String>> {
    let first = default_subnet(moto_url).await?;
    let all = ec2_query(
        moto_url,
        &[
            ("Action", "DescribeSubnets".to_owned()),
            ("Filter.1.Name", "default-for-az".to_owned()),
            ("Filter.1.Value.1", "true".to_owned()),
        ],
    )
    .await?;
    let mut subnets = vec![first];
    for subnet in xml_values(&all, "subnetId") {
        if !subnets.contains(&subnet) {
            subnets.push(subnet);
        }
    }
    Ok(subnets)
}

/// Instances a default subnet holds: a /20 has 4,091 addresses to give.
const PER_SUBNET: usize = 4_000;
/// Instances started by one `RunInstances`.
const PER_CALL: usize = 1_000;

/// `count` running instances tagged for [`CLUSTER_ID`], started in moto in the default subnet of
/// [`ZONE`], and past 4,000 in the region's other default subnets (4,000 each; one `RunInstances` per
/// 1,000); their private DNS names, which are the node names.
///
/// A subnet is named: without one, moto picks each instance's private IP at random in 10.0.0.0/8,
/// and among 1,000 instances two share an IP (so a DNS name) about one run in thirty; in a subnet it
/// hands out IPs in order.
pub async fn run_instances(moto_url: &str, count: usize) -> Result<Vec<String>> {
    let subnets = if count > PER_SUBNET {
        default_subnets(moto_url).await?
    } else {
        vec![default_subnet(moto_url).await?]
    };
    if count > PER_SUBNET * subnets.len() {
        bail!(
            "{count} instances do not fit moto's {} default subnets ({PER_SUBNET} each)",
            subnets.len()
        );
    }
    let mut names = Vec::with_capacity(count);
    let mut seen = HashSet::new();
    let mut started = 0;
    while started < count {
        let subnet = &subnets[started / PER_SUBNET];
        let batch = PER_CALL
            .min(count - started)
            .min(PER_SUBNET - started % PER_SUBNET);
        let text = ec2_query(
            moto_url,
            &[
                ("Action", "RunInstances".to_owned()),
                ("ImageId", "ami-12c6146b".to_owned()),
                ("InstanceType", "t3.medium".to_owned()),
                ("MinCount", batch.to_string()),
                ("MaxCount", batch.to_string()),
                ("SubnetId", subnet.clone()),
                ("TagSpecification.1.ResourceType", "instance".to_owned()),
                (
                    "TagSpecification.1.Tag.1.Key",
                    format!("kubernetes.io/cluster/{CLUSTER_ID}"),
                ),
                ("TagSpecification.1.Tag.1.Value", "owned".to_owned()),
            ],
        )
        .await?;
        // An instance's name appears again in its network interfaces: first sightings, in order.
        names.extend(
            xml_values(&text, "privateDnsName")
                .into_iter()
                .filter(|name| !name.is_empty() && seen.insert(name.clone())),
        );
        started += batch;
    }
    if names.len() != count {
        bail!(
            "RunInstances in moto: {} instance names in the answers, not {count}",
            names.len()
        );
    }
    Ok(names)
}

/// Tags `resource` as the cluster's (`kubernetes.io/cluster/<id>` = `value`).
pub async fn tag_for_cluster(moto_url: &str, resource: &str, value: &str) -> Result<()> {
    ec2_query(
        moto_url,
        &[
            ("Action", "CreateTags".to_owned()),
            ("ResourceId.1", resource.to_owned()),
            ("Tag.1.Key", format!("kubernetes.io/cluster/{CLUSTER_ID}")),
            ("Tag.1.Value", value.to_owned()),
        ],
    )
    .await?;
    Ok(())
}

/// Percent-encoding for a form value: everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// One request the proxy forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxiedRequest {
    /// When it arrived, microseconds since the epoch.
    pub time_us: i64,
    /// The Query API's `Action` (`DescribeInstances`, `CreateLoadBalancer`).
    pub action: String,
    /// Its `User-Agent`.
    pub user_agent: String,
    /// The status moto answered (502 when moto could not be reached).
    pub status: u16,
}

impl ProxiedRequest {
    /// A request that changes something: any action but `Describe…`, `Get…` and `List…`.
    pub fn is_write(&self) -> bool {
        !["Describe", "Get", "List"]
            .iter()
            .any(|read| self.action.starts_with(read))
    }

    /// The controller manager's `User-Agent` inside the request's (the AWS provider appends the calling
    /// controller's to the SDK's), if it has one.
    pub fn caller(&self) -> Option<UserAgent> {
        // The shortest suffix that parses: the SDK's own part has `/`s and spaces too.
        self.user_agent
            .char_indices()
            .rev()
            .filter(|&(at, c)| c == ' ' || at == 0)
            .find_map(|(at, _)| UserAgent::parse(self.user_agent[at..].trim_start()))
    }
}

/// An answer the proxy gives itself: `(HTTP status, body)` for a request's form body.
pub type Answer = Arc<dyn Fn(&str) -> (u16, String) + Send + Sync>;

#[derive(Default)]
struct Log {
    records: Vec<ProxiedRequest>,
    /// Where the last take of counts ended.
    taken: usize,
    /// Actions answered here instead of by moto.
    answers: BTreeMap<String, Answer>,
    /// How long each request is held before it is answered or forwarded.
    latency: std::time::Duration,
    /// Every request answered 503 (an outage).
    outage: bool,
    /// The account's rate limit, when one is set.
    limit: Option<kube_ccm_fake::RateLimit>,
    /// Requests refused for it.
    throttled: u64,
}

/// AWS's answer to a request over the rate limit: EC2's 503 `RequestLimitExceeded`, or the ELB APIs' 400
/// `Throttling`, told apart by the request's API version.
fn throttled(body: &str) -> (u16, String) {
    if body.contains("Version=2016-11-15") {
        (
            503,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>\
             <Message>Request limit exceeded.</Message></Error></Errors>\
             <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
                .to_owned(),
        )
    } else {
        (
            400,
            "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message>\
             </Error><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>"
                .to_owned(),
        )
    }
}

/// EC2's answer in an outage: 503 `Unavailable`, which the SDK retries and then gives up on.
fn unavailable() -> (u16, String) {
    (
        503,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>Unavailable</Code>\
         <Message>The service is unavailable (an outage the test made).</Message></Error></Errors>\
         <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
            .to_owned(),
    )
}

/// An HTTP proxy in front of moto that records every request (its `Action`, `User-Agent`, arrival and
/// answer) and forwards it: what the account's rate limit and CloudTrail would see, every attempt.
pub struct RecordingProxy {
    log: Arc<Mutex<Log>>,
    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingProxy {
    /// A proxy to `upstream` (`http://host:port`) on a free port of 127.0.0.1.
    pub async fn start(upstream: &str) -> Result<RecordingProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let log: Arc<Mutex<Log>> = Arc::default();
        let client: Upstream =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let shared = log.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (client, upstream, log) = (client.clone(), upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let (client, upstream, log) = (client.clone(), upstream.clone(), log.clone());
                            async move { forward(client, upstream, log, request).await }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(RecordingProxy { log, url, task })
    }

    /// Answers `action` here with `answer` (given the request's form body) instead of forwarding it: for
    /// an API moto does not have, from a recorded answer. The request is recorded as any other.
    pub fn answer(&self, action: &str, answer: impl Fn(&str) -> (u16, String) + Send + Sync + 'static) {
        self.log
            .lock()
            .answers
            .insert(action.to_owned(), Arc::new(answer));
    }

    /// Holds every request `latency` before answering or forwarding it (a slow cloud). A request whose
    /// connection closes meanwhile is dropped unforwarded, as a cloud drops one its client reset.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.log.lock().latency = latency;
    }

    /// Answers every request 503 `Unavailable` (`true`: an outage) or as before (`false`).
    pub fn set_outage(&self, outage: bool) {
        self.log.lock().outage = outage;
    }

    /// Refuses requests beyond `per_second` a second (a bucket of one second's requests) as AWS refuses
    /// them, throttled; zero lifts the limit. Refused requests are recorded with their status.
    pub fn set_rate_limit(&self, per_second: f64) {
        self.log.lock().limit = (per_second > 0.0).then(|| kube_ccm_fake::RateLimit::new(per_second));
    }

    /// Requests refused so far for the rate limit ([`RecordingProxy::set_rate_limit`]).
    pub fn throttled(&self) -> u64 {
        self.log.lock().throttled
    }

    /// Forwards `action` to moto again (after [`RecordingProxy::answer`]).
    pub fn forward(&self, action: &str) {
        self.log.lock().answers.remove(action);
    }

    /// Every request so far, in order of arrival.
    pub fn requests(&self) -> Vec<ProxiedRequest> {
        self.log.lock().records.clone()
    }

    /// The requests since the last take, counted by action.
    pub fn take_all(&self) -> BTreeMap<String, u64> {
        let mut log = self.log.lock();
        let mut counts = BTreeMap::new();
        for record in &log.records[log.taken..] {
            *counts.entry(record.action.clone()).or_default() += 1;
        }
        log.taken = log.records.len();
        counts
    }
}

type Upstream =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn forward(
    client: Upstream,
    upstream: String,
    log: Arc<Mutex<Log>>,
    request: http::Request<hyper::body::Incoming>,
) -> std::io::Result<http::Response<Full<Bytes>>> {
    let time_us = crate::now_us();
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let action = String::from_utf8_lossy(&body)
        .split('&')
        .find_map(|pair| pair.strip_prefix("Action=").map(str::to_owned))
        .unwrap_or_else(|| "unknown".into());
    let user_agent = parts
        .headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (latency, outage) = {
        let log = log.lock();
        (log.latency, log.outage)
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let over_limit = {
        let mut log = log.lock();
        let over = log.limit.as_mut().is_some_and(|limit| !limit.admit());
        log.throttled += u64::from(over);
        over
    };
    let canned: Option<Answer> = if outage {
        Some(Arc::new(|_: &str| unavailable()))
    } else if over_limit {
        Some(Arc::new(throttled))
    } else {
        log.lock().answers.get(&action).cloned()
    };
    if let Some(answer) = canned {
        let (status, text) = answer(&String::from_utf8_lossy(&body));
        log.lock().records.push(ProxiedRequest {
            time_us,
            action,
            user_agent,
            status,
        });
        return http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "text/xml;charset=UTF-8")
            .body(Full::new(Bytes::from(text)))
            .map_err(std::io::Error::other);
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{upstream}{path}")
        .parse()
        .map_err(std::io::Error::other)?;
    let answer = client
        .request(http::Request::from_parts(parts, Full::new(body)))
        .await;
    let status = answer.as_ref().map_or(502, |r| r.status().as_u16());
    log.lock().records.push(ProxiedRequest {
        time_us,
        action,
        user_agent,
        status,
    });
    let (parts, body) = answer.map_err(std::io::Error::other)?.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    Ok(http::Response::from_parts(parts, Full::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caller_is_found_after_the_sdk_agent() {
        let check = |agent: &str, expected: Option<(&str, &str)>| {
            let request = ProxiedRequest {
                time_us: 0,
                action: "CreateRoute".into(),
                user_agent: agent.into(),
                status: 200,
            };
            let caller = request.caller();
            assert_eq!(
                caller
                    .as_ref()
                    .map(|ua| (ua.identity.as_str(), ua.controller.as_str())),
                expected,
                "{agent}"
            );
        };
        check(
            "aws-sdk-rust/1.3.9 os/linux lang/rust/1.95.0 cloud-controller-manager/0.1.0 (linux/x86_64) host_1/node-route-controller",
            Some(("host_1", "node-route-controller")),
        );
        check(
            "kube-controller-manager/0.1.0 (linux/x86_64) host_2/service-lb-controller",
            Some(("host_2", "service-lb-controller")),
        );
        check("aws-sdk-rust/1.3.9 os/linux lang/rust/1.95.0", None);
        check("", None);
    }

    #[test]
    fn reads_are_told_from_writes_by_action() {
        let request = |action: &str| ProxiedRequest {
            time_us: 0,
            action: action.into(),
            user_agent: String::new(),
            status: 200,
        };
        assert!(!request("DescribeInstances").is_write());
        assert!(!request("DescribeLoadBalancers").is_write());
        assert!(request("CreateLoadBalancer").is_write());
        assert!(request("RegisterInstancesWithLoadBalancer").is_write());
        assert!(request("ModifyInstanceAttribute").is_write());
    }
}
