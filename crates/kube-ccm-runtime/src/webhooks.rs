//! Admission webhooks a provider registers (upstream's `WebhookConfig`, behind the
//! `CloudControllerManagerWebhook` feature gate), served on `--webhook-secure-port` by every replica
//! (admission does not wait for an election, as upstream).
//!
//! A webhook is a name (for `--webhooks`: `*`, `name`, `-name`), a path and a handler that takes the
//! `AdmissionReview`'s request and answers its response. [`Webhooks::answer`] does what upstream's
//! `WebhookHandler.ServeHTTP` does: the body must be `application/json` and an `AdmissionReview` with a
//! request (else 400 with the reason), a handler's error is a 500 with `error generating admission
//! response: …`, and the answer is an `admission.k8s.io/v1` `AdmissionReview` carrying the request's UID.
//! `cloud_provider_webhook_request_total` and `cloud_provider_webhook_request_duration_seconds` count
//! every request by status code and webhook. Difference: upstream records only failed requests (its
//! success path leaves the status code unset); here a request answered is counted with code `200`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

use crate::Metrics;

/// What a webhook's handler gets besides the request.
#[derive(Clone)]
pub struct WebhookContext {
    /// The cloud provider.
    pub provider: Arc<dyn kube_ccm_provider::CloudProvider>,
    /// The process's shared caches of nodes and services (started when first read).
    pub caches: Arc<dyn kube_ccm_provider::SharedCaches>,
}

type Handler = Arc<
    dyn Fn(
            WebhookContext,
            AdmissionRequest<DynamicObject>,
        ) -> BoxFuture<'static, Result<AdmissionResponse, String>>
        + Send
        + Sync,
>;

/// An admission webhook (upstream's `WebhookConfig` with its name).
#[derive(Clone)]
pub struct WebhookDefinition {
    name: String,
    path: String,
    enabled_by_default: bool,
    handler: Handler,
}

impl std::fmt::Debug for WebhookDefinition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookDefinition")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("enabled_by_default", &self.enabled_by_default)
            .finish_non_exhaustive()
    }
}

impl WebhookDefinition {
    /// Webhook `name`, served at `path` (which starts with `/`); `handler` answers each request: an
    /// `Err` is answered 500 with its text (so the API server applies the webhook's `failurePolicy`).
    pub fn new<F, Fut>(name: &str, path: &str, handler: F) -> WebhookDefinition
    where
        F: Fn(WebhookContext, AdmissionRequest<DynamicObject>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AdmissionResponse, String>> + Send + 'static,
    {
        WebhookDefinition {
            name: name.to_owned(),
            path: path.to_owned(),
            enabled_by_default: true,
            handler: Arc::new(move |context, request| Box::pin(handler(context, request))),
        }
    }

    /// Served only when `--webhooks` names it.
    pub fn disabled_by_default(mut self) -> WebhookDefinition {
        self.enabled_by_default = false;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether `*` enables it.
    pub fn enabled_by_default(&self) -> bool {
        self.enabled_by_default
    }
}

/// Why the registered webhooks and `--webhooks` do not go together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    /// `--webhooks` names a webhook nobody registered.
    #[error("--webhooks: {0:?} is not in the list of known webhooks ({1})")]
    Unknown(String, String),
    /// A registered name or path is used twice, or a path does not start with `/`.
    #[error("webhook {0}: {1}")]
    Definition(String, String),
}

/// The webhooks enabled by `--webhooks`, by path, ready to answer.
pub struct Webhooks {
    by_path: BTreeMap<String, WebhookDefinition>,
    context: WebhookContext,
    metrics: Arc<Metrics>,
}

/// Whether `--webhooks` (`selection`) enables `definition`, as upstream's `IsControllerEnabled`: the
/// first item naming it (`name` or `-name`) decides, else `*` enables those on by default.
fn enabled(definition: &WebhookDefinition, selection: &[&str]) -> bool {
    let name = definition.name();
    let mut star = false;
    for item in selection {
        if *item == name {
            return true;
        }
        if item.strip_prefix('-') == Some(name) {
            return false;
        }
        star |= *item == "*";
    }
    star && definition.enabled_by_default
}

impl Webhooks {
    /// The definitions `selection` (`--webhooks`) enables; names it gives must be registered.
    pub fn select(
        definitions: &[WebhookDefinition],
        selection: &[String],
        context: WebhookContext,
        metrics: Arc<Metrics>,
    ) -> Result<Webhooks, WebhookError> {
        check_selection(definitions, selection)?;
        let selection = items(selection);
        let by_path = definitions
            .iter()
            .filter(|d| enabled(d, &selection))
            .map(|d| (d.path.clone(), d.clone()))
            .collect();
        Ok(Webhooks {
            by_path,
            context,
            metrics,
        })
    }

