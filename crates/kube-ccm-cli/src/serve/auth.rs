//! Delegated authentication and authorization, as upstream's secure serving: the API server decides who a
//! caller is (TokenReview for a bearer token, or a client certificate verified against `--client-ca-file`)
//! and what they may read (SubjectAccessReview for the request's non-resource path), with answers cached
//! for upstream's TTLs.
//!
//! In order, as upstream's filters:
//! 1. A bearer token the API server does not accept is 401, on every path. No credentials: the caller is
//!    `system:anonymous` in `system:unauthenticated`.
//! 2. A path in `--authorization-always-allow-paths` (`/healthz,/readyz,/livez`; `*` ends a prefix) is
//!    served; so is every path for `system:masters`.
//! 3. Otherwise the SubjectAccessReview decides: 403 `forbidden: User "…" cannot get path "…"` when it
//!    denies, 500 when it cannot be asked (never served on a failure).
//!
//! A caller sending random tokens (or, anonymously, random paths) cannot turn them into unbounded
//! reviews, nor flush what is cached for real callers: tokens are cached by a keyed SHA-256 of their
//! text (as upstream), refusals apart from acceptances, each bounded and evicting what expires soonest,
//! never everything; and a review nothing is cached for is asked at most [`UNKNOWN_REVIEWS_PER_SECOND`]
//! times a second (burst as many), at most [`REVIEWS_IN_FLIGHT`] at once, past which the request is
//! answered 429. A token the API server accepted in the last [`KNOWN_FOR`] is reviewed again outside
//! that bound (a flood cannot lock a real scraper out), and so is an authenticated user's access.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) groups: Vec<String>,
}

impl User {
    fn anonymous() -> User {
        User {
            name: "system:anonymous".to_owned(),
            groups: vec!["system:unauthenticated".to_owned()],
        }
    }
}

/// The answer to a request, before it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Allow,
    /// 401.
    Unauthenticated,
    /// 403, with the message.
    Forbidden(String),
    /// 500: the API server could not be asked.
    Failed(String),
    /// 429: too many reviews asked for callers nobody knows.
    TooMany,
}

/// Answers kept for a while, keyed by the question; bounded so that callers sending many different
/// questions cannot grow it without limit. When full, the answers that expire soonest make room (never
/// all of them: a flood of new questions pushes out only the oldest answers).
struct Cache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

const CACHE_ENTRIES: usize = 4096;

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    fn new() -> Cache<K, V> {
        Cache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock();
        entries
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(value, _)| value.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() >= CACHE_ENTRIES && !entries.contains_key(&key) {
            let now = Instant::now();
            entries.retain(|_, (_, until)| *until > now);
            // Still full: the eighth that expires soonest goes (one sort per eighth of the entries).
            if entries.len() >= CACHE_ENTRIES {
                let mut by_expiry: Vec<(Instant, K)> = entries
                    .iter()
                    .map(|(k, (_, until))| (*until, k.clone()))
                    .collect();
                by_expiry.sort_unstable_by_key(|(until, _)| *until);
                for (_, key) in by_expiry.into_iter().take(CACHE_ENTRIES / 8) {
                    entries.remove(&key);
                }
            }
        }
        entries.insert(key, (value, Instant::now() + ttl));
    }
}

/// A token's cache key: SHA-256 of a per-process secret and the token, so that the cache holds no token
/// and a long one takes no more room than a short one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TokenKey([u8; 32]);

/// Reviews asked for questions nothing is cached for, a second, and at once (a burst as large).
pub(crate) const UNKNOWN_REVIEWS_PER_SECOND: u32 = 20;
pub(crate) const REVIEWS_IN_FLIGHT: usize = 4;

/// How long a token the API server accepted counts as known: reviewed again outside the bound.
pub(crate) const KNOWN_FOR: Duration = Duration::from_secs(600);

