//! Tests of the serving TLS configuration: suites, curves, reloads of the pair and the client CA.

use super::*;

#[test]
fn curves_by_their_go_ids() {
    let ids = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert!(kx_groups("--tls-curve-preferences", &[]).unwrap().is_none());
    let chosen = kx_groups("--tls-curve-preferences", &ids(&["23", " 29"]))
        .unwrap()
        .unwrap();
    let names: Vec<_> = chosen.iter().map(|g| g.name()).collect();
    assert_eq!(names, [rustls::NamedGroup::X25519, rustls::NamedGroup::secp256r1]);
    for (id, error) in [
        (
            "25",
            "--webhook-tls-curve-preferences: CurveID 25 (P-521) is not available here: 23 (P-256), 24 (P-384) and 29 (X25519) are",
        ),
        ("7", "--webhook-tls-curve-preferences: 7 is not a known CurveID"),
        (
            "x",
            "--webhook-tls-curve-preferences: \"x\" is not a CurveID number (23 P-256, 24 P-384, 29 X25519)",
        ),
    ] {
        assert_eq!(
            kx_groups("--webhook-tls-curve-preferences", &ids(&[id]))
                .map(|_| ())
                .unwrap_err(),
            error
        );
    }
}

#[test]
fn cipher_suites_by_their_go_names() {
    use rustls::crypto::ring::cipher_suite as suite;
    let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    assert_eq!(cipher_suites("--tls-cipher-suites", &[]), Ok(None));
    assert_eq!(
        cipher_suites(
            "--tls-cipher-suites",
            &names(&[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            ])
        ),
        Ok(Some(vec![
            suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ]))
    );
    assert_eq!(
        cipher_suites("--tls-cipher-suites", &names(&["TLS_CHACHA20_POLY1305_SHA256"])),
        Ok(Some(vec![]))
    );
    let cbc = cipher_suites(
        "--tls-cipher-suites",
        &names(&["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"]),
    )
    .unwrap_err();
    assert!(
        cbc.starts_with("--tls-cipher-suites: TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA is not available"),
        "{cbc}"
    );
    assert_eq!(
        cipher_suites("--tls-cipher-suites", &names(&["TLS_NOPE"])),
        Err("--tls-cipher-suites: cipher suite TLS_NOPE not supported or doesn't exist".to_owned())
    );
}
