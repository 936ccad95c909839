//! Clients for controllers: one per controller, each naming itself in its `User-Agent`, rate-limited as
//! client-go's (`--kube-api-qps`, `--kube-api-burst`), every request but a watch bounded by a deadline
//! (`--kube-api-request-timeout`, covering the response body too), and for controllers under a lock,
//! fenced: a write is refused locally once the lock's `valid_until` has passed, and a write in flight is
//! abandoned when `valid_until` passes before its answer, its connection reset so that what the kernel
//! had not sent yet is discarded (see [`crate::transport`]), so a process that lost a lock cannot write
//! for that lock's controllers even if its tasks are slow to stop or the network holds its bytes back.

use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use kube_ccm_leadermigration::user_agent::UserAgent;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service};

use crate::service_accounts::{AccountToken, ServiceAccountError, ServiceAccounts};
use crate::transport::TokenSource;
use crate::transport::{Fence, WriteInFlight};

/// Settings every client shares.
#[derive(Clone)]
pub struct ClientFactory {
    base: kube::Config,
    component: String,
    identity: String,
    qps: f64,
    burst: u32,
    request_timeout: Duration,
    /// The binary's version, in every `User-Agent`.
    version: String,
    /// Where `rest_client_*` are counted (set by the [`crate::Manager`] that owns the factory).
    metrics: Option<Arc<crate::Metrics>>,
    /// With `--use-service-account-credentials`: the controllers' accounts and their tokens
    /// (`service_accounts.rs` adds the methods that use them).
    pub(crate) accounts: Option<Arc<ServiceAccounts>>,
}

impl ClientFactory {
    /// The default deadline of one request (`--kube-api-request-timeout`).
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

    /// Clients for `component` with `identity`, from `base` (kubeconfig, in-cluster, …). As client-go, a
    /// `qps` of 0 means 5, a negative one no limit, and a `burst` of 0 means 10.
    pub fn new(base: kube::Config, component: &str, identity: &str, qps: f32, burst: u32) -> ClientFactory {
        let qps = match f64::from(qps) {
            0.0 => 5.0,
            negative if negative < 0.0 => 1e9,
            qps => qps,
        };
        ClientFactory {
            base,
            component: component.to_owned(),
            identity: identity.to_owned(),
            qps,
            burst: if burst == 0 { 10 } else { burst },
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            version: crate::Binary::default().version().to_owned(),
            metrics: None,
            accounts: None,
        }
    }

    /// Count every request of the clients made from now on in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Arc<crate::Metrics>) -> ClientFactory {
        self.metrics = Some(metrics);
        self
    }

    /// The deadline of every request but a watch, response body included.
    pub fn with_request_timeout(mut self, timeout: Duration) -> ClientFactory {
        self.request_timeout = timeout;
        self
    }

    /// The binary's version in the `User-Agent` (see [`crate::Registry::set_binary`]).
    pub fn with_version(mut self, version: &str) -> ClientFactory {
        self.version = version.to_owned();
        self
    }

    /// The binary's version in the `User-Agent`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The identity requests are attributed to.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The `User-Agent` of `controller`'s requests.
    pub fn user_agent(&self, controller: &str) -> String {
        UserAgent {
            component: self.component.clone(),
            version: self.version.clone(),
            identity: self.identity.clone(),
            controller: controller.to_owned(),
        }
        .render()
    }

    /// A client for `controller`; with a fence, writes stop when the fence's lock is no longer valid.
    ///
    /// kube's own retry of 429/503/504 is off: controllers requeue, the elector decides within its deadline.
    pub fn client(&self, controller: &str, fence: Option<Fence>) -> Result<kube::Client, ClientError> {
        self.build(controller, fence, None)
    }

    /// As [`Self::client`], carrying `token` (a service account's) instead of the manager's credentials.
    pub(crate) fn build(
        &self,
        controller: &str,
        fence: Option<Fence>,
        token: Option<Arc<AccountToken>>,
    ) -> Result<kube::Client, ClientError> {
        let mut config = self.base.clone();
        if token.is_some() {
            // As rest.AnonymousClientConfig: none of the manager's credentials, only the account's token.
            config.auth_info = kube::config::AuthInfo::default();
        }
        config.default_retry = false;
        let user_agent = self.user_agent(controller);
        let user_agent =
            http::HeaderValue::from_str(&user_agent).map_err(|_| ClientError::UserAgent(user_agent))?;
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, user_agent));
        let host = config
            .cluster_url
            .authority()
            .map(ToString::to_string)
            .unwrap_or_default();
        // Innermost: latency as client-go measures it, without the rate limiter's wait.
        let transport = crate::transport::transport(
            &config,
            fence.clone(),
            token.map(|token| token as Arc<dyn TokenSource>),
        )?;
        Ok(
            kube::client::ClientBuilder::new(transport, config.default_namespace.clone())
                .with_layer(&tower::util::option_layer(self.metrics.clone().map(|metrics| {
                    RequestMetricsLayer {
                        metrics,
                        host: Arc::from(host.as_str()),
                    }
                })))
                .with_layer(&RateLimitLayer::new(
                    self.qps,
                    self.burst,
                    self.metrics.clone(),
                    &host,
                ))
                .with_layer(&DeadlineLayer {
                    fence,
                    timeout: self.request_timeout,
                })
                .build(),
        )
    }
}

