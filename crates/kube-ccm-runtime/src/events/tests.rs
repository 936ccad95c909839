//! The recorder against client-go's legacy recorder: names, repeats, combining, the spam filter, the
//! caches' bounds and the background writer.

use super::*;

fn recorder() -> EventRecorder {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    EventRecorder::new(
        kube::Client::try_from(config).unwrap(),
        "cloud-node-controller",
        "host-1_abc",
    )
}

fn node(name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        ..ObjectReference::default()
    }
}

fn at(seconds: i64) -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap())
}

fn record(recorder: &EventRecorder, about: &str, reason: &str, message: &str, seconds: i64) -> Write {
    recorder.correlate(
        &node(about),
        EventType::Normal,
        reason,
        "Sync",
        message.to_owned(),
        (Instant::now(), at(seconds)),
    )
}

#[tokio::test(start_paused = true)]
async fn a_new_event_is_written_as_client_gos_legacy_recorder_writes_it() {
    let Write::Create(event) = record(&recorder(), "n1", "Synced", "Node synced successfully", 0) else {
        panic!("a first event is created");
    };
    let name = event.metadata.name.unwrap();
    let (object, nanos) = name.split_once('.').unwrap();
    assert_eq!(object, "n1");
    assert_eq!(i128::from_str_radix(nanos, 16).unwrap(), at(0).0.as_nanosecond());
    assert_eq!(
        event.metadata.namespace.as_deref(),
        Some("default"),
        "cluster-scoped: default"
    );
    assert_eq!(event.count, Some(1));
    assert_eq!(event.first_timestamp, Some(at(0)));
    assert_eq!(event.last_timestamp, Some(at(0)));
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(
        event.reporting_component.as_deref(),
        Some("cloud-node-controller")
    );
    assert_eq!(event.reporting_instance.as_deref(), Some("host-1_abc"));
    let source = event.source.unwrap();
    assert_eq!(source.component.as_deref(), Some("cloud-node-controller"));
    assert_eq!(event.event_time, None, "legacy Events carry no eventTime");
}

