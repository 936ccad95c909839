//! `tagging-controller` (alias `tagging`, upstream's key): tags the EC2 instance of every node with
//! `--tags`, and takes them off when the node is deleted, as upstream's AWS tagging controller.
//!
//! A provider's own controller through the framework's registry ([`definition`]): it runs only with
//! `--cloud-provider=aws` and when named (`--controllers=*,tagging`), and its flags are upstream's
//! (`--tags`, `--resources`, and the `--tagging-controller-…` tuning flags). Enabled without `--tags` or
//! `--resources`, the manager does not start (upstream exits too).
//!
//! As upstream:
//! - A node is tagged when its label `k8s.io/cloud-provider-aws` is missing or is not the checksum of
//!   `--tags` ([`checksum`], upstream's, so nodes upstream's controller tagged are not tagged again);
//!   after `CreateTags` the node gets that label.
//! - A node whose instance does not exist (yet: `CreateTags` is eventually consistent for new
//!   instances) is retried; a provider ID that is not an instance's (a Fargate node) is skipped.
//! - A deleted node's instance gets `DeleteTags` for the same keys and values.
//!
//! Deliberate differences:
//! - Requests are always batched (upstream: with `--tagging-controller-enable-batching`): nodes that
//!   need tags within a second share one `CreateTags` for up to 1,000 instances, and deletions one
//!   `DeleteTags`; a batch refused for one instance is retried instance by instance. So
//!   `--tagging-controller-rate-limit`, `--tagging-controller-burst-limit`,
//!   `--tagging-controller-concurrent-node-syncs` and `--tagging-controller-enable-batching` are checked
//!   and accepted, and change nothing.
//! - A node's failures are retried from 1 s doubling to 5 minutes, without upstream's limit of 9
//!   retries (after which upstream waits for the node to change); untagging a deleted node gives up
//!   after 9 attempts, as upstream. An instance that no longer exists needs no untagging.
//! - Upstream's metrics (`cloudprovider_aws_tagging_controller_work_item_errors_total`,
//!   `tagging_controller_inital_node_tagging_delay_seconds`) are not exported; the controller's sync
//!   metrics are.
//!
//! Rooms: `ec2.rs` sends the tag requests and tells EC2's refusals of an instance from failures;
//! `tagger.rs` is the controller's loop (gathering, batching, retrying, untagging).

mod ec2;
mod tagger;

use std::collections::BTreeMap;
use std::time::Duration;

use kube_ccm_runtime::{CachedNode, ControllerDefinition, Flag, FlagValue, FlagValues, SharedCache};
use md5::{Digest, Md5};

pub use self::ec2::{Refused, refused};
use self::tagger::run;
use crate::PROVIDER_NAME;

/// The controller's name (upstream registers it as `tagging`, its alias here).
pub const TAGGING_CONTROLLER: &str = "tagging-controller";
/// The label that records which tags a node's instance has (their [`checksum`]).
pub const LABEL: &str = "k8s.io/cloud-provider-aws";
/// Instances per `CreateTags`/`DeleteTags` (EC2's limit).
pub const MAX_PER_REQUEST: usize = 1000;
/// How long work gathers before a batch is sent.
pub const WINDOW: Duration = Duration::from_secs(1);
/// How long after a node's creation a missing instance is taken for EC2's eventual consistency.
pub const GRACE: Duration = Duration::from_secs(300);
/// Attempts to untag a deleted node's instance (upstream's `maxRequeuingCount`).
pub const UNTAG_ATTEMPTS: u32 = 9;
/// The only `--resources` value upstream supports.
pub const INSTANCE: &str = "instance";

/// Upstream's flags.
pub const FLAGS: &[Flag] = &[
    Flag::list(
        "tags",
        "",
        "Tags to apply to AWS resources in the tagging controller, in a form of key=value.",
    )
    .checked(check_tags),
    Flag::list(
        "resources",
        "",
        "AWS resources name to add/remove tags in the tagging controller (only instance).",
    )
    .checked(check_resources),
    Flag::value(
        "tagging-controller-rate-limit",
        "0",
        "Accepted for compatibility (must not be negative): requests are batched instead.",
    )
    .checked(not_negative),
    Flag::value(
        "tagging-controller-burst-limit",
        "0",
        "Accepted for compatibility (must not be negative): requests are batched instead.",
    )
    .checked(whole_not_negative),
    Flag::value(
        "tagging-controller-concurrent-node-syncs",
        "1",
        "Accepted for compatibility (must be positive): one batch is in flight at a time.",
    )
    .checked(positive),
    Flag::bool(
        "tagging-controller-enable-batching",
        "false",
        "Accepted for compatibility: create and delete tag calls are always batched (up to 1,000 instances each).",
    ),
];

/// The controller, for a binary's registry: `tagging-controller` (alias `tagging`), aws only, off unless
/// named, and refusing to start without `--tags` and `--resources`.
pub fn definition() -> ControllerDefinition {
    ControllerDefinition::new(TAGGING_CONTROLLER, run)
        .aliases(&["tagging"])
        .for_provider(PROVIDER_NAME)
        .disabled_by_default()
        .reads(&[SharedCache::Nodes])
        .flags(FLAGS)
        .validated_by(required)
}

