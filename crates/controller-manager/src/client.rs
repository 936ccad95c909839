//! Clients for controllers: one per controller, each naming itself in its `User-Agent`, rate-limited as
//! client-go's (`--kube-api-qps`, `--kube-api-burst`), and for controllers under a lock, fenced: a write is
//! refused locally once the lock's `valid_until` has passed, so a process that lost a lock cannot write
//! for that lock's controllers even if its tasks are slow to stop.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::Either;
use leadermigration::audit::UserAgent;
use leadermigration::elector::LeaderState;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::{Layer, Service};

/// Settings every client shares.
#[derive(Clone)]
pub struct ClientFactory {
    base: kube::Config,
    component: String,
    identity: String,
    qps: f64,
    burst: u32,
}

impl ClientFactory {
    /// Clients for `component` with `identity`, from `base` (kubeconfig, in-cluster, …).
    pub fn new(base: kube::Config, component: &str, identity: &str, qps: f32, burst: u32) -> ClientFactory {
        ClientFactory {
            base,
            component: component.to_owned(),
            identity: identity.to_owned(),
            qps: f64::from(qps),
            burst,
        }
    }

    /// The identity requests are attributed to.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The `User-Agent` of `controller`'s requests.
    pub fn user_agent(&self, controller: &str) -> String {
        UserAgent {
            component: self.component.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            identity: self.identity.clone(),
            controller: controller.to_owned(),
        }
        .render()
    }

    /// A client for `controller`; with a fence, writes stop when the fence's lock is no longer valid.
    ///
    /// kube's own retry of 429/503/504 is off: controllers requeue, the elector decides within its deadline.
    pub fn client(&self, controller: &str, fence: Option<Fence>) -> Result<kube::Client, ClientError> {
        let mut config = self.base.clone();
        config.default_retry = false;
        let user_agent = self.user_agent(controller);
        let user_agent =
            http::HeaderValue::from_str(&user_agent).map_err(|_| ClientError::UserAgent(user_agent))?;
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, user_agent));
        let builder = kube::client::ClientBuilder::try_from(config)?
            .with_layer(&RateLimitLayer::new(self.qps, self.burst));
        Ok(match fence {
            Some(fence) => builder.with_layer(&FenceLayer(fence)).build(),
            None => builder.build(),
        })
    }
}

/// Why a client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The identity or component makes an invalid header.
    #[error("the User-Agent {0:?} is not a valid header value (the identity must be ASCII)")]
    UserAgent(String),
    /// kube refused the configuration.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// A lock's state, for fencing writes.
#[derive(Clone, Debug)]
pub struct Fence(pub watch::Receiver<LeaderState>);

impl Fence {
    fn allows_writes(&self) -> bool {
        self.0.borrow().is_valid_leader(Instant::now())
    }

    /// Until when this process may act under the lock (`None`: it does not lead).
    pub fn valid_until(&self) -> Option<Instant> {
        let state = self.0.borrow();
        (state.role == leadermigration::elector::Role::Leading)
            .then_some(state.valid_until)
            .flatten()
    }

    fn lease(&self) -> String {
        self.0.borrow().lease.clone()
    }
}

/// A write refused because this process no longer holds the lock that governs it.
#[derive(Debug, thiserror::Error)]
#[error("write refused: this process does not hold lease {lease} (or its renewals are overdue)")]
pub struct Fenced {
    /// The Lease.
    pub lease: String,
}

#[derive(Clone)]
struct FenceLayer(Fence);

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService {
            inner,
            fence: self.0.clone(),
        }
    }
}

struct FenceService<S> {
    inner: S,
    fence: Fence,
}

impl<S, B> Service<http::Request<B>> for FenceService<S>
where
    S: Service<http::Request<B>>,
    S::Error: From<tower::BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, futures::future::Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let write = !matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if write && !self.fence.allows_writes() {
            let error: tower::BoxError = Box::new(Fenced {
                lease: self.fence.lease(),
            });
            return Either::Right(futures::future::ready(Err(error.into())));
        }
        Either::Left(self.inner.call(request))
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
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
struct RateLimitLayer(Arc<TokenBucket>);

impl RateLimitLayer {
    fn new(qps: f64, burst: u32) -> RateLimitLayer {
        let burst = f64::from(burst.max(1));
        RateLimitLayer(Arc::new(TokenBucket {
            qps: qps.max(0.001),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }))
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: self.0.clone(),
            sleep: None,
            has_token: false,
        }
    }
}

/// Waits for a token in `poll_ready`; kube's client buffers requests in front of it.
struct RateLimit<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    has_token: bool,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.bucket.take() {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
