//! kube-rs against the server: the semantics controllers and leader election rely on.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube_ccm_test_apiserver::{Config, TestApiServer};
use serde_json::json;

use crate::support::{api_error, configmap};

#[tokio::test]
async fn two_writers_one_wins_the_other_gets_a_conflict() {
    let server = TestApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "nobody"}}))
            .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut first = created.clone();
    let mut second = created.clone();
    first.spec.as_mut().unwrap().holder_identity = Some("a".into());
    second.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let winner = leases.replace("l", &PostParams::default(), &first).await.unwrap();
    assert!(winner.metadata.resource_version > created.metadata.resource_version);
    let (code, reason) = api_error(
        leases
            .replace("l", &PostParams::default(), &second)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        leases
            .get("l")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("a")
    );
    let (code, reason) = api_error(leases.create(&PostParams::default(), &lease).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    let (code, _) = api_error(leases.get("missing").await.unwrap_err());
    assert_eq!(code, 404);
}

#[tokio::test]
async fn no_op_updates_do_not_bump_the_resource_version() {
    let server = TestApiServer::start().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let created = maps
        .create(&PostParams::default(), &configmap("c", json!({"a": "1"})))
        .await
        .unwrap();
    let same = maps.replace("c", &PostParams::default(), &created).await.unwrap();
    assert_eq!(same.metadata.resource_version, created.metadata.resource_version);
    let patched = maps
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.resource_version,
        created.metadata.resource_version
    );
}

#[tokio::test]
async fn watcher_recovers_from_410_by_relisting() {
    // Long bookmark interval: the watcher's resourceVersion must stay behind the compaction point.
    let config = Config {
        bookmark_interval: Duration::from_secs(3600),
        ..Config::default()
    };
    let server = TestApiServer::start_with(config).await.unwrap();
    let client = server.client();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    maps.create(&PostParams::default(), &configmap("before", json!({})))
        .await
        .unwrap();

    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let watch = tokio::spawn(
        watcher(maps.clone(), watcher::Config::default()).for_each(move |event| {
            let _ = events_tx.send(
                event
                    .map(|e| match e {
                        watcher::Event::Init => "Init".to_owned(),
                        watcher::Event::InitApply(o) => format!("InitApply {}", o.metadata.name.unwrap()),
                        watcher::Event::InitDone => "InitDone".to_owned(),
                        watcher::Event::Apply(o) => format!("Apply {}", o.metadata.name.unwrap()),
                        watcher::Event::Delete(o) => format!("Delete {}", o.metadata.name.unwrap()),
                    })
                    .map_err(|e| e.to_string()),
            );
            async {}
        }),
    );
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an event in time")
            .expect("stream open")
    };
    assert_eq!(next().await, Ok("Init".to_owned()));
    assert_eq!(next().await, Ok("InitApply before".to_owned()));
    assert_eq!(next().await, Ok("InitDone".to_owned()));
    maps.create(&PostParams::default(), &configmap("during", json!({})))
        .await
        .unwrap();
    assert_eq!(next().await, Ok("Apply during".to_owned()));

    // A write elsewhere moves the global version on, then history is dropped and the watch is cut.
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap(),
        )
        .await
        .unwrap();
    server.compact();
    server.close_watches(None);
    let error = next().await.expect_err("the resumed watch gets 410");
    assert!(
        error.contains("410") || error.to_lowercase().contains("expired"),
        "{error}"
    );
    assert_eq!(next().await, Ok("Init".to_owned()), "re-list after 410");
    assert_eq!(next().await, Ok("InitApply before".to_owned()));
    assert_eq!(next().await, Ok("InitApply during".to_owned()));
    assert_eq!(next().await, Ok("InitDone".to_owned()));
    maps.create(&PostParams::default(), &configmap("after", json!({})))
        .await
        .unwrap();
    assert_eq!(next().await, Ok("Apply after".to_owned()));
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.verb.as_deref() == Some("list") && r.resource.as_deref() == Some("configmaps"))
        .count();
    assert_eq!(lists, 2);
    watch.abort();
}

