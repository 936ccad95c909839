//! Tests of delegated authentication and authorisation: the cache, the limits, the reviews.

use super::*;

fn delegation(always: &[&str]) -> Arc<Delegation> {
    Delegation::new(
        DelegationSettings {
            always_allow_paths: always.iter().map(|p| (*p).to_owned()).collect(),
            token_ttl: Duration::from_secs(10),
            allowed_ttl: Duration::from_secs(10),
            denied_ttl: Duration::from_secs(10),
        },
        None,
        None,
    )
}

#[tokio::test]
async fn without_an_api_server_only_always_allowed_paths_and_masters_are_served() {
    let delegation = delegation(&["/healthz", "/debug/*"]);
    assert_eq!(
        delegation.decide("/healthz", "get", None, None).await,
        Decision::Allow
    );
    assert_eq!(
        delegation.decide("/debug/flags/v", "put", None, None).await,
        Decision::Allow
    );
    assert_eq!(
        delegation.decide("/metrics", "get", None, None).await,
        Decision::Forbidden(r#"forbidden: User "system:anonymous" cannot get path "/metrics""#.to_owned())
    );
    // A token nobody can check is refused, even on an always-allowed path (as upstream's filters).
    assert_eq!(
        delegation
            .decide("/healthz", "get", Some("Bearer abc"), None)
            .await,
        Decision::Unauthenticated
    );
    let master = User {
        name: "admin".to_owned(),
        groups: vec!["system:masters".to_owned()],
    };
    assert_eq!(
        delegation.decide("/metrics", "get", None, Some(&master)).await,
        Decision::Allow
    );
}

#[test]
fn a_client_certificate_names_the_user_and_its_groups() {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "prometheus");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "monitoring");
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = params.self_signed(&key).unwrap();
    assert_eq!(
        certificate_user(certificate.der()),
        Some(User {
            name: "prometheus".to_owned(),
            groups: vec!["monitoring".to_owned()],
        })
    );
    assert_eq!(certificate_user(b"not a certificate"), None);
}

#[tokio::test(start_paused = true)]
async fn the_cache_forgets_stays_bounded_and_keeps_what_expires_last() {
    let cache: Cache<u32, bool> = Cache::new();
    cache.put(1, true, Duration::ZERO);
    assert_eq!(cache.get(&1), None, "a zero TTL caches nothing");
    // An answer cached for long, then a flood of short-lived ones.
    cache.put(u32::MAX, true, Duration::from_secs(600));
    for key in 0..(CACHE_ENTRIES as u32 * 4) {
        cache.put(key, true, Duration::from_secs(10));
    }
    let size = cache.entries.lock().len();
    assert!(size <= CACHE_ENTRIES, "{size}");
    assert_eq!(
        cache.get(&u32::MAX),
        Some(true),
        "the flood pushed out the longest-lived answer"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(cache.get(&(CACHE_ENTRIES as u32 * 4 - 1)), None, "expired");
}

#[tokio::test(start_paused = true)]
async fn the_bucket_gives_its_rate_and_no_more() {
    let bucket = Bucket::new(20);
    let taken = (0..100).filter(|_| bucket.take()).count();
    assert_eq!(taken, 20, "the burst");
    tokio::time::advance(Duration::from_millis(500)).await;
    let taken = (0..100).filter(|_| bucket.take()).count();
    assert_eq!(taken, 10, "half a second's worth");
}

/// A flood of made-up tokens (and of anonymous questions about made-up paths) while a real scraper's
/// token keeps expiring from the cache: the reviews asked stay within the bound, the scraper is never
/// refused, and the cache of accepted tokens is not flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_tokens_makes_bounded_reviews_and_locks_no_real_caller_out() {
    let server = kube_ccm_test_apiserver::TestApiServer::start().await.unwrap();
    let real = server.mint_token(kube_ccm_test_apiserver::UserInfo {
        name: "prometheus".to_owned(),
        groups: vec!["monitoring".to_owned()],
    });
    let delegation = Delegation::new(
        DelegationSettings {
            always_allow_paths: vec!["/healthz".to_owned()],
            // Short, so the real token is reviewed again during the flood.
            token_ttl: Duration::from_millis(300),
            allowed_ttl: Duration::from_millis(300),
            denied_ttl: Duration::from_millis(300),
        },
        Some(server.client()),
        Some(server.client()),
    );
    let bearer = format!("Bearer {real}");
    assert_eq!(
        delegation.decide("/metrics", "get", Some(&bearer), None).await,
        Decision::Allow
    );
    let reviews = |resource: &str| {
        server
            .requests()
            .iter()
            .filter(|r| r.resource.as_deref() == Some(resource))
            .count()
    };
    let before = reviews("tokenreviews.authentication.k8s.io");
    let started = Instant::now();
    let mut flood = Vec::new();
    for worker in 0..16 {
        let delegation = delegation.clone();
        flood.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for n in 0..200 {
                let token = format!("Bearer made-up-{worker}-{n}");
                let by_token = delegation.decide("/metrics", "get", Some(&token), None).await;
                // The server allows every path with RBAC off: an anonymous question is answered or
                // refused past the bound, never failed.
                let path = format!("/made-up/{worker}/{n}");
                let anonymous = delegation.decide(&path, "get", None, None).await;
                answers.push((by_token, anonymous));
            }
            answers
        }));
    }
    let mut scrapes = 0;
    while flood.iter().any(|worker| !worker.is_finished()) {
        assert_eq!(
            delegation.decide("/metrics", "get", Some(&bearer), None).await,
            Decision::Allow,
            "the real scraper was refused during the flood"
        );
        scrapes += 1;
        tokio::task::yield_now().await;
    }
    for worker in flood {
        for (by_token, anonymous) in worker.await.unwrap() {
            assert!(
                matches!(by_token, Decision::Unauthenticated | Decision::TooMany),
                "{by_token:?}"
            );
            assert!(
                matches!(anonymous, Decision::Allow | Decision::TooMany),
                "{anonymous:?}"
            );
        }
    }
    assert!(scrapes > 0);
    let elapsed = started.elapsed().as_secs_f64();
    // The made-up tokens' reviews within the bound (a burst, then the rate), and the real token's
    // own every time its answer expired.
    let made_up_bound = f64::from(UNKNOWN_REVIEWS_PER_SECOND) * (elapsed + 1.0);
    let real_bound = elapsed / 0.3 + 2.0;
    let asked = reviews("tokenreviews.authentication.k8s.io") - before;
    assert!(
        (asked as f64) <= made_up_bound + real_bound,
        "{asked} TokenReviews in {elapsed:.1} s"
    );
    assert!(delegation.reviews() > 0);
}

#[test]
fn token_keys_are_keyed_hashes() {
    let (a, b) = (delegation(&[]), delegation(&[]));
    assert_eq!(a.token_key("t"), a.token_key("t"));
    assert_ne!(a.token_key("t"), a.token_key("u"));
    assert_ne!(
        a.token_key("t"),
        b.token_key("t"),
        "each process has its own secret"
    );
}
