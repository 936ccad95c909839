//! TLS of the serving endpoints: the certificate pair (reloaded when its files change, or made in memory),
//! `--tls-min-version` and `--tls-cipher-suites`, and the client certificates of users (`--client-ca-file`)
//! and of front proxies (`--requestheader-client-ca-file`), each told apart after the handshake.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustls::SupportedCipherSuite;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::Serving;
use super::auth::{self, User};

/// The CA bundle that verifies client certificates, and where it came from (for errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientCa {
    /// `--client-ca-file: <file>`, or the ConfigMap it was looked up in.
    pub(crate) source: String,
    pub(crate) pem: Vec<u8>,
    /// The file it was read from, read again when it changes; `None`: from the cluster's ConfigMap, read
    /// at start.
    pub(crate) file: Option<PathBuf>,
}

impl ClientCa {
    /// Trust anchors of the bundle.
    fn roots(&self) -> Result<rustls::RootCertStore> {
        let source = &self.source;
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(&self.pem) {
            let certificate = certificate.with_context(|| format!("{source}: not PEM certificates"))?;
            roots
                .add(certificate)
                .with_context(|| format!("{source}: holds a certificate that is not a CA"))?;
        }
        if roots.is_empty() {
            anyhow::bail!("{source}: holds no certificate");
        }
        Ok(roots)
    }
}

/// Request-header (front-proxy) authentication: `--requestheader-*`, or the same keys of the cluster's
/// ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrontProxy {
    pub(crate) ca: ClientCa,
    /// Common names the proxy's certificate may have; empty: any the CA signed.
    pub(crate) allowed_names: Vec<String>,
    /// Headers naming the user (the first present wins) and its groups (every value of each).
    pub(crate) username_headers: Vec<String>,
    pub(crate) group_headers: Vec<String>,
}

impl FrontProxy {
    /// The user a verified proxy names in `headers`; `None` without a user name.
    pub(super) fn user(&self, headers: &http::HeaderMap) -> Option<User> {
        let name = self
            .username_headers
            .iter()
            .find_map(|header| headers.get(header.as_str()).and_then(|v| v.to_str().ok()))
            .map(str::trim)
            .filter(|name| !name.is_empty())?
            .to_owned();
        let groups = self
            .group_headers
            .iter()
            .flat_map(|header| headers.get_all(header.as_str()))
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect();
        Some(User { name, groups })
    }
}

/// Who a connection's client certificate makes the caller: checked against each CA on its own (the
/// handshake accepts either), so a proxy's certificate never passes for a user's and the reverse.
pub(super) struct Verifiers {
    client: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    front_proxy: Option<(
        Arc<dyn rustls::server::danger::ClientCertVerifier>,
        Arc<FrontProxy>,
    )>,
}

/// What a connection's certificate established.
#[derive(Default)]
pub(super) struct Peer {
    /// A verified front proxy: each request's headers name the caller.
    pub(super) front_proxy: Option<Arc<FrontProxy>>,
    /// A verified client certificate's user.
    pub(super) certificate_user: Option<User>,
}

impl Verifiers {
    pub(super) fn peer(&self, chain: Option<&[CertificateDer<'static>]>) -> Peer {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return Peer::default();
        };
        let verified = |verifier: &Arc<dyn rustls::server::danger::ClientCertVerifier>| {
            verifier
                .verify_client_cert(leaf, intermediates, rustls::pki_types::UnixTime::now())
                .is_ok()
        };
        let front_proxy = self.front_proxy.as_ref().and_then(|(verifier, proxy)| {
            let allowed = proxy.allowed_names.is_empty()
                || auth::certificate_user(leaf).is_some_and(|user| proxy.allowed_names.contains(&user.name));
            (verified(verifier) && allowed).then(|| proxy.clone())
        });
        let certificate_user = self
            .client
            .as_ref()
            .filter(|verifier| verified(verifier))
            .and_then(|_| auth::certificate_user(leaf));
        Peer {
            front_proxy,
            certificate_user,
        }
    }
}

/// `--tls-cipher-suites` (or `flag`, e.g. the webhook server's), by Go's names: the TLS 1.2 suites to
/// offer. TLS 1.3 names are accepted and, as in Go, change nothing. `None` for an empty list.
pub(crate) fn cipher_suites(
    flag: &str,
    names: &[String],
) -> Result<Option<Vec<SupportedCipherSuite>>, String> {
    use rustls::crypto::ring::cipher_suite as suite;
    const TLS13: [&str; 3] = [
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256",
    ];
    let names: Vec<&str> = names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        return Ok(None);
    }
    let mut chosen = Vec::new();
    for name in names {
        let found = match name {
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" => {
                suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            }
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" => {
                suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
            }
            _ if TLS13.contains(&name) => continue,
            _ if name.starts_with("TLS_") && (name.contains("_WITH_") || name.contains("_RC4_")) => {
                return Err(format!(
                    "{flag}: {name} is not available here: only ECDHE suites with AES-GCM or ChaCha20-Poly1305 are (rustls implements no CBC, RC4, 3DES or RSA key-exchange suite)"
                ));
            }
            _ => {
                return Err(format!(
                    "{flag}: cipher suite {name} not supported or doesn't exist"
                ));
            }
        };
        if !chosen.contains(&found) {
            chosen.push(found);
        }
    }
    Ok(Some(chosen))
}