    /// Whether any webhook is enabled (nothing is served otherwise, as upstream).
    pub fn is_empty(&self) -> bool {
        self.by_path.is_empty()
    }

    /// The enabled webhooks' names.
    pub fn names(&self) -> Vec<&str> {
        self.by_path.values().map(WebhookDefinition::name).collect()
    }

    /// The answer to a POST to `path` with `body`: `(status, content type, body)`; `None` for a path no
    /// enabled webhook serves.
    pub async fn answer(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Option<(u16, &'static str, Vec<u8>)> {
        let definition = self.by_path.get(path)?;
        let started = Instant::now();
        let (status, content_type, body) = self.review(definition, content_type, body).await;
        self.metrics
            .webhook_request(definition.name(), status, started.elapsed());
        Some((status, content_type, body))
    }

    async fn review(
        &self,
        definition: &WebhookDefinition,
        content_type: Option<&str>,
        body: &[u8],
    ) -> (u16, &'static str, Vec<u8>) {
        const TEXT: &str = "text/plain; charset=utf-8";
        let refuse = |status: u16, message: String| {
            tracing::warn!(webhook = definition.name(), %message, "admission request not answered");
            (status, TEXT, format!("{message}\n").into_bytes())
        };
        if content_type != Some("application/json") {
            return refuse(
                400,
                format!(
                    "Content-Type: {:?} should be \"application/json\"",
                    content_type.unwrap_or_default()
                ),
            );
        }
        if body.is_empty() {
            return refuse(400, "admission request HTTP body is empty".to_owned());
        }
        let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
            Ok(review) => review,
            Err(error) => {
                return refuse(
                    400,
                    format!("could not deserialize incoming admission review: {error}"),
                );
            }
        };
        let request: AdmissionRequest<DynamicObject> = match review.try_into() {
            Ok(request) => request,
            Err(_) => {
                return refuse(
                    400,
                    "admission review can't be used: Request field is nil".to_owned(),
                );
            }
        };
        let uid = request.uid.clone();
        let response = match (definition.handler)(self.context.clone(), request).await {
            Ok(response) => response,
            Err(error) => return refuse(500, format!("error generating admission response: {error}")),
        };
        let mut response = response;
        response.uid = uid;
        match serde_json::to_vec(&response.into_review()) {
            Ok(json) => (200, "application/json", json),
            Err(error) => refuse(500, format!("error parsing admission response: {error}")),
        }
    }
}

/// `--webhooks`' items, trimmed, empty ones dropped (as the flag's other readers read them).
fn items(selection: &[String]) -> Vec<&str> {
    selection
        .iter()
        .map(|item| item.trim())
        .filter(|item| !item.is_empty())
        .collect()
}

/// `Err` when `--webhooks` (`selection`) names a webhook none of `definitions` is.
pub fn check_selection(definitions: &[WebhookDefinition], selection: &[String]) -> Result<(), WebhookError> {
    let known: Vec<&str> = definitions.iter().map(WebhookDefinition::name).collect();
    for item in items(selection) {
        let name = item.strip_prefix('-').unwrap_or(item);
        if name != "*" && !known.contains(&name) {
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            return Err(WebhookError::Unknown(name.to_owned(), known));
        }
    }
    Ok(())
}

/// Checks registered definitions: names and paths once each, paths absolute.
pub(crate) fn check_definitions(
    definitions: &[WebhookDefinition],
    new: &WebhookDefinition,
) -> Result<(), WebhookError> {
    let problem = |why: String| Err(WebhookError::Definition(new.name.clone(), why));
    if new.name.is_empty() || new.name.starts_with('-') || new.name == "*" || new.name.contains(',') {
        return problem("a name is not empty, `*`, or starts with `-`, and has no comma".to_owned());
    }
    if !new.path.starts_with('/') {
        return problem(format!("path {:?} does not start with /", new.path));
    }
    if let Some(other) = definitions.iter().find(|d| d.name == new.name) {
        return problem(format!("registered twice (path {})", other.path));
    }
    if let Some(other) = definitions.iter().find(|d| d.path == new.path) {
        return problem(format!("path {} is webhook {}'s", new.path, other.name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bare;

    impl kube_ccm_provider::CloudProvider for Bare {
        fn provider_name(&self) -> &str {
            "bare"
        }
    }

    fn definition(name: &str, path: &str) -> WebhookDefinition {
        WebhookDefinition::new(
            name,
            path,
            |_context, request: AdmissionRequest<DynamicObject>| async move {
                let named = request.name.clone();
                match named.as_str() {
                    "bad" => Ok(AdmissionResponse::from(&request).deny("bad is refused")),
                    "broken" => Err("the cloud is down".to_owned()),
                    _ => Ok(AdmissionResponse::from(&request)),
                }
            },
        )
    }

    fn webhooks(selection: &[&str]) -> Result<Webhooks, WebhookError> {
        let definitions = [
            definition("lb", "/validate-lb"),
            definition("extra", "/extra").disabled_by_default(),
        ];
        let selection: Vec<String> = selection.iter().map(|s| (*s).to_owned()).collect();
        Webhooks::select(
            &definitions,
            &selection,
            WebhookContext {
                provider: Arc::new(Bare),
                caches: Arc::new(kube_ccm_provider::NoCaches),
            },
            Arc::new(Metrics::new()),
        )
    }

    fn review(name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Service"},
                "resource": {"group": "", "version": "v1", "resource": "services"},
                "name": name,
                "namespace": "default",
                "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}},
                "dryRun": false,
            }
        }))
        .unwrap()
    }

