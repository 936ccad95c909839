//! The real control plane's keys and certificates, made at start: a cluster CA (serving certificate and
//! client certificates), a front-proxy CA (request-header authentication), and the service-account key.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct CertifiedKey {
    /// The certificate.
    pub cert_pem: String,
    /// Its PKCS #8 private key.
    pub key_pem: String,
}

/// A certificate authority that signs more certificates while the control plane runs.
pub(crate) struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Authority {
    pub(crate) fn new(common_name: &str) -> Result<Authority, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Authority {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)?,
        })
    }

    /// The CA certificate, PEM.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub(crate) fn der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// A serving certificate for `localhost` and `ips`.
    pub(crate) fn server(&self, ips: &[IpAddr]) -> Result<CertifiedKey, rcgen::Error> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: Kubernetes reads the user from the common name and a group from the
    /// organisation.
    pub(crate) fn client(&self, user: &str, group: Option<&str>) -> Result<CertifiedKey, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params.distinguished_name.push(DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<CertifiedKey, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A key pair for service-account tokens, PEM: the private key (PKCS #8) for
/// `--service-account-signing-key-file`, the public key (SPKI) for `--service-account-key-file`.
pub(crate) fn service_account_key() -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// How a client proves who it is.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A bearer token.
    Token(String),
    /// A client certificate and its key.
    Certificate(CertifiedKey),
}

impl Credentials {
    /// The bearer token, when these are one.
    pub fn token(&self) -> Option<&str> {
        match self {
            Credentials::Token(token) => Some(token),
            Credentials::Certificate(_) => None,
        }
    }
}