/// `--tls-curve-preferences` (or `flag`), by Go's numeric `crypto/tls` CurveIDs: the key exchange groups to
/// offer, in this process's (ring's) order of preference. `None` for an empty list.
pub(crate) fn kx_groups(
    flag: &str,
    ids: &[String],
) -> Result<Option<Vec<&'static dyn rustls::crypto::SupportedKxGroup>>, String> {
    use rustls::crypto::ring::kx_group;
    let ids: Vec<&str> = ids.iter().map(|n| n.trim()).filter(|n| !n.is_empty()).collect();
    if ids.is_empty() {
        return Ok(None);
    }
    let mut wanted = Vec::new();
    for id in ids {
        let number: u16 = id
            .parse()
            .map_err(|_| format!("{flag}: {id:?} is not a CurveID number (23 P-256, 24 P-384, 29 X25519)"))?;
        let group: &'static dyn rustls::crypto::SupportedKxGroup = match number {
            23 => kx_group::SECP256R1,
            24 => kx_group::SECP384R1,
            29 => kx_group::X25519,
            25 | 4588 => {
                return Err(format!(
                    "{flag}: CurveID {number} ({}) is not available here: 23 (P-256), 24 (P-384) and 29 (X25519) are",
                    if number == 25 { "P-521" } else { "X25519MLKEM768" }
                ));
            }
            _ => return Err(format!("{flag}: {number} is not a known CurveID")),
        };
        wanted.push(group.name());
    }
    let groups: Vec<_> = rustls::crypto::ring::default_provider()
        .kx_groups
        .into_iter()
        .filter(|g| wanted.contains(&g.name()))
        .collect();
    Ok(Some(groups))
}

/// The files' contents: what tells that a pair changed (a few kilobytes; modification times are too coarse
/// to tell two writes within a clock tick apart).
type Stamp = [Option<Vec<u8>>; 2];

fn stamp(files: [&Path; 2]) -> Stamp {
    files.map(|file| std::fs::read(file).ok())
}

/// `flags`: the prefix of the flags' names in messages (`""` or `"webhook-"`).
fn load_pair(cert: &Path, key: &Path, provider: &CryptoProvider, flags: &str) -> Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--{flags}tls-cert-file: cannot read {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| {
            format!(
                "--{flags}tls-cert-file: {} is not PEM certificates",
                cert.display()
            )
        })?;
    if chain.is_empty() {
        anyhow::bail!("--{flags}tls-cert-file: {} holds no certificate", cert.display());
    }
    let key_der = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!(
            "--{flags}tls-private-key-file: cannot read a PEM private key from {}",
            key.display()
        )
    })?;
    CertifiedKey::from_der(chain, key_der, provider).with_context(|| {
        format!(
            "--{flags}tls-cert-file/--{flags}tls-private-key-file: the key does not match the certificate"
        )
    })
}

/// Writes a self-signed pair for `localhost` and 127.0.0.1 to `cert` and `key` unless both exist (upstream's
/// `MaybeDefaultWithSelfSignedCerts` for `--webhook-cert-dir`); the key readable by its owner only.
pub(crate) fn ensure_self_signed_pair(cert: &Path, key: &Path) -> Result<()> {
    if cert.exists() && key.exists() {
        return Ok(());
    }
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .context("cannot generate a self-signed certificate")?;
    if let Some(dir) = cert.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // The key first, then the certificate, each written whole before it is named: a reader never sees half.
    write_new(key, certified.signing_key.serialize_pem().as_bytes(), 0o600)?;
    write_new(cert, certified.cert.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %cert.display(), "made a self-signed certificate for the webhook server");
    Ok(())
}

/// Writes `path` whole with `mode`: into a new temporary file of its own (one a crash left is removed
/// first, so the mode is this one), then renamed into place.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    let temporary = path.with_file_name(name);
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(contents))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("cannot write {}", path.display()))
}

