//! The controller's loop: nodes that need tags gather for [`WINDOW`] and share a request; refusals are
//! retried instance by instance; deleted nodes' instances are untagged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube_ccm_provider::CloudError;
use kube_ccm_runtime::{Backoff, CachedNode, ControllerContext, Written};
use tokio::time::Instant;

use super::{
    GRACE, LABEL, MAX_PER_REQUEST, Refused, TAGGING_CONTROLLER, UNTAG_ATTEMPTS, WINDOW, checksum, needs_tags,
    parse_tags,
};
use crate::AwsProvider;
use crate::instances::instance_id_of;

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
    api: Api<Written<Node>>,
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

pub(super) async fn run(controller: ControllerContext) {
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
            .patch(
                name,
                &kube_ccm_runtime::written::patch_params(),
                &Patch::Merge(patch),
            )
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
                let created = due.node.created().map(|t| t.0);
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
            CloudError::Retry { after, .. } | CloudError::Throttled { after, .. } => {
                self.retry_later(due, Some(*after));
            }
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
            CloudError::Retry { after, .. } | CloudError::Throttled { after, .. } => *after,
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
