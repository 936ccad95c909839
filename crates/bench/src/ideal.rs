//! `ideal-node-client`: the ceiling of node initialisation on an API server, for `ccm-bench versus`.
//!
//! It makes the two writes per node the cloud-node controller makes (the addresses on the status, then the
//! labels, the provider ID and the taint removed, conditional on the first write's resourceVersion; the same
//! parameters and metadata-only answers, through `kube_ccm_runtime::written`) from a minimal loop: one watch
//! of the nodes, the cloud asked for each ready batch's metadata at once, then each node's writes with
//! `--concurrency` in flight. No queue, no retries but a conflict's (the node read again), no caches, no
//! metrics, no leader election: what is left is what the API server takes to initialise a node. Test
//! tooling, never shipped.
//!
//! The bodies are the node controller's for the nodes `ccm-bench` makes, not in general: the cloud's
//! addresses replace the node's (the controller keeps a kubelet's Hostname the cloud lacks, and honours the
//! provided-node-IP annotation), and the status is written even when it is already so. A node it cannot
//! initialise ends the process with an error, so that a measurement fails at once.
//!
//! It accepts a contender's command line (`--cloud-provider=fake --cloud-config=FILE --kubeconfig=FILE`,
//! the rest ignored), `--concurrency=N` (default 128) and `--http2` (one HTTP/2 connection, as client-go's,
//! instead of kube's HTTP/1.1 pool).

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube::client::ConfigExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube_ccm_fake::{FakeCloudConfig, FakeProvider};
use kube_ccm_provider::names::TAINT_UNINITIALIZED;
use kube_ccm_provider::{CallContext, CloudProvider, InstanceMetadata};
use kube_ccm_runtime::Written;
use kube_ccm_runtime::written::{patch_params, patch_status};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Its `User-Agent`: what `ccm-bench` counts its requests by.
pub const AGENT: &str = "ideal-node-client/";

/// The most nodes one cloud call asks about (the fake provider's batch).
const BATCH: usize = 500;

/// How many times a node's writes are tried (a conflict: the node changed between the two).
const TRIES: u32 = 3;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The command line's values.
struct Options {
    kubeconfig: String,
    cloud_config: String,
    concurrency: usize,
    protocol: Protocol,
}

/// How the client talks to the API server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// kube's own pool: a connection per request in flight.
    Http1,
    /// One connection carrying every request, as client-go's.
    Http2,
}

fn options() -> Result<Options, Error> {
    let mut kubeconfig = None;
    let mut cloud_config = None;
    let mut concurrency = 128;
    let mut protocol = Protocol::Http1;
    for arg in std::env::args().skip(1) {
        if arg == "--http2" {
            protocol = Protocol::Http2;
        } else if let Some(path) = arg.strip_prefix("--kubeconfig=") {
            kubeconfig = Some(path.to_owned());
        } else if let Some(path) = arg.strip_prefix("--cloud-config=") {
            cloud_config = Some(path.to_owned());
        } else if let Some(n) = arg.strip_prefix("--concurrency=") {
            concurrency = n
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("--concurrency: {n:?} is not a positive number"))?;
        }
    }
    Ok(Options {
        kubeconfig: kubeconfig.ok_or("--kubeconfig is required")?,
        cloud_config: cloud_config.ok_or("--cloud-config is required")?,
        concurrency,
        protocol,
    })
}

/// A client from the kubeconfig at `path`, speaking `protocol`: kube's own, or for HTTP/2 a hyper client
/// speaking h2 alone under kube's own layers.
async fn client(path: &str, protocol: Protocol) -> Result<kube::Client, Error> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&format!("{AGENT}0.1"))?,
    ));
    if protocol == Protocol::Http1 {
        return Ok(kube::Client::try_from(config)?);
    }
    // kube's TLS configuration offers http/1.1 by ALPN; the connector offers h2 alone.
    let mut tls = config.rustls_client_config()?;
    tls.alpn_protocols.clear();
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(connector);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(tower::ServiceExt::map_err(http, Error::from));
    Ok(kube::Client::new(service, config.default_namespace))
}

