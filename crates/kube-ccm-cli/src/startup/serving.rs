//! Step 4: who may read what is served: the client CAs (flags, else what the cluster publishes) and the
//! API server's delegated decisions, and `/configz`'s body.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube_ccm_runtime::ClientFactory;

use super::kubeconfig::kubeconfig_file;
use crate::serve::{ClientCa, FrontProxy, Serving};
use crate::settings::Settings;

/// Serving, with who may authenticate by certificate looked up, and the delegation that decides the rest.
pub(super) async fn prepare(
    mut serving: Serving,
    settings: &Settings,
    clients: &ClientFactory,
    component: &str,
    identity: &str,
) -> Result<(Serving, std::sync::Arc<crate::serve::auth::Delegation>)> {
    (serving.client_ca, serving.front_proxy) = authentication_sources(settings, clients).await?;
    let delegation = delegation(settings, clients, component, identity).await?;
    Ok((serving, delegation))
}

/// The user agent of the connections that serve authentication and authorisation (its metrics and logs
/// tell them apart from the controllers').
const DELEGATED_AUTH_AGENT: &str = "delegated-auth";

/// The clients that ask the API server who a caller is and what they may read: from
/// `--authentication-kubeconfig` and `--authorization-kubeconfig`, or else the manager's own connection
/// (upstream uses the in-cluster configuration, and outside a cluster none).
async fn delegation(
    settings: &Settings,
    clients: &ClientFactory,
    component: &str,
    identity: &str,
) -> Result<std::sync::Arc<crate::serve::auth::Delegation>> {
    let client = |flag: &'static str, file: String| async move {
        if file.is_empty() {
            return clients
                .client(DELEGATED_AUTH_AGENT, None)
                .map_err(anyhow::Error::from);
        }
        let config = kubeconfig_file(flag, &file).await?;
        ClientFactory::new(
            config,
            component,
            identity,
            settings.kube_api_qps,
            settings.kube_api_burst,
        )
        .with_request_timeout(settings.kube_api_request_timeout.0)
        .with_version(clients.version())
        .client(DELEGATED_AUTH_AGENT, None)
        .map_err(anyhow::Error::from)
    };
    let authentication = client(
        "authentication-kubeconfig",
        settings.authentication_kubeconfig.clone(),
    )
    .await?;
    let authorization = client(
        "authorization-kubeconfig",
        settings.authorization_kubeconfig.clone(),
    )
    .await?;
    Ok(crate::serve::auth::Delegation::new(
        crate::serve::auth::DelegationSettings {
            always_allow_paths: settings
                .authorization_always_allow_paths
                .iter()
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
            token_ttl: settings.authentication_token_webhook_cache_ttl.0,
            allowed_ttl: settings.authorization_webhook_cache_authorized_ttl.0,
            denied_ttl: settings.authorization_webhook_cache_unauthorized_ttl.0,
        },
        Some(authentication),
        Some(authorization),
    ))
}

/// Where a cluster publishes the CA of the client certificates it issues (kube-apiserver writes it).
const AUTHENTICATION_CONFIG_MAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// Who may authenticate by certificate: the client CA (`--client-ca-file`) and the front proxy
/// (`--requestheader-client-ca-file` and the header flags). What a flag leaves out is looked up, unless
/// `--authentication-skip-lookup`, in `kube-system/extension-apiserver-authentication` (its `client-ca-file`
/// and `requestheader-*` keys), as upstream: a missing ConfigMap means none; a lookup that fails stops the
/// start unless `--authentication-tolerate-lookup-failure`.
async fn authentication_sources(
    settings: &Settings,
    clients: &ClientFactory,
) -> Result<(Option<ClientCa>, Option<FrontProxy>)> {
    let (client_ca, front_proxy) = from_flags(settings)?;
    let complete = client_ca.is_some() && front_proxy.is_some();
    if complete || settings.authentication_skip_lookup {
        return Ok((client_ca, front_proxy));
    }
    match published(settings, clients).await? {
        Some(data) => with_published(
            client_ca,
            front_proxy,
            &data,
            &settings.requestheader_username_headers,
            &settings.requestheader_group_headers,
        ),
        None => Ok((client_ca, front_proxy)),
    }
}