/// A token bucket: `rate` a second, up to `rate` at once.
struct Bucket {
    rate: u32,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        Bucket {
            rate,
            state: Mutex::new((f64::from(rate), Instant::now())),
        }
    }

    /// Takes one, if there is one.
    fn take(&self) -> bool {
        let mut state = self.state.lock();
        let (tokens, refilled) = *state;
        let now = Instant::now();
        let rate = f64::from(self.rate);
        let tokens = (tokens + now.duration_since(refilled).as_secs_f64() * rate).min(rate);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            true
        } else {
            *state = (tokens, now);
            false
        }
    }
}

/// Reviews for questions nothing is known about: at most this rate, and so many at once.
struct Unknown {
    bucket: Bucket,
    in_flight: tokio::sync::Semaphore,
}

impl Unknown {
    fn new() -> Unknown {
        Unknown {
            bucket: Bucket::new(UNKNOWN_REVIEWS_PER_SECOND),
            in_flight: tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }

    /// A permit to ask one review now; `None`: too many.
    fn admit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let permit = self.in_flight.try_acquire().ok()?;
        self.bucket.take().then_some(permit)
    }
}

/// Why a review gave no answer.
#[derive(Debug)]
enum Refused {
    /// Past the bound on reviews of unknown questions.
    TooMany,
    /// The API server could not be asked, or did not answer.
    Failed(String),
}

/// How long the API server has to answer a review.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the delegation (from upstream's flags).
pub(crate) struct DelegationSettings {
    /// `--authorization-always-allow-paths`.
    pub(crate) always_allow_paths: Vec<String>,
    /// `--authentication-token-webhook-cache-ttl`.
    pub(crate) token_ttl: Duration,
    /// `--authorization-webhook-cache-authorized-ttl`, `…-unauthorized-ttl`.
    pub(crate) allowed_ttl: Duration,
    pub(crate) denied_ttl: Duration,
}

/// The authenticator and authorizer of the serving endpoints.
pub(crate) struct Delegation {
    settings: DelegationSettings,
    /// Asks TokenReviews; `None`: bearer tokens cannot be checked (every one is refused).
    authentication: Option<kube::Client>,
    /// Asks SubjectAccessReviews; `None`: only always-allowed paths and `system:masters` are served.
    authorization: Option<kube::Client>,
    secret: [u8; 32],
    /// Tokens the API server accepted, with their users.
    accepted: Cache<TokenKey, User>,
    /// Tokens it refused.
    refused: Cache<TokenKey, ()>,
    /// Tokens it accepted lately: reviewed again outside the bound on unknown ones.
    known: Cache<TokenKey, ()>,
    allowed: Cache<(User, String, String), ()>,
    denied: Cache<(User, String, String), ()>,
    unknown: Unknown,
    /// TokenReviews and SubjectAccessReviews asked, for the tests.
    reviews: std::sync::atomic::AtomicU64,
}