#[tokio::test]
async fn finalizers_hold_deletion_until_the_last_one_goes() {
    let server = TestApiServer::start().await.unwrap();
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "lb", "finalizers": ["service.kubernetes.io/load-balancer-cleanup", "example.com/other"]},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &service).await.unwrap();
    let pending = services.delete("lb", &DeleteParams::default()).await.unwrap();
    let marked = pending
        .left()
        .expect("the object comes back while finalizers remain");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(
        services
            .get("lb")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // New finalizers may not be added once deletion started.
    let add = json!({"metadata": {"finalizers": ["service.kubernetes.io/load-balancer-cleanup", "example.com/other", "late"]}});
    let (code, _) = api_error(
        services
            .patch("lb", &PatchParams::default(), &Patch::Merge(add))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);

    let one_left = json!({"metadata": {"finalizers": ["example.com/other"]}});
    services
        .patch("lb", &PatchParams::default(), &Patch::Merge(one_left))
        .await
        .unwrap();
    assert!(services.get_opt("lb").await.unwrap().is_some());
    let json_patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/other"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
    .unwrap();
    services
        .patch("lb", &PatchParams::default(), &Patch::<()>::Json(json_patch))
        .await
        .unwrap();
    assert!(
        services.get_opt("lb").await.unwrap().is_none(),
        "gone with its last finalizer"
    );
    let deletes = server
        .requests()
        .iter()
        .filter(|r| r.verb.as_deref() == Some("delete"))
        .count();
    assert_eq!(deletes, 1);
}

#[tokio::test]
async fn delete_preconditions() {
    let server = TestApiServer::start().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    maps.create(&PostParams::default(), &configmap("c", json!({})))
        .await
        .unwrap();
    let stale = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let (code, _) = api_error(maps.delete("c", &stale).await.unwrap_err());
    assert_eq!(code, 409);
    assert!(
        maps.delete("c", &DeleteParams::default())
            .await
            .unwrap()
            .is_right(),
        "deleted at once: a Status comes back"
    );
}

#[tokio::test]
async fn status_is_only_written_through_the_status_subresource() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "Hostname", "address": "n1"}]},
    }))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(
        created.status.as_ref().unwrap().addresses.as_ref().unwrap().len(),
        1,
        "nodes keep status on create"
    );

    // A main-resource write that also changes status: the status change is dropped.
    let main = json!({"spec": {"providerID": "fake://n1"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
    let after_main = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(main))
        .await
        .unwrap();
    assert_eq!(after_main.spec.unwrap().provider_id.as_deref(), Some("fake://n1"));
    assert_eq!(after_main.status.unwrap().addresses.unwrap()[0].type_, "Hostname");

    // A status write that also changes the spec: the spec change is dropped.
    let status = json!({"spec": {"providerID": "other"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
    let after_status = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    assert_eq!(
        after_status.spec.unwrap().provider_id.as_deref(),
        Some("fake://n1")
    );
    let addresses = after_status.status.unwrap().addresses.unwrap();
    assert_eq!(
        addresses.iter().map(|a| a.type_.as_str()).collect::<Vec<_>>(),
        ["InternalIP"]
    );
    assert_eq!(
        after_status.metadata.generation,
        Some(2),
        "generation counts spec changes only"
    );
}

#[tokio::test]
async fn every_patch_type() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"a": "1"}},
        "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}, {"key": "y", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "NetworkUnavailable", "status": "True"}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    let merged = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.metadata.labels.unwrap().len(), 2);

    let json_patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/metadata/labels/a"}])).unwrap();
    let patched = nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(json_patch))
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap().keys().collect::<Vec<_>>(), ["b"]);

    // Strategic: conditions merge by type; taints (no patch strategy on the real server) are replaced.
    let strategic = json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]}});
    let after = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(strategic))
        .await
        .unwrap();
    let conditions = after.status.unwrap().conditions.unwrap();
    assert_eq!(
        conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect::<Vec<_>>(),
        [("Ready", "True"), ("NetworkUnavailable", "False")]
    );
    let taints = json!({"spec": {"taints": [{"key": "y", "effect": "NoSchedule"}]}});
    let after = nodes
        .patch("n1", &PatchParams::default(), &Patch::Strategic(taints))
        .await
        .unwrap();
    assert_eq!(after.spec.unwrap().taints.unwrap().len(), 1);

    // Server-side apply: conflicts, force, and ownership.
    let applied =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"owner": "a"}}});
    nodes
        .patch("n1", &PatchParams::apply("manager-a"), &Patch::Apply(&applied))
        .await
        .unwrap();
    let rival =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"owner": "b"}}});
    let (code, reason) = api_error(
        nodes
            .patch("n1", &PatchParams::apply("manager-b"), &Patch::Apply(&rival))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let forced = nodes
        .patch(
            "n1",
            &PatchParams::apply("manager-b").force(),
            &Patch::Apply(&rival),
        )
        .await
        .unwrap();
    assert_eq!(forced.metadata.labels.unwrap()["owner"], "b");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"manager-b".to_owned()) && !managers.contains(&"manager-a".to_owned()),
        "{managers:?}"
    );

    // Apply creates a missing object.
    let fresh = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}, "spec": {"podCIDR": "10.0.2.0/24"}});
    let created = nodes
        .patch("n2", &PatchParams::apply("manager-a"), &Patch::Apply(&fresh))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
}