/// What the flags name: the client CA, and the front proxy's CA with its header flags, each read from
/// its file.
fn from_flags(settings: &Settings) -> Result<(Option<ClientCa>, Option<FrontProxy>)> {
    let client_ca = if settings.client_ca_file.is_empty() {
        None
    } else {
        Some(read_ca("client-ca-file", &settings.client_ca_file)?)
    };
    let front_proxy = if settings.requestheader_client_ca_file.is_empty() {
        None
    } else {
        Some(FrontProxy {
            ca: read_ca(
                "requestheader-client-ca-file",
                &settings.requestheader_client_ca_file,
            )?,
            allowed_names: listed(&settings.requestheader_allowed_names),
            username_headers: listed(&settings.requestheader_username_headers),
            group_headers: listed(&settings.requestheader_group_headers),
        })
    };
    Ok((client_ca, front_proxy))
}

/// The CA bundle in `file`, named by its flag (`--{flag}: {file}`) in errors and in what it verifies.
fn read_ca(flag: &str, file: &str) -> Result<ClientCa> {
    let pem = std::fs::read(file).with_context(|| format!("--{flag}: cannot read {file}"))?;
    Ok(ClientCa {
        source: format!("--{flag}: {file}"),
        pem,
        file: Some(file.into()),
    })
}

/// A list flag's values, trimmed, without the empty ones.
fn listed(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The data the cluster publishes in [`AUTHENTICATION_CONFIG_MAP`]: `None` when there is no such ConfigMap,
/// or when the lookup fails and `--authentication-tolerate-lookup-failure` lets the start go on without it.
async fn published(settings: &Settings, clients: &ClientFactory) -> Result<Option<BTreeMap<String, String>>> {
    let (namespace, name) = AUTHENTICATION_CONFIG_MAP;
    let client = clients.client(DELEGATED_AUTH_AGENT, None)?;
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, namespace);
    let looked_up = tokio::time::timeout(std::time::Duration::from_secs(30), config_maps.get_opt(name))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 30s"))
        .and_then(|answer| {
            answer.map_err(|error| match error {
                kube::Error::Api(status) => anyhow::anyhow!("{} ({})", status.message, status.code),
                other => anyhow::Error::from(other),
            })
        });
    match looked_up {
        Ok(Some(config_map)) => Ok(Some(config_map.data.unwrap_or_default())),
        Ok(None) => {
            tracing::info!(configmap = %format!("{namespace}/{name}"), "no authentication configuration published in the cluster");
            Ok(None)
        }
        Err(error) if settings.authentication_tolerate_lookup_failure => {
            tracing::warn!(%error, configmap = %format!("{namespace}/{name}"), "cannot look up the authentication configuration; going on without it (--authentication-tolerate-lookup-failure)");
            Ok(None)
        }
        Err(error) => Err(error.context(format!(
            "cannot look up the authentication configuration in ConfigMap {namespace}/{name} (grant the Role extension-apiserver-authentication-reader, give --client-ca-file and --requestheader-client-ca-file, or pass --authentication-skip-lookup or --authentication-tolerate-lookup-failure)"
        ))),
    }
}

