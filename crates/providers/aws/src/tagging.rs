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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::Tag;
use cloud_provider::CloudError;
use controller_manager::{
    Backoff, CachedNode, ControllerContext, ControllerDefinition, ControllerFlag, FlagValue, FlagValues,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use md5::{Digest, Md5};
use tokio::time::Instant;

use crate::instances::instance_id_of;
use crate::{AwsProvider, PROVIDER_NAME, aws_error};

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
pub const FLAGS: &[ControllerFlag] = &[
    ControllerFlag::list(
        "tags",
        "",
        "Tags to apply to AWS resources in the tagging controller, in a form of key=value.",
    )
    .checked(check_tags),
    ControllerFlag::list(
        "resources",
        "",
        "AWS resources name to add/remove tags in the tagging controller (only instance).",
    )
    .checked(check_resources),
    ControllerFlag::value(
        "tagging-controller-rate-limit",
        "0",
        "Accepted for compatibility (must not be negative): requests are batched instead.",
    )
    .checked(not_negative),
    ControllerFlag::value(
        "tagging-controller-burst-limit",
        "0",
        "Accepted for compatibility (must not be negative): requests are batched instead.",
    )
    .checked(whole_not_negative),
    ControllerFlag::value(
        "tagging-controller-concurrent-node-syncs",
        "1",
        "Accepted for compatibility (must be positive): one batch is in flight at a time.",
    )
    .checked(positive),
    ControllerFlag::bool(
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

fn check_tags(value: &FlagValue) -> Result<(), String> {
    parse_tags(value.items()).map(|_| ())
}

fn check_resources(value: &FlagValue) -> Result<(), String> {
    match value.items().iter().find(|r| r.as_str() != INSTANCE) {
        Some(other) => Err(format!(
            "{other} is not a supported resource. Current supported resources [{INSTANCE}]"
        )),
        None => Ok(()),
    }
}

fn not_negative(value: &FlagValue) -> Result<(), String> {
    match value.text().trim().parse::<f64>() {
        Ok(rate) if rate >= 0.0 && rate.is_finite() => Ok(()),
        _ => Err(format!("{:?} must be a number, not less than zero", value.text())),
    }
}

fn whole_not_negative(value: &FlagValue) -> Result<(), String> {
    value
        .text()
        .trim()
        .parse::<u32>()
        .map(|_| ())
        .map_err(|_| format!("{:?} must be a whole number, not less than zero", value.text()))
}

fn positive(value: &FlagValue) -> Result<(), String> {
    match value.text().trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(()),
        _ => Err(format!("{:?} must be a positive number", value.text())),
    }
}

/// Upstream's `Validate`, for an enabled controller.
pub fn required(flags: &FlagValues) -> Result<(), String> {
    if flags.items("tags").is_empty() {
        return Err("--tags must not be empty and must be a form of key=value".to_owned());
    }
    if flags.items("resources").is_empty() {
        return Err("--resources must not be empty".to_owned());
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

/// Why EC2 refused a request for one of its instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// An instance does not exist (or does not yet, for `CreateTags`).
    NotFound,
    /// An ID is not an instance ID.
    Invalid,
}

/// The instance-specific refusal an EC2 error code means, if any.
pub fn refused(code: Option<&str>) -> Option<Refused> {
    match code? {
        "InvalidInstanceID.NotFound" => Some(Refused::NotFound),
        // Moto answers InvalidID where EC2 answers InvalidInstanceID.Malformed.
        "InvalidInstanceID.Malformed" | "InvalidID" => Some(Refused::Invalid),
        _ => None,
    }
}

impl AwsProvider {
    /// `CreateTags` (`delete`: `DeleteTags`, for the same keys and values) on the instances `ids`.
    async fn tag_instances(
        &self,
        ids: &[&str],
        tags: &BTreeMap<String, String>,
        delete: bool,
    ) -> Result<Result<(), Refused>, CloudError> {
        let resources: Vec<String> = ids.iter().map(|&id| id.to_owned()).collect();
        let tags: Vec<Tag> = tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        if delete {
            let sent = self
                .ec2
                .delete_tags()
                .set_resources(Some(resources))
                .set_tags(Some(tags))
                .send()
                .await;
            answer(sent.map(drop))
        } else {
            let sent = self
                .ec2
                .create_tags()
                .set_resources(Some(resources))
                .set_tags(Some(tags))
                .send()
                .await;
            answer(sent.map(drop))
        }
    }
}

/// A tags request's outcome: done, refused for an instance, or failed.
fn answer<E, R>(sent: Result<(), SdkError<E, R>>) -> Result<Result<(), Refused>, CloudError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match sent {
        Ok(()) => Ok(Ok(())),
        Err(error) => match refused(error.code()) {
            Some(refusal) => Ok(Err(refusal)),
            None => Err(aws_error(error)),
        },
    }
}

/// A node that needs its instance tagged.
struct Due {
    node: Arc<CachedNode>,
    instance: String,
}

/// A deleted node's instance to untag.
struct Untag {
    node: String,
    attempts: u32,
    due: Instant,
}

struct Tagger {
    controller: ControllerContext,
    provider: Arc<AwsProvider>,
    api: Api<Node>,
    tags: BTreeMap<String, String>,
    checksum: String,
    backoff: Backoff,
    /// Nodes (by uid) not to try before then.
    retry_at: HashMap<String, Instant>,
    /// Nodes (by uid) whose provider ID EC2 refused as no instance ID: never tagged.
    invalid: HashSet<String>,
    /// Nodes (by uid) labelled, with the resource version the cache had then: until the cache shows a
    /// newer one, they are not tagged again.
    labelled: HashMap<String, String>,
    /// Instances to untag, by ID.
    untag: BTreeMap<String, Untag>,
}

async fn run(controller: ControllerContext) {
    let Some(provider) = controller.provider_as::<AwsProvider>() else {
        tracing::error!(
            controller = TAGGING_CONTROLLER,
            "the cloud provider is not aws; the controller does nothing"
        );
        return;
    };
    let tags = match parse_tags(controller.settings().flags.items("tags")) {
        Ok(tags) if !tags.is_empty() => tags,
        Ok(_) | Err(_) => {
            tracing::error!(
                controller = TAGGING_CONTROLLER,
                "--tags is empty or invalid; the controller does nothing"
            );
            return;
        }
    };
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = informer.ready() => {}
    }
    let checksum = checksum(&tags);
    tracing::info!(controller = TAGGING_CONTROLLER, ?tags, %checksum, "tagging the nodes' instances");
    let mut tagger = Tagger {
        api: Api::all(controller.client().clone()),
        provider,
        tags,
        checksum: checksum.clone(),
        backoff: Backoff::per_key(Duration::from_secs(1), Duration::from_secs(300)),
        retry_at: HashMap::new(),
        invalid: HashSet::new(),
        labelled: HashMap::new(),
        untag: BTreeMap::new(),
        controller: controller.clone(),
    };
    let changes = informer
        .subscribe()
        .filter(move |node| std::future::ready(needs_tags(node, &checksum)));
    let mut changes = std::pin::pin!(changes);
    let mut deletions = std::pin::pin!(informer.deletions());
    let stop = controller.stop().clone();
    controller.set_started();
    loop {
        tagger.sweep().await;
        let next = tagger.next_due();
        tokio::select! {
            () = stop.cancelled() => return,
            Some(_) = changes.next() => {}
            Some(node) = deletions.next() => tagger.deleted(&node),
            () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
        }
        // More work arriving within the window joins the batch.
        let send_at = Instant::now() + WINDOW;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(send_at) => break,
                Some(node) = deletions.next() => tagger.deleted(&node),
                Some(_) = changes.next() => {}
            }
        }
    }
}

