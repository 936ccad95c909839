//! Any bytes as an AdmissionReview on the webhook port (unauthenticated, as upstream's): answered with a
//! status and a body, never a panic; a 200 carries an AdmissionReview.
#![no_main]

use std::sync::{Arc, OnceLock};

use kube::core::admission::AdmissionResponse;
use kube_ccm_fake::{FakeCloudConfig, FakeProvider};
use kube_ccm_runtime::Metrics;
use kube_ccm_runtime::webhooks::{WebhookContext, WebhookDefinition, Webhooks};
use libfuzzer_sys::fuzz_target;

fn webhooks() -> &'static Webhooks {
    static WEBHOOKS: OnceLock<Webhooks> = OnceLock::new();
    WEBHOOKS.get_or_init(|| {
        let allow = WebhookDefinition::new("allow", "/allow", |_, request| async move {
            Ok(AdmissionResponse::from(&request))
        });
        let context = WebhookContext {
            provider: Arc::new(FakeProvider::new(FakeCloudConfig::default())),
            caches: Arc::new(kube_ccm_provider::NoCaches),
        };
        Webhooks::select(&[allow], &["*".to_owned()], context, Arc::new(Metrics::new()))
            .expect("one webhook, selected")
    })
}

fuzz_target!(|data: &[u8]| {
    for content_type in [Some("application/json"), None, Some("text/plain")] {
        let answer = futures::executor::block_on(webhooks().answer("/allow", content_type, data));
        let (status, _, body) = answer.expect("the path is served");
        if status == 200 {
            let review: serde_json::Value = serde_json::from_slice(&body).expect("a JSON answer");
            assert_eq!(review["kind"], "AdmissionReview");
        }
    }
});
