//! Any text as `--feature-gates`: parsed (with warnings) or refused with one error naming the flag.
#![no_main]

use kube_ccm_cli::fuzzing::feature_gates;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(error) = feature_gates(text) {
        assert!(error.contains("--feature-gates"), "{error}");
    }
});
