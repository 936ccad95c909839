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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
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
}

/// Answers kept for a while, keyed by the question; bounded so that callers sending many different
/// tokens cannot grow it without limit.
struct Cache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

const CACHE_ENTRIES: usize = 4096;

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Cache<K, V> {
        Cache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(value, _)| value.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= CACHE_ENTRIES {
            let now = Instant::now();
            entries.retain(|_, (_, until)| *until > now);
            if entries.len() >= CACHE_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (value, Instant::now() + ttl));
    }
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
    tokens: Cache<String, Option<User>>,
    access: Cache<(User, String, String), bool>,
}

impl Delegation {
    pub(crate) fn new(
        settings: DelegationSettings,
        authentication: Option<kube::Client>,
        authorization: Option<kube::Client>,
    ) -> Arc<Delegation> {
        Arc::new(Delegation {
            settings,
            authentication,
            authorization,
            tokens: Cache::new(),
            access: Cache::new(),
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
                Err(error) => {
                    tracing::warn!(%error, "cannot review a bearer token");
                    return Decision::Unauthenticated;
                }
            },
            (None, None) => User::anonymous(),
        };
        if self.always_allowed(path) || user.groups.iter().any(|g| g == "system:masters") {
            return Decision::Allow;
        }
        match self.review_access(&user, path, verb).await {
            Ok(true) => Decision::Allow,
            Ok(false) => Decision::Forbidden(format!(
                "forbidden: User {:?} cannot {verb} path {path:?}",
                user.name
            )),
            Err(error) => Decision::Failed(format!("cannot authorize the request: {error}")),
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

    async fn review_token(&self, token: &str) -> Result<Option<User>, String> {
        if let Some(cached) = self.tokens.get(&token.to_owned()) {
            return Ok(cached);
        }
        let Some(client) = &self.authentication else {
            return Ok(None);
        };
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
            .map_err(|_| format!("no answer within {REVIEW_TIMEOUT:?}"))?
            .map_err(|error| error.to_string())?;
        let user = answer
            .status
            .filter(|status| status.authenticated == Some(true))
            .and_then(|status| status.user)
            .map(|user| User {
                name: user.username.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
            });
        self.tokens
            .put(token.to_owned(), user.clone(), self.settings.token_ttl);
        Ok(user)
    }

    async fn review_access(&self, user: &User, path: &str, verb: &str) -> Result<bool, String> {
        let key = (user.clone(), path.to_owned(), verb.to_owned());
        if let Some(allowed) = self.access.get(&key) {
            return Ok(allowed);
        }
        let Some(client) = &self.authorization else {
            return Ok(false);
        };
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
            .map_err(|_| format!("no answer within {REVIEW_TIMEOUT:?}"))?
            .map_err(|error| error.to_string())?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed {
            self.settings.allowed_ttl
        } else {
            self.settings.denied_ttl
        };
        self.access.put(key, allowed, ttl);
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
mod tests {
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
            Decision::Forbidden(
                r#"forbidden: User "system:anonymous" cannot get path "/metrics""#.to_owned()
            )
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

    #[test]
    fn the_cache_forgets_and_stays_bounded() {
        let cache: Cache<u32, bool> = Cache::new();
        cache.put(1, true, Duration::ZERO);
        assert_eq!(cache.get(&1), None, "a zero TTL caches nothing");
        for key in 0..(CACHE_ENTRIES as u32 + 10) {
            cache.put(key, true, Duration::from_secs(60));
        }
        let size = cache.entries.lock().unwrap().len();
        assert!(size <= CACHE_ENTRIES, "{size}");
    }
}