fn current_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The node's two writes.
async fn initialise(api: &Api<Written<Node>>, node: &Node, metadata: &InstanceMetadata) -> kube::Result<()> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mut addresses = vec![json!({"$patch": "replace"})];
    addresses.extend(
        metadata
            .node_addresses
            .iter()
            .map(|a| json!({"type": a.type_, "address": a.address})),
    );
    let status = Patch::Strategic(json!({"status": {"addresses": addresses}}));
    let written = patch_status(api, name, &patch_params(), &status).await?;
    let taints: Vec<_> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != TAINT_UNINITIALIZED)
        .collect();
    let mut spec = json!({"taints": taints});
    if node.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_none() {
        spec["providerID"] = json!(metadata.provider_id);
    }
    let patch = json!({
        "metadata": {"resourceVersion": written.metadata.resource_version, "labels": metadata.initial_labels(|key| current_label(node, key))},
        "spec": spec,
    });
    api.patch(name, &patch_params(), &Patch::Strategic(patch))
        .await
        .map(drop)
}

fn uninitialised(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED))
}

async fn run(options: Options) -> Result<(), Error> {
    let config = FakeCloudConfig::parse(&std::fs::read(&options.cloud_config)?)?;
    let provider = Arc::new(FakeProvider::new(config));
    let client = client(&options.kubeconfig, options.protocol).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let written: Api<Written<Node>> = Api::all(client);
    let writes = Arc::new(Semaphore::new(options.concurrency));
    // By UID: a node deleted and made again under its name is a new node.
    let mut started: HashSet<String> = HashSet::new();
    let events = watcher::watcher(nodes.clone(), watcher::Config::default())
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    Some(node).filter(uninitialised)
                }
                Ok(_) => None,
                Err(error) => {
                    warn(&format!("watching the nodes: {error}"));
                    None
                }
            }
        });
    let mut batches = std::pin::pin!(events.ready_chunks(BATCH));
    while let Some(batch) = batches.next().await {
        let batch: Vec<Arc<Node>> = batch
            .into_iter()
            .filter(|n| started.insert(n.metadata.uid.clone().unwrap_or_default()))
            .map(Arc::new)
            .collect();
        if batch.is_empty() {
            continue;
        }
        let (provider, nodes, written, writes) =
            (provider.clone(), nodes.clone(), written.clone(), writes.clone());
        tokio::spawn(async move {
            let Some(instances) = provider.instances_v2() else {
                give_up("the fake provider offers no instances");
            };
            let cx = CallContext::new(
                tokio::time::Instant::now() + Duration::from_secs(60),
                CancellationToken::new(),
                AGENT,
            );
            let answers = instances.instance_metadata_batch(&cx, &batch).await;
            for (node, metadata) in batch.into_iter().zip(answers) {
                let name = node.metadata.name.clone().unwrap_or_default();
                let metadata = match metadata {
                    Ok(metadata) => metadata,
                    Err(error) => give_up(&format!("the cloud's answer for {name}: {error}")),
                };
                let (nodes, written, writes) = (nodes.clone(), written.clone(), writes.clone());
                tokio::spawn(async move {
                    let Ok(_permit) = writes.acquire().await else {
                        return;
                    };
                    let mut node = node;
                    for tried in 1..=TRIES {
                        match initialise(&written, &node, &metadata).await {
                            Ok(()) => return,
                            // The node changed between the two writes: read it again, as the node
                            // controller's next sync would.
                            Err(kube::Error::Api(status)) if status.code == 409 && tried < TRIES => {
                                match nodes.get(&name).await {
                                    Ok(fresh) => node = Arc::new(fresh),
                                    Err(error) => give_up(&format!("read {name} again: {error}")),
                                }
                            }
                            Err(error) => give_up(&format!("initialise {name}: {error}")),
                        }
                    }
                });
            }
        });
    }
    Ok(())
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error.into()),
    };
    match options() {
        Ok(options) => match runtime.block_on(run(options)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(&error),
        },
        Err(error) => fail(&error),
    }
}

fn warn(message: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("ideal-node-client: {message}");
    }
}

/// Ends the process: a node it cannot initialise would hold a measurement to its timeout.
fn give_up(message: &str) -> ! {
    warn(message);
    std::process::exit(1)
}

fn fail(error: &Error) -> ExitCode {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("ideal-node-client: {error}");
    }
    ExitCode::FAILURE
}