#[tokio::test]
async fn selectors_pagination_and_watch_transitions() {
    let server = TestApiServer::start().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..7 {
        let mut map = configmap(&format!("m{i}"), json!({}));
        map.metadata.labels = Some(
            [(
                "parity".to_owned(),
                if i % 2 == 0 { "even" } else { "odd" }.to_owned(),
            )]
            .into(),
        );
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    let even = maps
        .list(&ListParams::default().labels("parity=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 4);
    let not_even = maps
        .list(&ListParams::default().labels("parity notin (even)"))
        .await
        .unwrap();
    assert_eq!(not_even.items.len(), 3);
    let by_name = maps
        .list(&ListParams::default().fields("metadata.name=m3"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);

    let first_page = maps.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first_page.items.len(), 3);
    let token = first_page.metadata.continue_.clone().expect("more pages");
    let second_page = maps
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second_page.items[0].metadata.name.as_deref(), Some("m3"));
    assert_eq!(second_page.metadata.remaining_item_count, Some(1));
    // A filtered list pages the same way, without a count of what is left (as upstream).
    let first_odd = maps
        .list(&ListParams::default().labels("parity=odd").limit(2))
        .await
        .unwrap();
    let token = first_odd.metadata.continue_.clone().expect("more odd maps");
    assert_eq!(first_odd.metadata.remaining_item_count, None);
    let rest_odd = maps
        .list(
            &ListParams::default()
                .labels("parity=odd")
                .limit(2)
                .continue_token(&token),
        )
        .await
        .unwrap();
    let names: Vec<_> = first_odd
        .items
        .iter()
        .chain(&rest_odd.items)
        .filter_map(|m| m.metadata.name.as_deref())
        .collect();
    assert_eq!(names, ["m1", "m3", "m5"]);
    assert_eq!(rest_odd.metadata.continue_, None);

    // List resourceVersion semantics: never older than asked; newer than the server is a 504, as upstream.
    let current: u64 = first_page
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    let not_older = ListParams::default().at(&current.to_string());
    assert_eq!(maps.list(&not_older).await.unwrap().items.len(), 7);
    let (code, reason) = api_error(
        maps.list(&ListParams::default().at(&(current + 1000).to_string()))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (504, "Timeout"));

    // A watch with a selector sees an object enter (ADDED) and leave (DELETED) its view.
    let odd_watch = maps
        .watch(&kube::api::WatchParams::default().labels("parity=odd"), "0")
        .await
        .unwrap()
        .boxed();
    let mut odd_watch = odd_watch.map_ok(|event| match event {
        kube::api::WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.unwrap()),
        kube::api::WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.unwrap()),
        kube::api::WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.unwrap()),
        other => format!("{other:?}"),
    });
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), odd_watch.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    for name in ["m1", "m3", "m5"] {
        assert_eq!(next().await, format!("ADDED {name}"));
    }
    maps.patch(
        "m0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"parity": "odd"}}})),
    )
    .await
    .unwrap();
    assert_eq!(next().await, "ADDED m0");
    maps.patch(
        "m1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"parity": "even"}}})),
    )
    .await
    .unwrap();
    assert_eq!(next().await, "DELETED m1");
    maps.patch(
        "m3",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "y"}})),
    )
    .await
    .unwrap();
    assert_eq!(next().await, "MODIFIED m3");
}

