//! Injected faults, for one client or all.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube_ccm_test_apiserver::{FaultAction, FaultSpec, TestApiServer};

fn maps(server: &TestApiServer, user_agent: &str) -> Api<ConfigMap> {
    Api::namespaced(server.client_with(&server.admin_token(), user_agent), "default")
}

#[tokio::test]
async fn errors_hit_only_matching_clients_and_carry_retry_after() {
    let server = TestApiServer::start().await.unwrap();
    server.add_fault(FaultSpec {
        user_agent: Some("victim".into()),
        action: FaultAction::Error {
            code: 500,
            rate: 1.0,
            retry_after_seconds: None,
        },
        duration_ms: None,
    });
    match maps(&server, "victim/1").list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (500, "InternalError"))
        }
        other => panic!("expected an injected 500, got {other:?}"),
    }
    maps(&server, "bystander/1")
        .list(&ListParams::default())
        .await
        .expect("other clients are unaffected");
    server.clear_faults();
    maps(&server, "victim/1")
        .list(&ListParams::default())
        .await
        .expect("healed");

    // 429 carries Retry-After, as the real server's priority and fairness does.
    server.add_fault(FaultSpec {
        user_agent: Some("curl-like".into()),
        action: FaultAction::Error {
            code: 429,
            rate: 1.0,
            retry_after_seconds: Some(7),
        },
        duration_ms: None,
    });
    let response = raw_get(&server, "/api/v1/namespaces", "curl-like").await;
    assert!(response.starts_with("HTTP/1.1 429"), "{response}");
    assert!(
        response.to_ascii_lowercase().contains("retry-after: 7"),
        "{response}"
    );
}

/// A GET over a plain TCP connection, to see the raw status line and headers.
async fn raw_get(server: &TestApiServer, path: &str, user_agent: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = server.url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: {user_agent}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        server.admin_token()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn latency_is_added_before_handling() {
    let server = TestApiServer::start().await.unwrap();
    server.add_fault(FaultSpec {
        user_agent: Some("slow".into()),
        action: FaultAction::Latency { ms: 150 },
        duration_ms: None,
    });
    maps(&server, "slow/1")
        .list(&ListParams::default())
        .await
        .unwrap();
    maps(&server, "fast/1")
        .list(&ListParams::default())
        .await
        .unwrap();
    let requests = server.requests();
    let slow = requests.iter().find(|r| r.user_agent == "slow/1").unwrap();
    let fast = requests.iter().find(|r| r.user_agent == "fast/1").unwrap();
    // The request log measures from arrival, so the injected delay is part of the recorded latency.
    assert!(slow.latency_ms >= 150.0, "{}", slow.latency_ms);
    assert!(fast.latency_ms < 150.0, "{}", fast.latency_ms);
}

#[tokio::test]
async fn a_partition_hangs_requests_and_ends_watches_until_it_is_over() {
    let server = TestApiServer::start().await.unwrap();
    let cut_off = maps(&server, "cut-off/1");
    let mut watch = Box::pin(
        cut_off
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .unwrap(),
    );
    server.add_fault(FaultSpec {
        user_agent: Some("cut-off".into()),
        action: FaultAction::Partition,
        duration_ms: Some(300),
    });
    // The open watch ends.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        use futures::StreamExt;
        while watch.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the partitioned client's watch was closed");
    // New requests hang: the client gives up, the server never handles them.
    let hung = tokio::time::timeout(Duration::from_millis(200), cut_off.list(&ListParams::default())).await;
    assert!(hung.is_err(), "a partitioned request hangs");
    maps(&server, "other/1")
        .list(&ListParams::default())
        .await
        .expect("other clients are unaffected");
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.user_agent != "cut-off/1" || r.verb.as_deref() == Some("watch"))
    );
    // After the partition, the client is served again.
    crate::support::eventually(Duration::from_secs(5), "the partition to end", || {
        let api = cut_off.clone();
        async move {
            tokio::time::timeout(Duration::from_millis(100), api.list(&ListParams::default()))
                .await
                .is_ok_and(|r| r.is_ok())
        }
    })
    .await;
}