/// Why a client cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The identity or component makes an invalid header.
    #[error("the User-Agent {0:?} is not a valid header value (the identity must be ASCII)")]
    UserAgent(String),
    /// kube refused the configuration.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The controller cannot act as its service account.
    #[error(transparent)]
    ServiceAccount(#[from] ServiceAccountError),
}

/// A write refused because this process no longer holds the lock that governs it.
#[derive(Debug, thiserror::Error)]
#[error("write refused: this process does not hold lease {lease} (or its renewals are overdue)")]
pub struct Fenced {
    /// The Lease.
    pub lease: String,
}

/// A request not sent because the controllers under its lock are stopping.
#[derive(Debug, thiserror::Error)]
#[error("request not sent: the controllers under lease {lease} are stopping")]
pub struct Stopping {
    /// The Lease.
    pub lease: String,
}

/// A request that did not finish before its deadline (the request timeout, or for a write under a lock,
/// the lock's validity); it was abandoned and its connection closed.
#[derive(Debug, thiserror::Error)]
#[error("request abandoned after its deadline ({})", why.describe())]
pub struct DeadlineExceeded {
    /// Which deadline passed.
    pub why: Deadline,
}

/// Which deadline a request has.
#[derive(Debug, Clone)]
pub enum Deadline {
    /// `--kube-api-request-timeout`.
    RequestTimeout,
    /// The validity of the lock the writing controller runs under (its Lease's name).
    Lease(Arc<str>),
}

impl Deadline {
    fn describe(&self) -> String {
        match self {
            Deadline::RequestTimeout => "request timeout".to_owned(),
            Deadline::Lease(lease) => format!("lease {lease} no longer valid"),
        }
    }
}

/// Bounds every request but a watch, and fences writes on the lock.
#[derive(Clone)]
struct DeadlineLayer {
    fence: Option<Fence>,
    timeout: Duration,
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let stop = self.fence.as_ref().and_then(Fence::stop_signal).cloned();
        DeadlineService {
            inner,
            lease: self.fence.as_ref().map(|f| Arc::from(f.lease())),
            stopped: stop.clone().map(|stop| Box::pin(stop.cancelled_owned())),
            stop,
            layer: self.clone(),
        }
    }
}

struct DeadlineService<S> {
    inner: S,
    layer: DeadlineLayer,
    lease: Option<Arc<str>>,
    /// The fence's stop signal, and a wait for it (which wakes a request waiting to be sent).
    stop: Option<CancellationToken>,
    stopped: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
}

impl<S> DeadlineService<S> {
    fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(CancellationToken::is_cancelled)
    }
}

/// Whether a request is a watch (its answer is a stream with no end; kube's watcher bounds it).
fn is_watch<B>(request: &http::Request<B>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

impl<S, B, RB> Service<http::Request<B>> for DeadlineService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: From<tower::BoxError>,
    RB: http_body::Body<Data = Bytes>,
    RB::Error: Into<tower::BoxError>,
{
    type Response = http::Response<DeadlineBody<RB>>;
    type Error = S::Error;
    type Future = DeadlineFuture<S::Future>;

    /// Ready when the inner service is (the rate limiter's wait is in there), or at once when the
    /// controllers under the lock are stopping: `call` then refuses without calling inward.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.stopping() {
            return Poll::Ready(Ok(()));
        }
        if let Some(stopped) = self.stopped.as_mut()
            && stopped.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let write = !matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        // Counted before the stop is checked: the lock's release waits for every write counted.
        let in_flight = if write {
            self.layer.fence.as_ref().map(Fence::write_in_flight)
        } else {
            None
        };
        if self.stopping() {
            return DeadlineFuture::Stopping {
                lease: self.lease.clone(),
            };
        }
        let now = Instant::now();
        let mut deadline =
            (!is_watch(&request)).then(|| (now + self.layer.timeout, Deadline::RequestTimeout));
        if let (true, Some(fence), Some(lease)) = (write, &self.layer.fence, &self.lease) {
            let Some(valid_until) = fence.valid_until().filter(|until| *until > now) else {
                return DeadlineFuture::Refused {
                    lease: Some(lease.clone()),
                };
            };
            if deadline.as_ref().is_none_or(|(at, _)| valid_until < *at) {
                deadline = Some((valid_until, Deadline::Lease(lease.clone())));
            }
            if let Some((at, _)) = &deadline {
                with_server_timeout(&mut request, at.saturating_duration_since(now));
            }
        }
        let response = self.inner.call(request);
        match deadline {
            Some((at, why)) => DeadlineFuture::Bounded {
                response,
                sleep: tokio::time::sleep_until(at),
                why: Some((at, why)),
                in_flight,
            },
            None => DeadlineFuture::Unbounded { response, in_flight },
        }
    }
}