#[tokio::test]
async fn lease_writes_are_recorded_with_holder_and_server_time() {
    let server = TestApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(
        server.client_with(&server.admin_token(), "elector-a/1.0"),
        "kube-system",
    );
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "m"}, "spec": {"holderIdentity": "a", "leaseTransitions": 0, "leaseDurationSeconds": 15}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    leases
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "b", "leaseTransitions": 1}})),
        )
        .await
        .unwrap();
    leases.delete("m", &DeleteParams::default()).await.unwrap();
    let history = server.leases();
    let summary: Vec<(&str, Option<&str>, Option<i64>)> = history
        .iter()
        .map(|r| {
            (
                r.operation.as_str(),
                r.holder_identity.as_deref(),
                r.lease_transitions,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("create", Some("a"), Some(0)),
            ("patch", Some("b"), Some(1)),
            ("delete", Some("b"), Some(1))
        ]
    );
    assert!(
        history
            .windows(2)
            .all(|w| w[0].time_us <= w[1].time_us && w[0].resource_version < w[1].resource_version)
    );
    assert!(history.iter().all(|r| r.user_agent == "elector-a/1.0"));
    let requests = server.requests();
    let writes: Vec<&str> = requests
        .iter()
        .filter(|r| r.is_write())
        .map(|r| r.verb.as_deref().unwrap())
        .collect();
    assert_eq!(writes, ["create", "patch", "delete"]);
    assert_eq!(
        server.counters().get("create leases.coordination.k8s.io"),
        Some(&1)
    );
}

#[tokio::test]
async fn objects_need_an_existing_namespace_and_valid_names() {
    let server = TestApiServer::start().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "missing");
    let (code, _) = api_error(
        maps.create(&PostParams::default(), &configmap("c", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 404);
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let (code, reason) = api_error(
        maps.create(&PostParams::default(), &configmap("Bad_Name", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(server.object_count("", "configmaps"), 0, "nothing was stored");
}

/// Issue 16: the logs keep their most recent records; a reader asking for dropped ones is told so (410),
/// and the counters say how many went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_logs_never_hand_out_a_silent_gap() {
    let server = TestApiServer::start_with(kube_ccm_test_apiserver::Config {
        admin: true,
        log_limit: 5,
        ..kube_ccm_test_apiserver::Config::default()
    })
    .await
    .unwrap();
    let client = server.client();
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    for _ in 0..8 {
        namespaces.get("default").await.unwrap();
    }
    let kept = server.requests();
    assert_eq!(kept.len(), 5);
    let last = kept.last().unwrap().seq;
    assert_eq!(last, 8);
    let get = |path: &str| {
        let request = http::Request::get(path).body(Vec::new()).unwrap();
        let client = client.clone();
        async move { client.request_text(request).await }
    };
    match get("/_admin/requests?since=0").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 410, "{status:?}"),
        other => panic!("expected 410, got {other:?}"),
    }
    let recent = get(&format!("/_admin/requests?since={}", last - 2))
        .await
        .unwrap();
    assert_eq!(recent.lines().count(), 2, "{recent}");
    let counters: serde_json::Value = serde_json::from_str(&get("/_admin/counters").await.unwrap()).unwrap();
    assert!(counters["dropped requests"].as_u64().unwrap() >= 3, "{counters}");
}