impl Delegation {
    pub(crate) fn new(
        settings: DelegationSettings,
        authentication: Option<kube::Client>,
        authorization: Option<kube::Client>,
    ) -> Arc<Delegation> {
        let mut secret = [0; 32];
        // Without randomness the key is still a hash of the token; only its secrecy is lost.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret);
        Arc::new(Delegation {
            settings,
            authentication,
            authorization,
            secret,
            accepted: Cache::new(),
            refused: Cache::new(),
            known: Cache::new(),
            allowed: Cache::new(),
            denied: Cache::new(),
            unknown: Unknown::new(),
            reviews: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Decides a request of `path` with `verb` (`get` for `GET`/`HEAD`, `put`) by the caller: `established`
    /// by the connection (a front proxy's headers, a client certificate), else the bearer token in
    /// `authorization` (the header), else anonymous.
    pub(crate) async fn decide(
        &self,
        path: &str,
        verb: &str,
        authorization: Option<&str>,
        established: Option<&User>,
    ) -> Decision {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim);
        let user = match (established, token) {
            (Some(user), _) => user.clone(),
            (None, Some(token)) => match self.review_token(token).await {
                Ok(Some(user)) => user,
                Ok(None) => return Decision::Unauthenticated,
                Err(Refused::TooMany) => return Decision::TooMany,
                Err(Refused::Failed(error)) => {
                    tracing::warn!(%error, "cannot review a bearer token");
                    return Decision::Unauthenticated;
                }
            },
            (None, None) => User::anonymous(),
        };
        if self.always_allowed(path) || user.groups.iter().any(|g| g == "system:masters") {
            return Decision::Allow;
        }
        match self
            .review_access(&user, path, verb, established.is_some() || token.is_some())
            .await
        {
            Ok(true) => Decision::Allow,
            Ok(false) => Decision::Forbidden(format!(
                "forbidden: User {:?} cannot {verb} path {path:?}",
                user.name
            )),
            Err(Refused::TooMany) => Decision::TooMany,
            Err(Refused::Failed(error)) => Decision::Failed(format!("cannot authorize the request: {error}")),
        }
    }

    fn always_allowed(&self, path: &str) -> bool {
        self.settings.always_allow_paths.iter().any(|allowed| {
            allowed == path
                || allowed
                    .strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        })
    }

    fn token_key(&self, token: &str) -> TokenKey {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(&self.secret);
        context.update(token.as_bytes());
        let mut key = [0; 32];
        key.copy_from_slice(context.finish().as_ref());
        TokenKey(key)
    }

    /// TokenReviews and SubjectAccessReviews asked so far.
    #[cfg(test)]
    fn reviews(&self) -> u64 {
        self.reviews.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn review_token(&self, token: &str) -> Result<Option<User>, Refused> {
        let key = self.token_key(token);
        if let Some(user) = self.accepted.get(&key) {
            return Ok(Some(user));
        }
        if self.refused.get(&key).is_some() {
            return Ok(None);
        }
        let Some(client) = &self.authentication else {
            return Ok(None);
        };
        // A token accepted lately is asked about again at once; any other within the bound.
        let _permit = match self.known.get(&key) {
            Some(()) => None,
            None => Some(self.unknown.admit().ok_or(Refused::TooMany)?),
        };
        self.reviews.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(client.clone());
        let answer = tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
            .await
            .map_err(|_| Refused::Failed(format!("no answer within {REVIEW_TIMEOUT:?}")))?
            .map_err(|error| Refused::Failed(error.to_string()))?;
        let user = answer
            .status
            .filter(|status| status.authenticated == Some(true))
            .and_then(|status| status.user)
            .map(|user| User {
                name: user.username.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
            });
        let ttl = self.settings.token_ttl;
        match &user {
            Some(user) => {
                self.accepted.put(key, user.clone(), ttl);
                self.known.put(key, (), KNOWN_FOR);
            }
            None => self.refused.put(key, (), ttl),
        }
        Ok(user)
    }

    /// Whether `user` may `verb` `path`; an unauthenticated caller's question is asked within the bound
    /// on unknown ones (anyone can ask about any path).
    async fn review_access(
        &self,
        user: &User,
        path: &str,
        verb: &str,
        authenticated: bool,
    ) -> Result<bool, Refused> {
        let key = (user.clone(), path.to_owned(), verb.to_owned());
        if self.allowed.get(&key).is_some() {
            return Ok(true);
        }
        if self.denied.get(&key).is_some() {
            return Ok(false);
        }
        let Some(client) = &self.authorization else {
            return Ok(false);
        };
        let _permit = match authenticated {
            true => None,
            false => Some(self.unknown.admit().ok_or(Refused::TooMany)?),
        };
        self.reviews.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(client.clone());
        let answer = tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
            .await
            .map_err(|_| Refused::Failed(format!("no answer within {REVIEW_TIMEOUT:?}")))?
            .map_err(|error| Refused::Failed(error.to_string()))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        if allowed {
            self.allowed.put(key, (), self.settings.allowed_ttl);
        } else {
            self.denied.put(key, (), self.settings.denied_ttl);
        }
        Ok(allowed)
    }
}

/// The user a verified client certificate names: its subject's common name, and its organizations as
/// groups (as the API server reads client certificates).
pub(crate) fn certificate_user(der: &[u8]) -> Option<User> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = certificate.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(User { name, groups })
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
