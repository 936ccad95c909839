//! Any text as an INI (gcfg) cloud-config: read into sections and keys, or refused with one error naming
//! the line.
#![no_main]

use kube_ccm_provider::gcfg;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(error) = gcfg::read(text) {
        assert!(error.to_string().starts_with("cloud-config"), "{error}");
    }
});