/// `--tags` as a map: `key=value` items, a later key winning; keys starting with `aws:` are AWS's.
pub fn parse_tags(items: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut tags = BTreeMap::new();
    for item in items {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("{item:?} is not of the form key=value"));
        };
        if key.is_empty() || key.len() > 128 || value.len() > 256 {
            return Err(format!(
                "{item:?}: a tag's key must have 1 to 128 characters and its value at most 256"
            ));
        }
        if key.to_ascii_lowercase().starts_with("aws:") {
            return Err(format!(
                "{item:?}: tag keys starting with aws: are reserved by AWS"
            ));
        }
        tags.insert(key.to_owned(), value.to_owned());
    }
    Ok(tags)
}

fn check_tags(value: &FlagValue) -> Result<(), kube_ccm_provider::Refused> {
    parse_tags(value.items())
        .map(|_| ())
        .map_err(kube_ccm_provider::Refused::from)
}

fn check_resources(value: &FlagValue) -> Result<(), kube_ccm_provider::Refused> {
    match value.items().iter().find(|r| r.as_str() != INSTANCE) {
        Some(other) => Err(format!(
            "{other} is not a supported resource. Current supported resources [{INSTANCE}]"
        )
        .into()),
        None => Ok(()),
    }
}

fn not_negative(value: &FlagValue) -> Result<(), kube_ccm_provider::Refused> {
    match value.text().trim().parse::<f64>() {
        Ok(rate) if rate >= 0.0 && rate.is_finite() => Ok(()),
        _ => Err(format!("{:?} must be a number, not less than zero", value.text()).into()),
    }
}

fn whole_not_negative(value: &FlagValue) -> Result<(), kube_ccm_provider::Refused> {
    value
        .text()
        .trim()
        .parse::<u32>()
        .map(|_| ())
        .map_err(|_| format!("{:?} must be a whole number, not less than zero", value.text()).into())
}

fn positive(value: &FlagValue) -> Result<(), kube_ccm_provider::Refused> {
    match value.text().trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(()),
        _ => Err(format!("{:?} must be a positive number", value.text()).into()),
    }
}

/// Upstream's `Validate`, for an enabled controller.
pub fn required(flags: &FlagValues) -> Result<(), kube_ccm_provider::Refused> {
    if flags.items("tags").is_empty() {
        return Err("--tags must not be empty and must be a form of key=value".into());
    }
    if flags.items("resources").is_empty() {
        return Err("--resources must not be empty".into());
    }
    Ok(())
}

/// Upstream's label value for `tags`: the MD5 of the sorted `key=value` items joined by commas, in hex.
pub fn checksum(tags: &BTreeMap<String, String>) -> String {
    let mut items: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    items.sort();
    Md5::digest(items.join(",").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `node`'s instance needs the tags whose checksum is `checksum`.
pub fn needs_tags(node: &CachedNode, checksum: &str) -> bool {
    !node.deleting() && node.label(LABEL) != Some(checksum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_checksum_is_upstreams_md5_of_the_sorted_items() {
        let tags = parse_tags(&items(&["team=web", "env=prod"])).unwrap();
        assert_eq!(checksum(&tags), "d04af88331b9bc0c72c58472a599c4c0");
        // Sorted as text (`a.b=2` before `a=1`), not by key.
        let tags = parse_tags(&items(&["a=1", "a.b=2"])).unwrap();
        assert_eq!(checksum(&tags), "ffe69f3a935db7cafa0904e49d6e069d");
    }

    #[test]
    fn bad_flags_are_refused_with_the_reason() {
        assert!(
            parse_tags(&items(&["team"]))
                .unwrap_err()
                .contains("not of the form key=value")
        );
        assert!(
            parse_tags(&items(&["aws:x=1"]))
                .unwrap_err()
                .contains("reserved by AWS")
        );
        assert!(parse_tags(&items(&["=v"])).is_err());
        assert_eq!(
            parse_tags(&items(&["k=", "k=v=w"])).unwrap(),
            BTreeMap::from([("k".to_owned(), "v=w".to_owned())])
        );
        assert_eq!(
            check_resources(&FlagValue::List(items(&["instance", "volume"])))
                .unwrap_err()
                .reason(),
            "volume is not a supported resource. Current supported resources [instance]"
        );
        assert!(not_negative(&FlagValue::Value("-1".into())).is_err());
        assert!(not_negative(&FlagValue::Value("2.5".into())).is_ok());
        assert!(whole_not_negative(&FlagValue::Value("-1".into())).is_err());
        assert!(positive(&FlagValue::Value("0".into())).is_err());
        assert!(positive(&FlagValue::Value("4".into())).is_ok());

        let mut flags = FlagValues::default();
        assert!(
            required(&flags)
                .unwrap_err()
                .reason()
                .starts_with("--tags must not be empty")
        );
        flags.insert("tags", FlagValue::List(items(&["a=b"])));
        assert_eq!(
            required(&flags).unwrap_err().reason(),
            "--resources must not be empty"
        );
        flags.insert("resources", FlagValue::List(items(&["instance"])));
        assert_eq!(required(&flags), Ok(()));
    }

    #[test]
    fn the_definition_is_upstreams_tagging_controller() {
        let definition = definition();
        assert_eq!(definition.name(), TAGGING_CONTROLLER);
        assert_eq!(definition.provider(), Some(PROVIDER_NAME));
        let names: Vec<&str> = definition.declared_flags().iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "tags",
                "resources",
                "tagging-controller-rate-limit",
                "tagging-controller-burst-limit",
                "tagging-controller-concurrent-node-syncs",
                "tagging-controller-enable-batching"
            ]
        );
    }
}