    #[test]
    fn webhooks_are_selected_as_upstream_selects_controllers() {
        assert_eq!(
            webhooks(&[]).unwrap().names(),
            Vec::<&str>::new(),
            "none unless named, as upstream"
        );
        assert_eq!(webhooks(&["*"]).unwrap().names(), ["lb"]);
        assert_eq!(webhooks(&["*", "extra"]).unwrap().names(), ["extra", "lb"]);
        assert_eq!(webhooks(&["*", "-lb"]).unwrap().names(), Vec::<&str>::new());
        assert_eq!(
            webhooks(&["lb", "-lb"]).unwrap().names(),
            ["lb"],
            "the first item naming it decides"
        );
        assert_eq!(
            webhooks(&[" *", ""]).unwrap().names(),
            ["lb"],
            "items trimmed, empty ones dropped"
        );
        assert_eq!(
            webhooks(&["nope"]).err().unwrap().to_string(),
            "--webhooks: \"nope\" is not in the list of known webhooks (lb, extra)"
        );
        let lb = definition("lb", "/validate-lb");
        assert_eq!(
            check_definitions(std::slice::from_ref(&lb), &definition("lb", "/other"))
                .unwrap_err()
                .to_string(),
            "webhook lb: registered twice (path /validate-lb)"
        );
        assert!(check_definitions(std::slice::from_ref(&lb), &definition("other", "/validate-lb")).is_err());
        assert!(check_definitions(&[], &definition("x", "relative")).is_err());
    }

    #[tokio::test]
    async fn a_review_is_answered_as_upstream_answers_it_and_counted() {
        let webhooks = webhooks(&["*"]).unwrap();
        let (status, content_type, body) = webhooks
            .answer("/validate-lb", Some("application/json"), &review("good"))
            .await
            .unwrap();
        assert_eq!((status, content_type), (200, "application/json"));
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(answer["response"]["allowed"], true);

        let (_, _, body) = webhooks
            .answer("/validate-lb", Some("application/json"), &review("bad"))
            .await
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["message"], "bad is refused");

        let (status, _, body) = webhooks
            .answer("/validate-lb", Some("application/json"), &review("broken"))
            .await
            .unwrap();
        assert_eq!(status, 500);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "error generating admission response: the cloud is down\n"
        );
        let (status, _, body) = webhooks
            .answer("/validate-lb", Some("text/plain"), b"{}")
            .await
            .unwrap();
        assert_eq!(status, 400);
        assert!(
            String::from_utf8(body)
                .unwrap()
                .contains("should be \"application/json\"")
        );
        let (status, _, body) = webhooks
            .answer(
                "/validate-lb",
                Some("application/json"),
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            )
            .await
            .unwrap();
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
        assert!(
            webhooks
                .answer("/extra", Some("application/json"), &review("good"))
                .await
                .is_none()
        );

        let (_, text) = webhooks.metrics.exposition("text/plain");
        for line in [
            "cloud_provider_webhook_request_total{code=\"200\",webhook=\"lb\"} 2",
            "cloud_provider_webhook_request_total{code=\"500\",webhook=\"lb\"} 1",
            "cloud_provider_webhook_request_total{code=\"400\",webhook=\"lb\"} 2",
            "cloud_provider_webhook_request_duration_seconds_count{code=\"200\",webhook=\"lb\"} 2",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
