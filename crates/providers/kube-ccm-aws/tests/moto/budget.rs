//! The process's cloud budget against an account's rate limit: a proxy in front of moto refuses what
//! goes over 10 requests a second, as AWS does (`Throttling`, `RequestLimitExceeded`).

use kube_ccm_provider::{Priority, RateBudget};

use super::*;

/// Asks for 40 services' classic ELBs at once, each in a context with `budget`; the answers, and how
/// many requests the account refused for its limit meanwhile.
async fn burst(
    provider: &Arc<AwsProvider>,
    proxy: &harness::aws::RecordingProxy,
    budget: Option<Arc<RateBudget>>,
) -> (Vec<Result<bool, CloudError>>, u64) {
    let before = proxy.throttled();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..40 {
        let provider = provider.clone();
        let budget = budget.clone();
        calls.spawn(async move {
            let mut service = web_service(serde_json::json!([{"port": 80, "nodePort": 30080}]));
            service.metadata.uid = Some(format!("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e{i:03}"));
            let cx = match budget {
                Some(budget) => cx().with_budget(budget, Priority::Reconcile),
                None => cx(),
            };
            let lb = provider.load_balancer().unwrap();
            lb.get_load_balancer(&cx, "c", &service)
                .await
                .map(|found| found.is_some())
        });
    }
    let answers = calls.join_all().await;
    (answers, proxy.throttled() - before)
}

#[tokio::test]
async fn a_budget_under_the_accounts_limit_is_never_throttled() {
    let Some(moto) = Moto::start() else { return };
    let proxy = harness::aws::RecordingProxy::start(moto.0.url()).await.unwrap();
    let provider = Arc::new(moto.provider_via(&proxy.url, ""));
    proxy.set_rate_limit(10.0);

    let (answers, refused) = burst(&provider, &proxy, Some(Arc::new(RateBudget::new(8.0, 8)))).await;
    assert!(answers.iter().all(|a| matches!(a, Ok(false))), "{answers:?}");
    assert_eq!(refused, 0, "a budget of 8 a second never meets a limit of 10");

    // The control: the same burst without a budget meets the limit (the SDK's retries may hide it from
    // the caller, not from the account).
    let (_, refused) = burst(&provider, &proxy, None).await;
    assert!(
        refused > 0,
        "without a budget 40 requests at once must meet a limit of 10 a second"
    );
}
