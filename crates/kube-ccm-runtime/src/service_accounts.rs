//! `--use-service-account-credentials`: each controller acts as its own service account in `kube-system`
//! (`node-controller`, `service-controller`, `route-controller`, or the name its definition gives), as
//! upstream's dynamic client builder makes it act, so the cluster's bootstrap roles
//! (`system:controller:<account>`) and an operator's per-controller RBAC apply.
//!
//! With the manager's own credentials, the account is read and made when missing, then a token is asked
//! for through the TokenRequest API (an hour, as upstream) and asked for again when a fifth of its life is
//! left; a failed renewal is retried with back-off while the old token lasts. The controller's client
//! carries no credentials of the manager's (no client certificate, no token): only the account's token,
//! read afresh for every request, so a renewal needs no new client.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio_util::task::AbortOnDropHandle;

use crate::transport::TokenSource;

/// The namespace of the controllers' accounts (upstream's).
pub const NAMESPACE: &str = "kube-system";
/// The life asked for a token (upstream's `expirationSeconds`).
const LIFETIME: Duration = Duration::from_secs(3600);
/// A token is renewed when this share of its life is left (upstream's leeway: 20%).
const RENEW_WHEN_LEFT: f64 = 0.2;
/// The longest one request of the account's set-up may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a controller cannot act as its service account.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceAccountError {
    /// The account could not be read or made.
    #[error(
        "--use-service-account-credentials: service account {NAMESPACE}/{account} cannot be read or created with the manager's credentials: {message}"
    )]
    Account {
        /// The account.
        account: String,
        /// The API server's answer.
        message: String,
    },
    /// The TokenRequest was refused.
    #[error(
        "--use-service-account-credentials: TokenRequest for service account {NAMESPACE}/{account} refused: {message}"
    )]
    Token {
        /// The account.
        account: String,
        /// The API server's answer.
        message: String,
    },
}

/// The tokens of the controllers' accounts, each renewed in the background while this lives.
pub struct ServiceAccounts {
    /// A client with the manager's own credentials.
    root: kube::Client,
    tokens: tokio::sync::Mutex<HashMap<String, Arc<AccountToken>>>,
}

/// One account's current token.
pub struct AccountToken {
    value: RwLock<Arc<str>>,
    renewal: parking_lot::Mutex<Option<AbortOnDropHandle<()>>>,
}

impl AccountToken {
    /// The token to send now.
    pub fn current(&self) -> Arc<str> {
        self.value.read().clone()
    }
}

impl TokenSource for AccountToken {
    fn current(&self) -> Arc<str> {
        AccountToken::current(self)
    }
}

impl ServiceAccounts {
    /// Accounts set up and tokens asked for with `root`, a client with the manager's own credentials.
    pub fn new(root: kube::Client) -> ServiceAccounts {
        ServiceAccounts {
            root,
            tokens: tokio::sync::Mutex::default(),
        }
    }

    /// The token of `account`: the account made if missing and a first token asked for on first use, then
    /// renewed in the background.
    pub async fn token(&self, account: &str) -> Result<Arc<AccountToken>, ServiceAccountError> {
        let mut tokens = self.tokens.lock().await;
        if let Some(token) = tokens.get(account) {
            return Ok(token.clone());
        }
        get_or_create(&self.root, account).await?;
        let (value, renew_in) = request_token(&self.root, account).await?;
        let token = Arc::new(AccountToken {
            value: RwLock::new(value),
            renewal: parking_lot::Mutex::default(),
        });
        let renewal = tokio::spawn(renew(
            self.root.clone(),
            account.to_owned(),
            Arc::downgrade(&token),
            renew_in,
        ));
        *token.renewal.lock() = Some(AbortOnDropHandle::new(renewal));
        tokens.insert(account.to_owned(), token.clone());
        tracing::info!(
            account = %format!("{NAMESPACE}/{account}"),
            "acting as the service account (--use-service-account-credentials)"
        );
        Ok(token)
    }
}

/// The account, made when missing (as upstream's builder does).
async fn get_or_create(root: &kube::Client, account: &str) -> Result<(), ServiceAccountError> {
    let api: Api<ServiceAccount> = Api::namespaced(root.clone(), NAMESPACE);
    let failed = |message: String| ServiceAccountError::Account {
        account: account.to_owned(),
        message,
    };
    let found = tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(account))
        .await
        .map_err(|_| failed(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())))?
        .map_err(|error| failed(describe(&error)))?;
    if found.is_some() {
        return Ok(());
    }
    let made = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(account.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, api.create(&PostParams::default(), &made)).await {
        Err(_) => Err(failed(format!(
            "it does not exist, and creating it got no answer within {}s",
            REQUEST_TIMEOUT.as_secs()
        ))),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => Ok(()),
        Ok(Err(error)) => Err(failed(format!(
            "it does not exist, and creating it failed: {}",
            describe(&error)
        ))),
    }
}