/// The serving certificate from files, read again when they change (checked at a handshake, at most every
/// [`Serving::reload_check`]): a rotated certificate is served without a restart. A pair that does not load
/// leaves the previous one in service, with a warning (once per change).
#[derive(Debug)]
struct ReloadingCertificate {
    files: [PathBuf; 2],
    check_every: Duration,
    provider: Arc<CryptoProvider>,
    flags: &'static str,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

/// How often the certificate files are looked at, at most.
pub(crate) const RELOAD_CHECK: Duration = Duration::from_secs(1);

impl ReloadingCertificate {
    fn load(
        cert: &Path,
        key: &Path,
        check_every: Duration,
        provider: Arc<CryptoProvider>,
        flags: &'static str,
    ) -> Result<ReloadingCertificate> {
        let stamp = stamp([cert, key]);
        let loaded = load_pair(cert, key, &provider, flags)?;
        Ok(ReloadingCertificate {
            files: [cert.to_owned(), key.to_owned()],
            check_every,
            provider,
            flags,
            state: Mutex::new(Loaded {
                key: Arc::new(loaded),
                stamp,
                checked: Instant::now(),
            }),
        })
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= self.check_every {
            state.checked = Instant::now();
            let [cert, key] = &self.files;
            let now = stamp([cert, key]);
            if now != state.stamp {
                state.stamp = now;
                match load_pair(cert, key, &self.provider, self.flags) {
                    Ok(loaded) => {
                        state.key = Arc::new(loaded);
                        tracing::info!(cert = %cert.display(), "serving the changed certificate");
                    }
                    Err(error) => {
                        tracing::warn!(
                            error = format!("{error:#}"),
                            "cannot load the changed certificate; serving the previous one"
                        );
                    }
                }
            }
        }
        Some(state.key.clone())
    }
}

/// A certificate made once (the in-memory self-signed one).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The crypto provider `serving`'s suites and groups leave, and whether only TLS 1.3 is left.
fn provider(serving: &Serving) -> (Arc<CryptoProvider>, bool) {
    let mut provider = rustls::crypto::ring::default_provider();
    let mut tls13_only = serving.tls13_only;
    if let Some(groups) = &serving.kx_groups {
        provider.kx_groups = groups.clone();
    }
    if let Some(chosen) = &serving.cipher_suites {
        provider
            .cipher_suites
            .retain(|s| s.version() == &rustls::version::TLS13 || chosen.contains(s));
        // Only TLS 1.3 names: nothing is left to offer over TLS 1.2.
        tls13_only |= chosen.is_empty();
    }
    (Arc::new(provider), tls13_only)
}

/// The serving certificate: from `--tls-cert-file`/`--tls-private-key-file` (reloaded), or made in memory.
fn certificate(serving: &Serving, provider: &Arc<CryptoProvider>) -> Result<Arc<dyn ResolvesServerCert>> {
    match (&serving.cert_file, &serving.key_file) {
        (Some(cert), Some(key)) => Ok(Arc::new(ReloadingCertificate::load(
            Path::new(cert),
            Path::new(key),
            serving.reload_check,
            provider.clone(),
            serving.flags,
        )?)),
        _ => {
            let host = crate::identity::hostname();
            let names = vec!["localhost".to_owned(), host];
            let certified = rcgen::generate_simple_self_signed(names)
                .context("cannot generate a self-signed certificate")?;
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
            tracing::info!(
                "no --{}tls-cert-file: serving a self-signed certificate made in memory",
                serving.flags
            );
            let key = CertifiedKey::from_der(vec![certified.cert.der().clone()], key, provider)
                .context("cannot use the self-signed certificate")?;
            Ok(Arc::new(Fixed(Arc::new(key))))
        }
    }
}

/// The TLS configuration with these client CAs.
fn config_with(
    provider: &Arc<CryptoProvider>,
    tls13_only: bool,
    certificate: Arc<dyn ResolvesServerCert>,
    client_ca: Option<&ClientCa>,
    front_proxy: Option<&FrontProxy>,
) -> Result<(rustls::ServerConfig, Verifiers)> {
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13_only {
        &[&rustls::version::TLS13]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(versions)?;
    let verifier = |ca: &ClientCa, roots: rustls::RootCertStore| {
        // A caller without a certificate is still served (then a token or anonymity decides).
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()
            .with_context(|| format!("{}: cannot verify clients", ca.source))
    };
    // Each CA is parsed once: its own verifier tells which CA signed, the union admits either at the handshake.
    let client_roots = client_ca.map(|ca| ca.roots().map(|r| (ca, r))).transpose()?;
    let proxy_roots = front_proxy
        .map(|proxy| proxy.ca.roots().map(|r| (proxy, r)))
        .transpose()?;
    let mut union = rustls::RootCertStore::empty();
    let mut first = None;
    if let Some((ca, roots)) = &client_roots {
        union.roots.extend(roots.roots.iter().cloned());
        first.get_or_insert(*ca);
    }
    if let Some((proxy, roots)) = &proxy_roots {
        union.roots.extend(roots.roots.iter().cloned());
        first.get_or_insert(&proxy.ca);
    }
    let builder = match first {
        None => builder.with_no_client_auth(),
        Some(first) => builder.with_client_cert_verifier(verifier(first, union)?),
    };
    let verifiers = Verifiers {
        client: client_roots.map(|(ca, roots)| verifier(ca, roots)).transpose()?,
        front_proxy: proxy_roots
            .map(|(proxy, roots)| {
                Ok::<_, anyhow::Error>((verifier(&proxy.ca, roots)?, Arc::new(proxy.clone())))
            })
            .transpose()?,
    };
    let mut config = builder.with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, verifiers))
}

