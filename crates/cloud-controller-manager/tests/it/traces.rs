//! Traces over OTLP/HTTP: a receiver in the test takes what a running manager exports and checks the tree:
//! one `reconcile` span per sync, naming the controller, the object and the Lease, with the cloud calls and
//! the API requests of that sync beneath it.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use kube_ccm_test_apiserver::TestApiServer;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::time::Instant;

use crate::manager::{Manager, WAIT, add_uninitialized_node};

/// The spans received so far.
type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP trace receiver on 127.0.0.1 (protobuf, as the manager's exporter sends): its port.
async fn receiver(received: Received) -> u16 {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let received = received.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        let received = received.clone();
                        async move {
                            assert_eq!(request.uri().path(), "/v1/traces");
                            let body = request
                                .into_body()
                                .collect()
                                .await
                                .expect("the export's body")
                                .to_bytes();
                            let export =
                                ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                            let spans = export
                                .resource_spans
                                .into_iter()
                                .flat_map(|r| r.scope_spans)
                                .flat_map(|s| s.spans);
                            received.lock().extend(spans);
                            let answer = ExportTraceServiceResponse::default().encode_to_vec();
                            hyper::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(bytes::Bytes::from(answer)))
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    port
}

/// A span's string attributes.
fn attributes(span: &Span) -> BTreeMap<&str, String> {
    span.attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                Any::StringValue(s) => s.clone(),
                Any::IntValue(i) => i.to_string(),
                Any::BoolValue(b) => b.to_string(),
                Any::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.as_str(), value))
        })
        .collect()
}

/// The children of `parent` among `spans`.
fn children<'s>(spans: &'s [Span], parent: &Span) -> Vec<&'s Span> {
    spans
        .iter()
        .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
        .collect()
}

/// A sync of `controller` whose children include a cloud call of `request` and an API request with
/// `method`, if one was received: the reconcile span's attributes.
fn find_tree(
    spans: &[Span],
    controller: &str,
    request: &str,
    method: &str,
) -> Option<BTreeMap<String, String>> {
    spans
        .iter()
        .filter(|s| s.name == "reconcile")
        .find_map(|reconcile| {
            let attributes = attributes(reconcile);
            if attributes.get("controller").map(String::as_str) != Some(controller) {
                return None;
            }
            let beneath = children(spans, reconcile);
            let cloud = beneath
                .iter()
                .any(|s| s.name == "cloud_call" && attributes_of(s, "request") == Some(request.to_owned()));
            let api = beneath.iter().any(|s| {
                let a = crate::traces::attributes(s);
                a.get("http.method")
                    .or_else(|| a.get("http.request.method"))
                    .map(String::as_str)
                    == Some(method)
            });
            (cloud && api).then(|| attributes.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        })
}

fn attributes_of(span: &Span, key: &str) -> Option<String> {
    attributes(span).get(key).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reconcile_is_a_span_with_its_cloud_calls_and_api_requests_beneath() {
    let received = Received::default();
    let port = receiver(received.clone()).await;
    let server = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut manager = Manager::start(
        dir.path(),
        server.kubeconfig_path(),
        &["--leader-elect=true", "--secure-port=0"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}")),
            // Export every 100 ms rather than every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ],
    );
    add_uninitialized_node(&server).await;
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .unwrap();
    kube::Api::namespaced(server.client(), "default")
        .create(&Default::default(), &service)
        .await
        .unwrap();

    let deadline = Instant::now() + WAIT;
    let (service_sync, node_sync) = loop {
        let spans = received.lock().clone();
        let service_sync = find_tree(&spans, "service-lb-controller", "ensure_load_balancer", "PATCH");
        let node_sync = spans
            .iter()
            .filter(|s| {
                s.name == "reconcile"
                    && attributes_of(s, "controller").as_deref() == Some("cloud-node-controller")
            })
            .find(|s| !children(&spans, s).is_empty())
            .map(attributes);
        if let (Some(service_sync), Some(node_sync)) = (service_sync, node_sync) {
            break (
                service_sync,
                node_sync
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        assert!(
            Instant::now() < deadline,
            "no reconcile span with a cloud call and an API request beneath it among {} spans ({:?}):\n{}",
            spans.len(),
            spans
                .iter()
                .map(|s| s.name.as_str())
                .collect::<std::collections::BTreeSet<_>>(),
            manager.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(service_sync["object"], "default/web");
    assert_eq!(service_sync["lease"], "cloud-controller-manager");
    assert_eq!(node_sync["object"], "n1");
    assert!(manager.terminate().success(), "{}", manager.log());
}
