//! Any text as the GCE provider's `gce.conf`: parsed (unknown sections and keys warned about) or refused
//! with one error naming the cloud-config, never a panic.
#![no_main]

use kube_ccm_gce::CloudConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match CloudConfig::parse(text) {
        Ok(parsed) => {
            for warning in &parsed.warnings {
                assert!(warning.starts_with("line "), "{warning}");
            }
        }
        Err(error) => assert!(error.to_string().starts_with("cloud-config"), "{error}"),
    }
});
