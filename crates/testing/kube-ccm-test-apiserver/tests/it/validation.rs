//! The server refuses what a real API server refuses, with its codes and messages, and accepts what it
//! accepts: checked with the real kubectl and with raw HTTP through kube-rs.

use http::Request;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_ccm_test_apiserver::TestApiServer;
use serde_json::{Value, json};

use crate::support::{kubectl_with_input, ok};

/// Sends `body` to `path` with `method`; returns the status, the `Warning` headers and the JSON body.
async fn send(
    server: &TestApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Vec<String>, Value) {
    let client = server.client();
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body.as_bytes().to_vec())
        .unwrap();
    let response = client.send(request.map(kube::client::Body::from)).await.unwrap();
    let status = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        warnings,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
const NODES: &str = "/api/v1/nodes";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_invalid_objects_refused_and_unknown_fields_handled_per_validate() {
    let server = TestApiServer::start().await.unwrap();
    let config = server.kubeconfig_path();
    let bad = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: bad\n  namespace: default\nspec:\n  leaseDurationSeconds: -1\n";
    let refused = kubectl_with_input(config, &["create", "-f", "-"], Some(bad));
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "The Lease \"bad\" is invalid: spec.leaseDurationSeconds: Invalid value: -1: must be greater than 0"
    );

    let colourful = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: colourful\n  namespace: default\nspec:\n  holderIdentity: me\n  colour: red\n";
    // kubectl validates strictly by default.
    let strict = kubectl_with_input(config, &["create", "-f", "-"], Some(colourful));
    assert!(!strict.status.success());
    assert!(
        String::from_utf8_lossy(&strict.stderr).contains(
            "Lease in version \"v1\" cannot be handled as a Lease: strict decoding error: unknown field \"spec.colour\""
        ),
        "{}",
        String::from_utf8_lossy(&strict.stderr)
    );
    // Warn: created, kubectl prints the server's warning, and the field is not stored.
    let warned = kubectl_with_input(config, &["create", "--validate=warn", "-f", "-"], Some(colourful));
    ok(&warned);
    assert!(
        String::from_utf8_lossy(&warned.stderr).contains("Warning: unknown field \"spec.colour\""),
        "{}",
        String::from_utf8_lossy(&warned.stderr)
    );
    let stored = Api::<Lease>::namespaced(server.client(), "default")
        .get("colourful")
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(stored.spec).unwrap(),
        json!({"holderIdentity": "me"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_bodies_name_every_field_and_numbers_that_do_not_fit_are_bad_requests() {
    let server = TestApiServer::start().await.unwrap();
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"team": "x".repeat(100)}},
        "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}});
    let (status, _, body) = send(&server, "POST", NODES, "application/json", &node.to_string()).await;
    assert_eq!(status, 422);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["kind"], "Node");
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["metadata.labels", "metadata.taints[0].effect"]);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Node \"n1\" is invalid: [metadata.labels: Invalid value: \"xxxx"),
        "{body}"
    );

    let lease = json!({"metadata": {"name": "huge"}, "spec": {"leaseDurationSeconds": 3_000_000_000_i64}});
    let (status, _, body) = send(&server, "POST", LEASES, "application/json", &lease.to_string()).await;
    assert_eq!((status, body["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(
        body["message"],
        "Lease in version \"v1\" cannot be handled as a Lease: json: cannot unmarshal number 3000000000 into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32"
    );

    // Not validated upstream either: a node address type the server does not know is stored.
    let bogus =
        json!({"metadata": {"name": "n2"}, "status": {"addresses": [{"type": "Bogus", "address": "x"}]}});
    let (status, _, _) = send(&server, "POST", NODES, "application/json", &bogus.to_string()).await;
    assert_eq!(status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_nodes_and_field_validation_modes() {
    let server = TestApiServer::start().await.unwrap();
    // A core/v1 Event about nothing in `default` is accepted (legacy rules); elsewhere its namespace must match.
    let event =
        |namespace: &str| json!({"metadata": {"name": "e", "namespace": namespace}, "reason": "Hello"});
    let (status, _, _) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/events",
        "application/json",
        &event("default").to_string(),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _, body) = send(
        &server,
        "POST",
        "/api/v1/namespaces/kube-system/events",
        "application/json",
        &event("kube-system").to_string(),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(
        body["message"],
        "Event \"e\" is invalid: involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
    );
    // events.k8s.io/v1 requires what a recorder sends.
    let (status, _, body) = send(
        &server,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        "application/json",
        &json!({"metadata": {"name": "e2"}, "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal"})
            .to_string(),
    )
    .await;
    assert_eq!(status, 422);
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "reportingController",
            "reportingController",
            "reportingController",
            "reportingInstance",
            "action",
            "reason"
        ]
    );

    // A provider ID is set once.
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let set = Patch::Merge(json!({"spec": {"providerID": "fake://z/n1"}}));
    nodes.patch("n1", &PatchParams::default(), &set).await.unwrap();
    let change = Patch::Merge(json!({"spec": {"providerID": "fake://z/other"}}));
    let error = nodes
        .patch("n1", &PatchParams::default(), &change)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("{error:?}")
    };
    assert_eq!(
        (status.code, status.message.as_str()),
        (
            422,
            "Node \"n1\" is invalid: spec.providerID: Forbidden: node updates may not change providerID except from \"\" to valid"
        )
    );

    // fieldValidation: Warn is the default; Ignore drops silently; Strict refuses; nonsense is refused.
    let body =
        json!({"metadata": {"name": "w"}, "spec": {"holderIdentity": "me", "colour": "red"}}).to_string();
    let (status, warnings, _) = send(&server, "POST", LEASES, "application/json", &body).await;
    assert_eq!(
        (status, warnings),
        (
            201,
            vec!["299 - \"unknown field \\\"spec.colour\\\"\"".to_owned()]
        )
    );
    let (status, warnings, _) = send(
        &server,
        "POST",
        &format!("{LEASES}?fieldValidation=Ignore"),
        "application/json",
        &body.replace("\"w\"", "\"i\""),
    )
    .await;
    assert_eq!((status, warnings.len()), (201, 0));
    let (status, _, body_strict) = send(
        &server,
        "POST",
        &format!("{LEASES}?fieldValidation=Strict"),
        "application/json",
        &body.replace("\"w\"", "\"s\""),
    )
    .await;
    assert_eq!(status, 400, "{body_strict}");
    let (status, _, nonsense) = send(
        &server,
        "POST",
        &format!("{LEASES}?fieldValidation=Loud"),
        "application/json",
        &body,
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(
        nonsense["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Loud\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
    );
    // A merge patch adding an unknown field under Strict is upstream's 422 `patch` error.
    let (status, _, patched) = send(
        &server,
        "PATCH",
        &format!("{LEASES}/w?fieldValidation=Strict"),
        "application/merge-patch+json",
        r#"{"spec":{"size":1}}"#,
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(patched["details"]["causes"][0]["field"], "patch");
    assert!(
        patched["message"]
            .as_str()
            .unwrap()
            .starts_with(" \"\" is invalid: patch: Invalid value: "),
        "{patched}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_takes_the_name_from_the_live_object() {
    let server = TestApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let params = PatchParams::apply("spec-only");
    let spec_only =
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": "me"}});
    // Absent: the name comes from nowhere, as upstream.
    let error = leases
        .patch("l", &params, &Patch::Apply(&spec_only))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("{error:?}")
    };
    assert_eq!(
        (status.code, status.message.as_str()),
        (
            400,
            "the name of the object () does not match the name on the URL (l)"
        )
    );
    // Present: merged onto the live object.
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let applied = leases
        .patch("l", &params, &Patch::Apply(&spec_only))
        .await
        .unwrap();
    assert_eq!(applied.spec.unwrap().holder_identity.as_deref(), Some("me"));
    // A different name is refused either way.
    let renamed = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "m"}});
    let error = leases
        .patch("l", &params, &Patch::Apply(&renamed))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("{error:?}")
    };
    assert_eq!(status.code, 400);
    // An unknown field in an applied configuration fails the typed conversion (500), whatever the mode.
    let unknown = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"colour": "red"}});
    let error = leases
        .patch("l", &params, &Patch::Apply(&unknown))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("{error:?}")
    };
    assert_eq!(
        (status.code, status.message.as_str()),
        (
            500,
            "failed to create typed patch object (default/l; coordination.k8s.io/v1, Kind=Lease): .spec.colour: field not declared in schema"
        )
    );
}