/// A new token for `account`, and when to renew it.
async fn request_token(
    root: &kube::Client,
    account: &str,
) -> Result<(Arc<str>, Duration), ServiceAccountError> {
    let api: Api<ServiceAccount> = Api::namespaced(root.clone(), NAMESPACE);
    let refused = |message: String| ServiceAccountError::Token {
        account: account.to_owned(),
        message,
    };
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(LIFETIME.as_secs().try_into().unwrap_or(i64::MAX)),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer: TokenRequest = tokio::time::timeout(
        REQUEST_TIMEOUT,
        api.create_subresource("token", account, &PostParams::default(), &request),
    )
    .await
    .map_err(|_| refused(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())))?
    .map_err(|error| refused(describe(&error)))?;
    let status = answer
        .status
        .ok_or_else(|| refused("the answer has no status".to_owned()))?;
    if status.token.is_empty() {
        return Err(refused("the answer has no token".to_owned()));
    }
    let now = jiff::Timestamp::now();
    let life = Duration::try_from(status.expiration_timestamp.0.duration_since(now))
        .unwrap_or_default()
        .max(Duration::from_secs(60));
    Ok((
        Arc::from(status.token.as_str()),
        life.mul_f64(1.0 - RENEW_WHEN_LEFT),
    ))
}

/// Renews `account`'s token while it is in use, retrying a failure with back-off (1 s doubling to a
/// minute) while the old token lasts.
async fn renew(
    root: kube::Client,
    account: String,
    token: std::sync::Weak<AccountToken>,
    renew_in: Duration,
) {
    let ask = || request_token(&root, &account);
    renew_with(ask, token, renew_in).await;
}

/// [`renew`]'s schedule, with `ask` for a new token and when to renew it.
async fn renew_with<F, Fut>(ask: F, token: std::sync::Weak<AccountToken>, mut renew_in: Duration)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(Arc<str>, Duration), ServiceAccountError>>,
{
    let mut retry = Duration::from_secs(1);
    loop {
        tokio::time::sleep(renew_in).await;
        let Some(token) = token.upgrade() else {
            return;
        };
        match ask().await {
            Ok((value, next)) => {
                *token.value.write() = value;
                renew_in = next;
                retry = Duration::from_secs(1);
                tracing::debug!("renewed a service account's token");
            }
            Err(error) => {
                tracing::warn!(%error, "cannot renew the service account's token; trying again");
                renew_in = retry;
                retry = (retry * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// The API server's message, or the error.
fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    /// Answers `ask` with these results in turn, noting when (since the start) each was asked for.
    struct Script {
        answers: Mutex<Vec<Result<&'static str, &'static str>>>,
        asked_at: Mutex<Vec<Duration>>,
        start: tokio::time::Instant,
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_is_renewed_with_a_fifth_of_its_life_left_and_a_failure_retried_with_back_off() {
        let script = Arc::new(Script {
            answers: Mutex::new(vec![Ok("second"), Err("refused"), Err("refused"), Ok("third")]),
            asked_at: Mutex::default(),
            start: tokio::time::Instant::now(),
        });
        let token = Arc::new(AccountToken {
            value: RwLock::new(Arc::from("first")),
            renewal: parking_lot::Mutex::default(),
        });
        let life = LIFETIME.mul_f64(1.0 - RENEW_WHEN_LEFT);
        let asking = script.clone();
        let ask = move || {
            let script = asking.clone();
            async move {
                script.asked_at.lock().push(script.start.elapsed());
                let answer = script.answers.lock().remove(0);
                answer
                    .map(|value| (Arc::from(value), life))
                    .map_err(|message| ServiceAccountError::Token {
                        account: "node-controller".into(),
                        message: message.into(),
                    })
            }
        };
        let renewal = tokio::spawn(renew_with(ask, Arc::downgrade(&token), life));
        tokio::time::sleep(life + Duration::from_millis(1)).await;
        assert_eq!(&*token.current(), "second", "renewed after 48 minutes");
        tokio::time::sleep(life + Duration::from_secs(4)).await;
        assert_eq!(
            &*token.current(),
            "third",
            "the old token served while renewal was retried"
        );
        let asked = script.asked_at.lock().clone();
        assert_eq!(
            asked,
            [
                life,
                life * 2,
                life * 2 + Duration::from_secs(1),
                life * 2 + Duration::from_secs(3)
            ],
            "after 48 minutes, then 1 s and 2 s after each failure"
        );
        drop(token);
        tokio::time::sleep(life * 2).await;
        assert!(renewal.is_finished(), "renewal ends with the last client");
    }
}
