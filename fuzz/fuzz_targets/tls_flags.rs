//! Any text as `--tls-cipher-suites`, `--tls-curve-preferences` (comma-separated, as the flags split
//! them) and `--tls-min-version`: accepted or refused with one error naming its flag.
#![no_main]

use kube_ccm_cli::fuzzing::tls_flags;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, '\n');
    let list = |part: Option<&str>| -> Vec<String> {
        part.unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (suites, groups) = (list(parts.next()), list(parts.next()));
    let min_version = parts.next().unwrap_or_default();
    if let Err(error) = tls_flags(&suites, &groups, min_version) {
        assert!(error.starts_with("--tls-"), "{error}");
    }
});