/// The TLS configuration of a port, made again when a client CA file changes (looked at, at most every
/// [`Serving::reload_check`], when a connection arrives): a rotated CA verifies clients without a restart,
/// as upstream's dynamic CA file. A CA that does not load leaves the previous one in force, with a warning
/// (once per change). A CA read from the cluster's ConfigMap is read at start only.
pub(super) struct ReloadingTls {
    provider: Arc<CryptoProvider>,
    tls13_only: bool,
    certificate: Arc<dyn ResolvesServerCert>,
    check_every: Duration,
    state: Mutex<TlsState>,
}

struct TlsState {
    /// The CAs the configuration in force was made with.
    client_ca: Option<ClientCa>,
    front_proxy: Option<FrontProxy>,
    /// What the CA files held when last looked at (a change is acted on, and warned about, once).
    seen: [Option<Vec<u8>>; 2],
    config: Arc<rustls::ServerConfig>,
    verifiers: Arc<Verifiers>,
    checked: Instant,
}

impl ReloadingTls {
    pub(super) fn new(serving: &Serving) -> Result<ReloadingTls> {
        let (provider, tls13_only) = provider(serving);
        let certificate = certificate(serving, &provider)?;
        let (config, verifiers) = config_with(
            &provider,
            tls13_only,
            certificate.clone(),
            serving.client_ca.as_ref(),
            serving.front_proxy.as_ref(),
        )?;
        Ok(ReloadingTls {
            provider,
            tls13_only,
            certificate,
            check_every: serving.reload_check,
            state: Mutex::new(TlsState {
                seen: [
                    serving.client_ca.as_ref().map(|ca| ca.pem.clone()),
                    serving.front_proxy.as_ref().map(|proxy| proxy.ca.pem.clone()),
                ],
                client_ca: serving.client_ca.clone(),
                front_proxy: serving.front_proxy.clone(),
                config: Arc::new(config),
                verifiers: Arc::new(verifiers),
                checked: Instant::now(),
            }),
        })
    }

    /// The configuration in force, and its verifiers.
    pub(super) fn current(&self) -> (Arc<rustls::ServerConfig>, Arc<Verifiers>) {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= self.check_every {
            state.checked = Instant::now();
            self.reload(&mut state);
        }
        (state.config.clone(), state.verifiers.clone())
    }

    fn reload(&self, state: &mut TlsState) {
        // What each CA's file holds now (a CA from the cluster's ConfigMap, or an unreadable file: as
        // loaded).
        let now = |ca: &ClientCa| -> Vec<u8> {
            ca.file
                .as_ref()
                .and_then(|file| std::fs::read(file).ok())
                .unwrap_or_else(|| ca.pem.clone())
        };
        let seen = [
            state.client_ca.as_ref().map(now),
            state.front_proxy.as_ref().map(|proxy| now(&proxy.ca)),
        ];
        if seen == state.seen {
            return;
        }
        state.seen = seen.clone();
        let [client_pem, proxy_pem] = seen;
        let client_ca = state
            .client_ca
            .clone()
            .zip(client_pem)
            .map(|(ca, pem)| ClientCa { pem, ..ca });
        let front_proxy = state
            .front_proxy
            .clone()
            .zip(proxy_pem)
            .map(|(proxy, pem)| FrontProxy {
                ca: ClientCa {
                    pem,
                    ..proxy.ca.clone()
                },
                ..proxy
            });
        match config_with(
            &self.provider,
            self.tls13_only,
            self.certificate.clone(),
            client_ca.as_ref(),
            front_proxy.as_ref(),
        ) {
            Ok((config, verifiers)) => {
                state.config = Arc::new(config);
                state.verifiers = Arc::new(verifiers);
                state.client_ca = client_ca;
                state.front_proxy = front_proxy;
                tracing::info!("verifying client certificates with the changed CA");
            }
            Err(error) => tracing::warn!(
                error = format!("{error:#}"),
                "cannot load the changed client CA; verifying with the previous one"
            ),
        }
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
