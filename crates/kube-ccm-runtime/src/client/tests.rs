use super::*;

#[test]
fn a_fenced_write_carries_its_deadline_to_the_server() {
    let mut request = http::Request::patch("https://h/api/v1/nodes/n1?fieldValidation=Ignore&timeout=9s")
        .body(())
        .unwrap();
    with_server_timeout(&mut request, Duration::from_micros(1_234_567));
    assert_eq!(
        request.uri().to_string(),
        "https://h/api/v1/nodes/n1?fieldValidation=Ignore&timeout=1234ms"
    );
    let mut request = http::Request::post("/api/v1/namespaces/default/events")
        .body(())
        .unwrap();
    with_server_timeout(&mut request, Duration::ZERO);
    assert_eq!(
        request.uri().to_string(),
        "/api/v1/namespaces/default/events?timeout=1ms"
    );
}

#[tokio::test(start_paused = true)]
async fn the_bucket_allows_a_burst_then_qps() {
    let bucket = TokenBucket {
        qps: 10.0,
        burst: 3.0,
        state: Mutex::new((3.0, Instant::now())),
    };
    for _ in 0..3 {
        assert_eq!(bucket.take(), Ok(()));
    }
    let wait = bucket.take().unwrap_err();
    assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(bucket.take(), Ok(()));
    tokio::time::advance(Duration::from_secs(10)).await;
    for _ in 0..3 {
        assert_eq!(bucket.take(), Ok(()));
    }
    assert!(bucket.take().is_err(), "never more than the burst");
}
