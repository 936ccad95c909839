//! Lists read in pages, and watches that resume from them.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube_ccm_test_apiserver::TestApiServer;
use serde_json::json;

use crate::support::{api_error, configmap};

/// A list read in pages is one list, as the real server's: every page carries the first page's
/// resourceVersion, so a watch from it replays what changed while the pages were read (an object created
/// behind the cursor included: the client would never see it otherwise). A continue token older than the
/// kept history is refused with 410, as upstream's is once etcd compacted past it; the client lists again.
#[tokio::test]
async fn a_paged_list_and_a_watch_from_it_miss_nothing_written_between_the_pages() {
    let server = TestApiServer::start().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 1..=6 {
        maps.create(&PostParams::default(), &configmap(&format!("m{i}"), json!({})))
            .await
            .unwrap();
    }
    let first = maps.list(&ListParams::default().limit(3)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("more pages");
    // Behind the cursor (m3): the next page cannot show it.
    maps.create(&PostParams::default(), &configmap("m0", json!({})))
        .await
        .unwrap();
    let second = maps
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    let names = |list: &kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .iter()
            .filter_map(|m| m.metadata.name.clone())
            .collect()
    };
    assert_eq!(
        [names(&first), names(&second)].concat(),
        ["m1", "m2", "m3", "m4", "m5", "m6"]
    );
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "every page is read as of the first"
    );
    let listed_at = second.metadata.resource_version.clone().unwrap();
    let mut watch = maps
        .watch(&kube::api::WatchParams::default(), &listed_at)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(Duration::from_secs(10), watch.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, kube::api::WatchEvent::Added(m) if m.metadata.name.as_deref() == Some("m0")),
        "{event:?}"
    );

    // A change, then the history forgotten: the token outlived what it needs, 410 as upstream.
    let first = maps.list(&ListParams::default().limit(3)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("more pages");
    maps.create(&PostParams::default(), &configmap("m7", json!({})))
        .await
        .unwrap();
    server.compact();
    let (code, reason) = api_error(
        maps.list(&ListParams::default().limit(3).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));
}
