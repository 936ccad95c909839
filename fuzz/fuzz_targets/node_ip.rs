//! Any text as a node's `alpha.kubernetes.io/provided-node-ip`, against the cloud's addresses: the
//! addresses it keeps are among the cloud's, or the error names the annotation's value.
#![no_main]

use k8s_openapi::api::core::v1::NodeAddress;
use kube_ccm_runtime::fuzzing::node_addresses;
use libfuzzer_sys::fuzz_target;

fn address(type_: &str, address: &str) -> NodeAddress {
    NodeAddress {
        type_: type_.to_owned(),
        address: address.to_owned(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cloud = [
        address("InternalIP", "10.0.0.1"),
        address("InternalIP", "fd00::1"),
        address("ExternalIP", "34.0.0.1"),
        address("Hostname", "node-1"),
    ];
    let current = [address("Hostname", "node-1")];
    for initialization in [true, false] {
        match node_addresses(&current, &cloud, Some(text), initialization) {
            Ok(Some(kept)) => {
                for kept in &kept {
                    assert!(cloud.contains(kept) || current.contains(kept), "{kept:?}");
                }
            }
            Ok(None) => {}
            Err(error) => assert!(!error.is_empty()),
        }
    }
});