/// Asks the API server to give up on `request` after `left`, with the `timeout` parameter client-go's
/// `Request.Timeout` sends: a fenced write is then bounded at the server too, so one whose connection's
/// reset never reaches it (a partition) is not applied long after the lock's validity. kube-apiserver
/// answers 504 at that deadline and starts no storage call after it (a put already sent may still be
/// applied: docs/decisions/0002-writes-answered-504.md).
fn with_server_timeout<B>(request: &mut http::Request<B>, left: Duration) {
    let uri = request.uri();
    let mut query: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("timeout="))
        .collect();
    let timeout = format!("timeout={}ms", left.as_millis().max(1));
    query.push(&timeout);
    let path_and_query = format!("{}?{}", uri.path(), query.join("&"));
    let mut parts = uri.clone().into_parts();
    let Ok(path_and_query) = http::uri::PathAndQuery::try_from(path_and_query) else {
        return;
    };
    parts.path_and_query = Some(path_and_query);
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
}

pin_project_lite::pin_project! {
    /// The answer of a [`DeadlineService`]: the inner response, failing at the deadline.
    #[project = DeadlineProjection]
    pub(crate) enum DeadlineFuture<F> {
        Refused { lease: Option<Arc<str>> },
        Stopping { lease: Option<Arc<str>> },
        Unbounded { #[pin] response: F, in_flight: Option<WriteInFlight> },
        Bounded {
            #[pin]
            response: F,
            #[pin]
            sleep: tokio::time::Sleep,
            why: Option<(Instant, Deadline)>,
            // A fenced write, counted until it is answered or abandoned.
            in_flight: Option<WriteInFlight>,
        },
    }
}

impl<F, RB, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    E: From<tower::BoxError>,
{
    type Output = Result<http::Response<DeadlineBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            DeadlineProjection::Refused { lease } => {
                let lease = lease.take().map_or_else(String::new, |l| l.to_string());
                let error: tower::BoxError = Box::new(Fenced { lease });
                Poll::Ready(Err(error.into()))
            }
            DeadlineProjection::Stopping { lease } => {
                let lease = lease.take().map_or_else(String::new, |l| l.to_string());
                let error: tower::BoxError = Box::new(Stopping { lease });
                Poll::Ready(Err(error.into()))
            }
            DeadlineProjection::Unbounded { response, in_flight } => {
                let result = ready!(response.poll(cx));
                in_flight.take();
                Poll::Ready(result.map(|r| r.map(|body| DeadlineBody::new(body, None))))
            }
            DeadlineProjection::Bounded {
                response,
                sleep,
                why,
                in_flight,
            } => {
                if let Poll::Ready(result) = response.poll(cx) {
                    in_flight.take();
                    let deadline = why.take();
                    return Poll::Ready(result.map(|r| r.map(|body| DeadlineBody::new(body, deadline))));
                }
                if sleep.poll(cx).is_ready() {
                    in_flight.take();
                    let why = why.take().map_or(Deadline::RequestTimeout, |(_, why)| why);
                    let error: tower::BoxError = Box::new(DeadlineExceeded { why });
                    return Poll::Ready(Err(error.into()));
                }
                Poll::Pending
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that fails once its request's deadline passes (a server that stalls mid-answer).
    pub(crate) struct DeadlineBody<B> {
        #[pin]
        inner: B,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        why: Option<Deadline>,
    }
}

impl<B> DeadlineBody<B> {
    fn new(inner: B, deadline: Option<(Instant, Deadline)>) -> DeadlineBody<B> {
        let (sleep, why) = match deadline {
            Some((at, why)) => (Some(tokio::time::sleep_until(at)), Some(why)),
            None => (None, None),
        };
        DeadlineBody { inner, sleep, why }
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<tower::BoxError>,
{
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            let why = this.why.clone().unwrap_or(Deadline::RequestTimeout);
            return Poll::Ready(Some(Err(Box::new(DeadlineExceeded { why }))));
        }
        this.inner.poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// client-go's token bucket: `qps` tokens a second, at most `burst` saved up.
#[derive(Debug)]
struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// Takes a token, or says how long until one is there.
    fn take(&self) -> Result<(), Duration> {
        let mut state = self.state.lock();
        let now = Instant::now();
        let (tokens, last) = *state;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(Duration::from_secs_f64((1.0 - tokens) / self.qps))
        }
    }
}

#[derive(Clone)]
struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
    /// Where each request's wait goes (`rest_client_rate_limiter_duration_seconds`), and its host label.
    metrics: Option<(Arc<crate::Metrics>, Arc<str>)>,
}

impl RateLimitLayer {
    fn new(qps: f64, burst: u32, metrics: Option<Arc<crate::Metrics>>, host: &str) -> RateLimitLayer {
        let burst = f64::from(burst.max(1));
        RateLimitLayer {
            bucket: Arc::new(TokenBucket {
                qps: qps.max(0.001),
                burst,
                state: Mutex::new((burst, Instant::now())),
            }),
            metrics: metrics.map(|metrics| (metrics, Arc::from(host))),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            metrics: self.metrics.clone(),
            sleep: None,
            has_token: false,
            waiting_since: None,
            waited: Duration::ZERO,
        }
    }
}

/// Waits for a token in `poll_ready`; kube's client buffers requests in front of it.
struct RateLimit<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    metrics: Option<(Arc<crate::Metrics>, Arc<str>)>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    has_token: bool,
    /// When the wait for the next request's token began, and how long the last token took.
    waiting_since: Option<Instant>,
    waited: Duration,
}