#[tokio::test(start_paused = true)]
async fn a_repeat_counts_on_the_same_event_and_another_message_is_another_event() {
    let recorder = recorder();
    let Write::Create(first) = record(&recorder, "n1", "Synced", "m", 0) else {
        panic!()
    };
    let Write::Bump(again) = record(&recorder, "n1", "Synced", "m", 5) else {
        panic!("a repeat bumps the count")
    };
    assert_eq!(again.metadata.name, first.metadata.name);
    assert_eq!(again.count, Some(2));
    assert_eq!(again.first_timestamp, Some(at(0)));
    assert_eq!(again.last_timestamp, Some(at(5)));
    assert!(matches!(
        record(&recorder, "n1", "Synced", "other", 6),
        Write::Create(_)
    ));
    assert!(matches!(
        record(&recorder, "n2", "Synced", "m", 7),
        Write::Create(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn each_cache_forgets_its_oldest_keys_past_4096() {
    let recorder = recorder();
    for i in 0..=CACHE_ENTRIES {
        assert!(matches!(
            record(&recorder, &format!("n{i}"), "Synced", "m", 0),
            Write::Create(_)
        ));
    }
    {
        let state = recorder.state.lock();
        assert_eq!(state.written.entries.len(), CACHE_ENTRIES);
        assert_eq!(state.similar.entries.len(), CACHE_ENTRIES);
        assert_eq!(state.spam.entries.len(), CACHE_ENTRIES);
        assert_eq!(state.written.order.len(), CACHE_ENTRIES);
    }
    // The first node's Event was forgotten: a new one; the last's is counted.
    assert!(matches!(
        record(&recorder, "n0", "Synced", "m", 1),
        Write::Create(_)
    ));
    assert!(matches!(
        record(&recorder, &format!("n{CACHE_ENTRIES}"), "Synced", "m", 1),
        Write::Bump(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn ten_different_messages_of_one_reason_are_combined() {
    let recorder = recorder();
    for i in 0..9 {
        assert!(matches!(
            record(&recorder, "n1", "Failed", &format!("m{i}"), i),
            Write::Create(_)
        ));
    }
    let Write::Create(combined) = record(&recorder, "n1", "Failed", "m9", 9) else {
        panic!("the tenth is a new, combined Event")
    };
    assert_eq!(
        combined.message.as_deref(),
        Some("(combined from similar events): m9")
    );
    let Write::Bump(more) = record(&recorder, "n1", "Failed", "m10", 10) else {
        panic!("later ones count on the combined Event")
    };
    assert_eq!(more.metadata.name, combined.metadata.name);
    assert_eq!(
        more.message.as_deref(),
        Some("(combined from similar events): m10")
    );
}

#[tokio::test(start_paused = true)]
async fn the_spam_filter_lets_25_through_then_one_per_five_minutes() {
    let recorder = recorder();
    let written = (0..30)
        .filter(|i| !matches!(record(&recorder, "n1", "Synced", "m", *i), Write::Drop))
        .count();
    assert_eq!(written, 25);
    tokio::time::advance(SPAM_REFILL).await;
    assert!(!matches!(
        record(&recorder, "n1", "Synced", "m", 400),
        Write::Drop
    ));
    assert!(matches!(record(&recorder, "n1", "Synced", "m", 401), Write::Drop));
    assert!(
        !matches!(record(&recorder, "n2", "Synced", "m", 402), Write::Drop),
        "per object"
    );
}

#[tokio::test(start_paused = true)]
async fn long_messages_are_cut_at_a_character_boundary() {
    let Write::Create(event) = record(&recorder(), "n1", "Synced", &"é".repeat(600), 0) else {
        panic!()
    };
    let message = event.message.unwrap();
    assert_eq!(message.len(), MAX_MESSAGE_BYTES);
    assert!(message.chars().all(|c| c == 'é'));
}

/// Repeats recorded at once are written in order by the background task: the count's patches never
/// overtake the Event's creation (written concurrently, a patch finding no Event creates it, and the
/// creation after it is refused: counts are lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_recorder_writes_in_order() {
    let server = control_plane::ApiServer::for_test(control_plane::Backend::Test).await;
    let recorder = EventRecorder::new(server.client(), "service-controller", "host-1_abc").in_background();
    for _ in 0..8 {
        recorder
            .record(&node("n1"), EventType::Normal, "Synced", "Sync", "m".into())
            .await;
    }
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    let counts = loop {
        let list = events.list(&Default::default()).await.unwrap();
        let counts: Vec<i32> = list.items.iter().filter_map(|e| e.count).collect();
        if counts.iter().sum::<i32>() >= 8 || Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(counts, [8], "one Event, counted eight times");
}

/// Recording returns while the API server does not answer (a listener that never accepts).
#[tokio::test]
async fn a_background_recorder_never_waits_for_the_api_server() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let config = kube::Config::new(url.parse().unwrap());
    let recorder = EventRecorder::new(kube::Client::try_from(config).unwrap(), "c", "h").in_background();
    let about = node("n1");
    for i in 0..3 {
        let recording = recorder.record(&about, EventType::Normal, "Synced", "Sync", format!("m{i}"));
        tokio::time::timeout(Duration::from_secs(10), recording)
            .await
            .expect("recorded without waiting for the write");
    }
    drop(silent);
}

/// A front for the API server at `upstream` that closes the first `dropped` connections it accepts
/// without an answer (a write that fails before the API server answers) and relays the rest; it counts
/// the connections it accepted.
async fn flaky_front(
    upstream: &str,
    dropped: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let upstream: http::Uri = upstream.parse().unwrap();
    let (scheme, upstream) = (
        upstream.scheme_str().unwrap().to_owned(),
        upstream.authority().unwrap().to_string(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = format!("{scheme}://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            if counted.fetch_add(1, Ordering::SeqCst) < dropped {
                drop(inbound);
                continue;
            }
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    (front, accepted)
}

/// A write that got no answer (its connection closed) is tried again, as client-go's recorder does;
/// the Event arrives once the API server can be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_recorder_tries_again_a_write_that_got_no_answer() {
    let server = control_plane::ApiServer::for_test(control_plane::Backend::Test).await;
    let (front, accepted) = flaky_front(server.url(), 2).await;
    let mut config = server.config();
    config.cluster_url = front.parse().unwrap();
    let recorder = EventRecorder::new(kube::Client::try_from(config).unwrap(), "service-controller", "h")
        .in_background()
        .retrying_every(Duration::from_millis(50));
    let reason = "UpdatedLoadBalancer";
    recorder
        .record(
            &node("n1"),
            EventType::Normal,
            reason,
            "UpdateLoadBalancer",
            "m".into(),
        )
        .await;
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    let reasons = loop {
        let list = events.list(&Default::default()).await.unwrap();
        let reasons: Vec<String> = list.items.into_iter().filter_map(|e| e.reason).collect();
        if !reasons.is_empty() || Instant::now() > deadline {
            break reasons;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reasons, [reason], "written on the third try");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "two connections dropped, one relayed"
    );
}

/// Only a write that failed before any answer is tried again: an answer is final, and so is a write the
/// lock refused or that outlived the lock's validity.
#[test]
fn what_is_worth_another_try() {
    let boxed = |error: Box<dyn std::error::Error + Send + Sync>| kube::Error::Service(error);
    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
    assert!(worth_retrying(&boxed(Box::new(reset))), "a connection reset");
    let timeout = crate::DeadlineExceeded {
        why: crate::Deadline::RequestTimeout,
    };
    assert!(worth_retrying(&boxed(Box::new(timeout))), "the request timeout");
    let lease = crate::DeadlineExceeded {
        why: crate::Deadline::Lease("cloud-controller-manager".into()),
    };
    assert!(
        !worth_retrying(&boxed(Box::new(lease))),
        "past the lock's validity"
    );
    let fenced = crate::Fenced {
        lease: "cloud-controller-manager".into(),
    };
    assert!(!worth_retrying(&boxed(Box::new(fenced))), "refused by the lock");
    let stopping = crate::Stopping {
        lease: "cloud-controller-manager".into(),
    };
    assert!(
        !worth_retrying(&boxed(Box::new(stopping))),
        "the controllers are stopping"
    );
    let answer: kube::core::Status = serde_json::from_value(serde_json::json!({
        "status": "Failure", "reason": "Forbidden", "code": 403, "message": "events is forbidden"
    }))
    .unwrap();
    assert!(!worth_retrying(&kube::Error::Api(answer.into())), "an answer");
}
