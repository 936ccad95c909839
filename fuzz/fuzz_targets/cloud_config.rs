//! Any bytes as the fake provider's `--cloud-config`: parsed or refused with one error naming the flag.
#![no_main]

use kube_ccm_fake::FakeCloudConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(error) = FakeCloudConfig::parse(data) {
        assert!(error.to_string().starts_with("--cloud-config: "));
    }
});