/// What the flags gave, completed from the published `data`: a CA the flags left out from its key, and the
/// front proxy's lists from theirs (JSON arrays of strings, as kube-apiserver writes them), an absent header
/// list being the flag's (`username_headers`, `group_headers`). Decided apart from the lookup, so that what
/// the keys mean is tested without a cluster.
fn with_published(
    mut client_ca: Option<ClientCa>,
    mut front_proxy: Option<FrontProxy>,
    data: &BTreeMap<String, String>,
    username_headers: &[String],
    group_headers: &[String],
) -> Result<(Option<ClientCa>, Option<FrontProxy>)> {
    let (namespace, name) = AUTHENTICATION_CONFIG_MAP;
    let pem = |key: &str| {
        data.get(key)
            .filter(|pem| !pem.trim().is_empty())
            .map(|pem| ClientCa {
                source: format!("ConfigMap {namespace}/{name}, key {key}"),
                pem: pem.clone().into_bytes(),
                file: None,
            })
    };
    let list = |key: &str, fallback: &[String]| -> Result<Vec<String>> {
        match data.get(key) {
            None => Ok(listed(fallback)),
            Some(text) => serde_json::from_str::<Vec<String>>(text).with_context(|| {
                format!("ConfigMap {namespace}/{name}, key {key}: not a JSON list of strings")
            }),
        }
    };
    if client_ca.is_none() {
        client_ca = pem("client-ca-file");
    }
    if front_proxy.is_none()
        && let Some(ca) = pem("requestheader-client-ca-file")
    {
        front_proxy = Some(FrontProxy {
            ca,
            allowed_names: list("requestheader-allowed-names", &[])?,
            username_headers: list("requestheader-username-headers", username_headers)?,
            group_headers: list("requestheader-group-headers", group_headers)?,
        });
    }
    Ok((client_ca, front_proxy))
}

/// `/configz`: the effective settings by flag name, under upstream's configuration group.
pub(super) fn configz(settings: &Settings) -> String {
    serde_json::json!({ "cloudcontrollermanager.config.k8s.io": settings }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ConfigMap's data.
    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn flag_ca() -> ClientCa {
        ClientCa {
            source: "--client-ca-file: ca.pem".to_owned(),
            pem: b"flag pem".to_vec(),
            file: Some("ca.pem".into()),
        }
    }

    #[test]
    fn what_the_flags_leave_out_is_taken_from_the_published_keys() {
        let published = data(&[
            ("client-ca-file", "client pem"),
            ("requestheader-client-ca-file", "proxy pem"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
        ]);
        let (client_ca, front_proxy) = with_published(
            Some(flag_ca()),
            None,
            &published,
            &strings(&["x-remote-user"]),
            &strings(&[" x-remote-group ", ""]),
        )
        .unwrap();
        assert_eq!(client_ca, Some(flag_ca()), "the flag's CA is kept");
        let front_proxy = front_proxy.unwrap();
        assert_eq!(
            front_proxy.ca,
            ClientCa {
                source: "ConfigMap kube-system/extension-apiserver-authentication, key requestheader-client-ca-file"
                    .to_owned(),
                pem: b"proxy pem".to_vec(),
                file: None,
            }
        );
        assert_eq!(front_proxy.allowed_names, ["front-proxy-client"]);
        assert_eq!(front_proxy.username_headers, ["X-Remote-User"]);
        assert_eq!(
            front_proxy.group_headers,
            ["x-remote-group"],
            "an absent key: the flag's values, trimmed"
        );
    }

    #[test]
    fn a_blank_ca_is_none_and_a_list_that_is_not_json_is_an_error() {
        let blank = data(&[("client-ca-file", " \n"), ("requestheader-client-ca-file", "")]);
        let (client_ca, front_proxy) = with_published(None, None, &blank, &[], &[]).unwrap();
        assert!(client_ca.is_none(), "{client_ca:?}");
        assert!(front_proxy.is_none(), "{front_proxy:?}");
        let not_json = data(&[
            ("requestheader-client-ca-file", "proxy pem"),
            ("requestheader-group-headers", "x-remote-group"),
        ]);
        let error = with_published(None, None, &not_json, &[], &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "ConfigMap kube-system/extension-apiserver-authentication, key requestheader-group-headers: not a JSON list of strings"
        );
    }
}