/// Whether `node`'s instance needs the tags whose checksum is `checksum`.
pub fn needs_tags(node: &CachedNode, checksum: &str) -> bool {
    !node.deleting() && node.label(LABEL) != Some(checksum)
}

impl Tagger {
    /// `CreateTags` (`delete`: `DeleteTags`) for `ids`, through the controller's call context (its
    /// deadline ends with the lock), reported as a cloud API request.
    async fn send(&self, ids: &[&str], delete: bool) -> Result<Result<(), Refused>, CloudError> {
        let request = if delete { "DeleteTags" } else { "CreateTags" };
        let cx = self.controller.call_context();
        cx.call(request, self.provider.tag_instances(ids, &self.tags, delete))
            .await
    }

    /// Tags what needs tags and is due, then untags what is due.
    async fn sweep(&mut self) {
        let _working = self.controller.working();
        let now = Instant::now();
        let mut due = Vec::new();
        let nodes = self.controller.nodes().store().state();
        let present: HashSet<&str> = nodes.iter().map(|n| n.uid()).collect();
        // Whatever left the cache without a deletion seen (a relist) is forgotten.
        self.retry_at.retain(|uid, _| present.contains(uid.as_str()));
        self.labelled.retain(|uid, _| present.contains(uid.as_str()));
        self.invalid.retain(|uid| present.contains(uid.as_str()));
        drop(present);
        for node in nodes {
            let uid = node.uid();
            if !needs_tags(&node, &self.checksum) {
                self.labelled.remove(uid);
                self.retry_at.remove(uid);
                continue;
            }
            let waiting = self.retry_at.get(uid).is_some_and(|at| *at > now);
            let catching_up = self
                .labelled
                .get(uid)
                .is_some_and(|version| node.resource_version() == Some(version.as_str()));
            if waiting || catching_up || self.invalid.contains(uid) {
                continue;
            }
            let Some(instance) = node.provider_id().and_then(instance_id_of) else {
                continue;
            };
            let instance = instance.to_owned();
            due.push(Due { node, instance });
        }
        for batch in due.chunks(MAX_PER_REQUEST) {
            if self.controller.stop().is_cancelled() {
                return;
            }
            self.tag(batch).await;
        }
        let untag: Vec<String> = self
            .untag
            .iter()
            .filter(|(_, u)| u.due <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for batch in untag.chunks(MAX_PER_REQUEST) {
            if self.controller.stop().is_cancelled() {
                return;
            }
            self.untag_batch(batch).await;
        }
    }

    /// One `CreateTags` for `batch`; when EC2 refuses it for an instance, one per instance.
    async fn tag(&mut self, batch: &[Due]) {
        let started = std::time::Instant::now();
        let ids: Vec<&str> = batch.iter().map(|d| d.instance.as_str()).collect();
        let outcome = self.send(&ids, false).await;
        let ok = matches!(outcome, Ok(Ok(())));
        match outcome {
            Ok(Ok(())) => {
                for due in batch {
                    self.label(due).await;
                }
            }
            Ok(Err(_)) if batch.len() > 1 => {
                tracing::info!(
                    instances = batch.len(),
                    "EC2 refused the batch for one of its instances; tagging them one by one"
                );
                for due in batch {
                    match self.send(&[due.instance.as_str()], false).await {
                        Ok(Ok(())) => self.label(due).await,
                        Ok(Err(refusal)) => self.refused(due, refusal),
                        Err(error) => self.failed(due, &error),
                    }
                }
            }
            Ok(Err(refusal)) => self.refused(&batch[0], refusal),
            Err(error) => {
                for due in batch {
                    self.failed(due, &error);
                }
            }
        }
        self.controller.record_reconcile(ok, started.elapsed());
    }

    /// Labels a node whose instance has the tags.
    async fn label(&mut self, due: &Due) {
        let name = due.node.name();
        let patch = serde_json::json!({"metadata": {"labels": {LABEL: self.checksum}}});
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = name, instance = %due.instance, tags = ?self.tags, "tagged the node's instance and labelled the node");
                let uid = due.node.uid();
                self.backoff.forget(uid);
                self.retry_at.remove(uid);
                if let Some(version) = due.node.resource_version() {
                    self.labelled.insert(uid.to_owned(), version.to_owned());
                }
            }
            Err(error) => {
                tracing::warn!(node = name, %error, "cannot label the node; it is tagged again later");
                self.retry_later(due, None);
            }
        }
    }

    fn refused(&mut self, due: &Due, refusal: Refused) {
        let name = due.node.name();
        match refusal {
            Refused::Invalid => {
                tracing::info!(node = name, instance = %due.instance, "skip tagging: EC2 says the node's instance ID is invalid");
                self.invalid.insert(due.node.uid().to_owned());
            }
            Refused::NotFound => {
                let created = due.node.meta().creation_timestamp.as_ref().map(|t| t.0);
                let age = created.map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t));
                if age.is_some_and(|age| age.as_secs() < GRACE.as_secs() as i64) {
                    tracing::info!(node = name, instance = %due.instance, "the node's instance does not exist yet (EC2 is eventually consistent); retrying");
                    self.retry_later(due, None);
                } else {
                    tracing::info!(node = name, instance = %due.instance, "skip tagging: the node's instance does not exist; trying again in 5 minutes");
                    self.retry_later(due, Some(GRACE));
                }
            }
        }
    }

    fn failed(&mut self, due: &Due, error: &CloudError) {
        match error {
            CloudError::Cancelled => {}
            CloudError::Retry { after, .. } => self.retry_later(due, Some(*after)),
            error => {
                tracing::warn!(node = due.node.name(), instance = %due.instance, %error, "cannot tag the node's instance");
                self.retry_later(due, None);
            }
        }
    }

    /// The node is tried again after `after`, or its back-off.
    fn retry_later(&mut self, due: &Due, after: Option<Duration>) {
        let uid = due.node.uid();
        let after = after.unwrap_or_else(|| self.backoff.failed(uid));
        self.retry_at.insert(uid.to_owned(), Instant::now() + after);
    }

    /// A node is gone: its instance is untagged.
    fn deleted(&mut self, node: &CachedNode) {
        let uid = node.uid();
        self.backoff.forget(uid);
        self.retry_at.remove(uid);
        self.invalid.remove(uid);
        self.labelled.remove(uid);
        if let Some(instance) = node.provider_id().and_then(instance_id_of) {
            self.untag.insert(
                instance.to_owned(),
                Untag {
                    node: node.name().to_owned(),
                    attempts: 0,
                    due: Instant::now(),
                },
            );
        }
    }

    /// One `DeleteTags` for `batch`; when EC2 refuses it for an instance, one per instance.
    async fn untag_batch(&mut self, batch: &[String]) {
        let ids: Vec<&str> = batch.iter().map(String::as_str).collect();
        match self.send(&ids, true).await {
            Ok(Ok(())) => {
                for id in batch {
                    self.untagged(id);
                }
            }
            Ok(Err(_)) if batch.len() > 1 => {
                for id in batch {
                    match self.send(&[id.as_str()], true).await {
                        Ok(Ok(())) => self.untagged(id),
                        Ok(Err(refusal)) => self.untag_refused(id, refusal),
                        Err(error) => self.untag_failed(id, &error),
                    }
                }
            }
            Ok(Err(refusal)) => self.untag_refused(&batch[0], refusal),
            Err(error) => {
                for id in batch {
                    self.untag_failed(id, &error);
                }
            }
        }
    }

    fn untagged(&mut self, id: &str) {
        if let Some(untag) = self.untag.remove(id) {
            tracing::info!(node = %untag.node, instance = id, tags = ?self.tags, "untagged the deleted node's instance");
        }
    }

    fn untag_refused(&mut self, id: &str, refusal: Refused) {
        if let Some(untag) = self.untag.remove(id) {
            tracing::info!(node = %untag.node, instance = id, ?refusal, "skip untagging: the deleted node's instance does not exist");
        }
    }

    fn untag_failed(&mut self, id: &str, error: &CloudError) {
        let Some(untag) = self.untag.get_mut(id) else {
            return;
        };
        let after = match error {
            CloudError::Cancelled => return,
            CloudError::Retry { after, .. } => *after,
            _ => {
                untag.attempts += 1;
                Duration::from_secs(1) * 2_u32.pow(untag.attempts.min(8))
            }
        };
        if untag.attempts >= UNTAG_ATTEMPTS {
            tracing::error!(node = %untag.node, instance = id, %error, "cannot untag the deleted node's instance; giving up");
            self.untag.remove(id);
            return;
        }
        tracing::warn!(node = %untag.node, instance = id, %error, retry_in = ?after, "cannot untag the deleted node's instance");
        untag.due = Instant::now() + after;
    }

    /// When the next retry is due, if any is still to come.
    fn next_due(&self) -> Option<Instant> {
        let now = Instant::now();
        self.retry_at
            .values()
            .chain(self.untag.values().map(|u| &u.due))
            .filter(|at| **at > now)
            .min()
            .copied()
    }
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
            check_resources(&FlagValue::List(items(&["instance", "volume"]))).unwrap_err(),
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
                .starts_with("--tags must not be empty")
        );
        flags.insert("tags", FlagValue::List(items(&["a=b"])));
        assert_eq!(required(&flags).unwrap_err(), "--resources must not be empty");
        flags.insert("resources", FlagValue::List(items(&["instance"])));
        assert_eq!(required(&flags), Ok(()));
    }

    #[test]
    fn instance_refusals_are_told_from_other_errors() {
        assert_eq!(
            refused(Some("InvalidInstanceID.NotFound")),
            Some(Refused::NotFound)
        );
        assert_eq!(
            refused(Some("InvalidInstanceID.Malformed")),
            Some(Refused::Invalid)
        );
        assert_eq!(refused(Some("RequestLimitExceeded")), None);
        assert_eq!(refused(None), None);
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