impl<S, B> Service<http::Request<B>> for RateLimit<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            let since = *self.waiting_since.get_or_insert_with(Instant::now);
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.bucket.take() {
                Ok(()) => {
                    self.has_token = true;
                    self.waited = since.elapsed();
                    self.waiting_since = None;
                }
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.has_token = false;
        if let Some((metrics, host)) = &self.metrics {
            metrics.rate_limited(host, request.method().as_str(), self.waited.as_secs_f64());
        }
        self.inner.call(request)
    }
}

/// Counts each request in `rest_client_requests_total` and `rest_client_request_duration_seconds`.
#[derive(Clone)]
struct RequestMetricsLayer {
    metrics: Arc<crate::Metrics>,
    host: Arc<str>,
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetricsService {
            inner,
            layer: self.clone(),
        }
    }
}

struct RequestMetricsService<S> {
    inner: S,
    layer: RequestMetricsLayer,
}

impl<S, B, RB> Service<http::Request<B>> for RequestMetricsService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = MeasuredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().clone();
        MeasuredFuture {
            response: self.inner.call(request),
            started: Instant::now(),
            method,
            layer: Some(self.layer.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// A response, counted when it is ready.
    struct MeasuredFuture<F> {
        #[pin]
        response: F,
        started: Instant,
        method: http::Method,
        layer: Option<RequestMetricsLayer>,
    }
}

impl<F, RB, E> Future for MeasuredFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.response.poll(cx));
        if let Some(layer) = this.layer.take() {
            let code = match &output {
                Ok(response) => response.status().as_str().to_owned(),
                Err(_) => "<error>".to_owned(),
            };
            layer.metrics.api_request(
                &layer.host,
                this.method.as_str(),
                &code,
                this.started.elapsed().as_secs_f64(),
            );
        }
        Poll::Ready(output)
    }
}

/// The `User-Agent` of the requests that set up the controllers' service accounts.
const SERVICE_ACCOUNTS_AGENT: &str = "service-accounts";

impl ClientFactory {
    /// `--use-service-account-credentials`: controllers' clients ([`Self::controller_client`]) act as
    /// their service accounts in `kube-system`, with tokens from the TokenRequest API asked for with this
    /// factory's own credentials (see [`crate::service_accounts`]). Other clients (the elector, the
    /// caches, serving) keep the manager's credentials, as upstream's.
    pub fn with_service_account_credentials(mut self) -> Result<ClientFactory, ClientError> {
        let root = self.client(SERVICE_ACCOUNTS_AGENT, None)?;
        self.accounts = Some(Arc::new(ServiceAccounts::new(root)));
        Ok(self)
    }

    /// Makes sure `account` can be acted as (with service-account credentials; nothing otherwise): the
    /// account exists or was made, and a token was issued for it.
    pub async fn prepare_account(&self, account: &str) -> Result<(), ClientError> {
        if let Some(accounts) = &self.accounts {
            accounts.token(account).await?;
        }
        Ok(())
    }

    /// The client of `controller`: as [`Self::client`], acting as service account `account` with
    /// service-account credentials.
    pub async fn controller_client(
        &self,
        controller: &str,
        account: &str,
        fence: Option<Fence>,
    ) -> Result<kube::Client, ClientError> {
        let token = match &self.accounts {
            Some(accounts) => Some(accounts.token(account).await?),
            None => None,
        };
        self.build(controller, fence, token)
    }
}

#[cfg(test)]
mod tests;
