//! The orphan sweep's questions (decision 0035): which load balancers, and leftover parts of them, are
//! provably this cluster's, and deleting one whole.
//!
//! Listed, each tagged `kubernetes.io/cluster/<cluster ID>=owned` (or the legacy `KubernetesCluster`):
//! - classic ELBs and NLBs named as this provider (and upstream's) names them, `a` + 31 hex digits (what
//!   the AWS Load Balancer Controller makes is named otherwise, and never listed), with the service of
//!   their `kubernetes.io/service-name` tag; an NLB's target groups and a classic ELB's own security group
//!   `k8s-elb-<name>` as its parts;
//! - a group `k8s-elb-<name>` whose ELB is gone, under `<name>`;
//! - a target group on no load balancer that also names its service: under no name, so kept while that
//!   service exists (its load balancer's name cannot be told from it).
//!
//! Not listed: an NLB's managed security group whose NLB is gone (its name hashes the service's UID), node
//! security-group rules left by a delete cut short.
//!
//! Deleting touches only what was listed and what is provably the load balancer's own: the ELB or NLB by
//! its name, the node groups' rules admitting its own group `k8s-elb-<name>` (never those admitting a
//! shared or annotated group, which other load balancers may use), an NLB's node rules (described with its
//! name), an NLB's groups only when tagged owned for the cluster *and* for the orphan's service, and the
//! target groups listed with it.

use std::collections::BTreeMap;

use kube_ccm_provider::{CloudError, ClusterLoadBalancer, is_default_load_balancer_name};

use crate::{AwsProvider, aws_error};

const SERVICE_TAG: &str = "kubernetes.io/service-name";
/// ELBv2's and ELB's `DescribeTags` take at most this many load balancers or target groups a request.
const TAGS_PER_REQUEST: usize = 20;

const ELB: &str = "elb/";
const NLB: &str = "nlb/";
const GROUP: &str = "security-group/";
const TARGET_GROUP: &str = "target-group/";

/// `describe` (a `DescribeTags`) for each [`TAGS_PER_REQUEST`] of `ids` at once. When a chunk fails (one
/// of them went since the list), its IDs are asked one by one, and those that still fail are left out:
/// listed again next sweep, if still there.
async fn in_chunks<T, F, Fut>(ids: &[String], what: &str, describe: F) -> Vec<T>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<T, CloudError>>,
{
    let mut outputs = Vec::new();
    for chunk in ids.chunks(TAGS_PER_REQUEST) {
        match describe(chunk.to_vec()).await {
            Ok(output) => outputs.push(output),
            Err(error) if chunk.len() > 1 => {
                tracing::debug!(%error, "{what}: asking one by one");
                for id in chunk {
                    outputs.extend(describe(vec![id.clone()]).await.ok());
                }
            }
            Err(error) => tracing::debug!(%error, id = chunk[0], "{what} failed; left out"),
        }
    }
    outputs
}

/// The next page's marker: `None` at the end; a marker repeated is an error, not a loop.
fn next_page(previous: Option<String>, next: Option<&str>) -> Result<Option<String>, CloudError> {
    match next.filter(|m| !m.is_empty()) {
        None => Ok(None),
        Some(next) if previous.as_deref() == Some(next) => Err(CloudError::provider(format!(
            "the cloud answered the page marker {next:?} twice"
        ))),
        Some(next) => Ok(Some(next.to_owned())),
    }
}

/// Adds `part` to the load balancer `name` in `found` (an ELB and an NLB of one name are one entry, so
/// neither is left behind).
fn merge(
    found: &mut BTreeMap<String, ClusterLoadBalancer>,
    name: &str,
    service: Option<String>,
    part: String,
) {
    let entry = found
        .entry(name.to_owned())
        .or_insert_with(|| ClusterLoadBalancer {
            name: name.to_owned(),
            service: None,
            parts: Vec::new(),
        });
    if entry.service.is_none() {
        entry.service = service;
    }
    entry.parts.push(part);
}

/// Tags as [`AwsProvider::tagged_for_cluster`] reads them, and the service tag.
struct Tags(Vec<(Option<String>, Option<String>)>);

impl Tags {
    fn service(&self) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| k.as_deref() == Some(SERVICE_TAG))
            .and_then(|(_, v)| v.clone())
            .filter(|v| v.contains('/'))
    }
}

impl AwsProvider {
    /// Tagged as the cluster's own: `kubernetes.io/cluster/<ID>=owned` (what this provider and upstream's
    /// tag what they make; `shared` marks what the cluster only uses), or the legacy `KubernetesCluster`.
    fn ours(&self, tags: &Tags) -> bool {
        let (key, owned) = self.cluster_tag();
        tags.0.iter().any(|(k, v)| {
            (k.as_deref() == Some(key.as_str()) && v.as_deref() == Some(owned.as_str()))
                || (k.as_deref() == Some("KubernetesCluster")
                    && v.as_deref() == Some(self.config.cluster_id()))
        })
    }

    /// The cluster's load balancers and leftover parts, as the module says.
    pub(super) async fn cluster_load_balancers(&self) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        if self.config.cluster_id().is_empty() {
            // Nothing is provably the cluster's without its ID.
            return Err(CloudError::NotImplemented);
        }
        let mut found: BTreeMap<String, ClusterLoadBalancer> = BTreeMap::new();
        for (name, tags) in self.tagged_elbs().await? {
            if self.ours(&tags) && is_default_load_balancer_name(&name) {
                merge(&mut found, &name, tags.service(), format!("{ELB}{name}"));
            }
        }
        let mut nlbs: BTreeMap<String, String> = BTreeMap::new();
        for (arn, name, tags) in self.tagged_nlbs().await? {
            if self.ours(&tags) && is_default_load_balancer_name(&name) {
                nlbs.insert(arn.clone(), name.clone());
                merge(&mut found, &name, tags.service(), format!("{NLB}{arn}"));
            }
        }
        let mut lone = Vec::new();
        for (arn, load_balancers, tags) in self.tagged_target_groups().await? {
            if !self.ours(&tags) {
                continue;
            }
            match load_balancers.iter().find_map(|lb| nlbs.get(lb)) {
                Some(name) => {
                    if let Some(entry) = found.get_mut(name) {
                        entry.parts.push(format!("{TARGET_GROUP}{arn}"));
                    }
                }
                None if load_balancers.is_empty() && tags.service().is_some() => {
                    lone.push(ClusterLoadBalancer {
                        name: String::new(),
                        service: tags.service(),
                        parts: vec![format!("{TARGET_GROUP}{arn}")],
                    })
                }
                None => {}
            }
        }
        for (id, name, tags) in self.cluster_elb_groups().await? {
            let Some(lb) = name
                .strip_prefix("k8s-elb-")
                .filter(|n| is_default_load_balancer_name(n))
            else {
                continue;
            };
            if !self.ours(&tags) {
                continue;
            }
            merge(&mut found, lb, tags.service(), format!("{GROUP}{id}"));
        }
        Ok(found.into_values().chain(lone).collect())
    }

    /// Deletes every part of `lb` (listed by [`Self::cluster_load_balancers`]): the load balancers first,
    /// then their groups and target groups.
    pub(super) async fn delete_cluster_load_balancer(
        &self,
        lb: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        if !is_default_load_balancer_name(&lb.name) && !lb.name.is_empty() {
            return Err(CloudError::provider(format!(
                "{:?} is not a name this provider gives a load balancer",
                lb.name
            )));
        }
        if lb.parts.iter().any(|p| p.starts_with(NLB)) {
            self.delete_orphaned_nlb(lb).await?;
        }
        if lb.parts.iter().any(|p| p.starts_with(ELB)) && self.describe_elb(&lb.name).await?.is_some() {
            self.elb
                .delete_load_balancer()
                .load_balancer_name(&lb.name)
                .send()
                .await
                .map_err(aws_error)?;
            tracing::info!(name = %lb.name, "deleted a classic ELB no service claims");
        }
        for part in &lb.parts {
            if let Some(id) = part.strip_prefix(GROUP) {
                self.delete_lone_group(id).await?;
            }
            if let Some(arn) = part.strip_prefix(TARGET_GROUP) {
                self.delete_lone_target_group(arn).await?;
            }
        }
        Ok(())
    }

    /// The NLB `lb.name`, its node rules, and its security groups that are provably its own.
    async fn delete_orphaned_nlb(&self, lb: &ClusterLoadBalancer) -> Result<(), CloudError> {
        let Some(nlb) = self.describe_nlb(&lb.name).await? else {
            return Ok(());
        };
        let mut own_groups = Vec::new();
        if !nlb.security_groups().is_empty() && lb.service.is_some() {
            let described = self
                .ec2
                .describe_security_groups()
                .set_group_ids(Some(nlb.security_groups().to_vec()))
                .send()
                .await
                .map_err(aws_error)?;
            for group in described.security_groups() {
                let tags = Tags(
                    group
                        .tags()
                        .iter()
                        .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)))
                        .collect(),
                );
                if self.ours(&tags) && tags.service() == lb.service {
                    own_groups.extend(group.group_id().map(str::to_owned));
                }
            }
        }
        if let Some(vpc) = nlb.vpc_id() {
            let (groups, rules) = (
                std::collections::BTreeSet::new(),
                std::collections::BTreeSet::new(),
            );
            self.nlb_node_rules(vpc, &lb.name, &groups, &rules).await?;
        }
        self.elbv2
            .delete_load_balancer()
            .set_load_balancer_arn(nlb.load_balancer_arn().map(str::to_owned))
            .send()
            .await
            .map_err(aws_error)?;
        tracing::info!(name = %lb.name, "deleted an NLB no service claims");
        for id in &own_groups {
            self.delete_lone_group(id).await?;
        }
        Ok(())
    }

    /// Every classic ELB's name and tags.
    async fn tagged_elbs(&self) -> Result<Vec<(String, Tags)>, CloudError> {
        let mut names = Vec::new();
        let mut marker = None;
        loop {
            let page = self
                .elb
                .describe_load_balancers()
                .set_marker(marker.clone())
                .send()
                .await
                .map_err(aws_error)?;
            names.extend(
                page.load_balancer_descriptions()
                    .iter()
                    .filter_map(|d| d.load_balancer_name().map(str::to_owned)),
            );
            marker = next_page(marker, page.next_marker())?;
            if marker.is_none() {
                break;
            }
        }
        let outputs = in_chunks(&names, "DescribeTags of ELBs", |chunk| async move {
            self.elb
                .describe_tags()
                .set_load_balancer_names(Some(chunk))
                .send()
                .await
                .map_err(aws_error)
        })
        .await;
        let mut tagged = Vec::new();
        for description in outputs.iter().flat_map(|o| o.tag_descriptions()) {
            let Some(name) = description.load_balancer_name() else {
                continue;
            };
            let tags = description
                .tags()
                .iter()
                .map(|t| (Some(t.key().to_owned()), t.value().map(str::to_owned)));
            tagged.push((name.to_owned(), Tags(tags.collect())));
        }
        Ok(tagged)
    }

    /// Every NLB's ARN, name and tags.
    async fn tagged_nlbs(&self) -> Result<Vec<(String, String, Tags)>, CloudError> {
        let mut nlbs = BTreeMap::new();
        let mut marker = None;
        loop {
            let page = self
                .elbv2
                .describe_load_balancers()
                .set_marker(marker.clone())
                .send()
                .await
                .map_err(aws_error)?;
            for lb in page.load_balancers() {
                if let (Some(arn), Some(name)) = (lb.load_balancer_arn(), lb.load_balancer_name()) {
                    nlbs.insert(arn.to_owned(), name.to_owned());
                }
            }
            marker = next_page(marker, page.next_marker())?;
            if marker.is_none() {
                break;
            }
        }
        let arns: Vec<String> = nlbs.keys().cloned().collect();
        let mut tags = self.elbv2_tags(&arns).await?;
        Ok(nlbs
            .into_iter()
            .map(|(arn, name)| {
                let tags = tags.remove(&arn).unwrap_or(Tags(Vec::new()));
                (arn, name, tags)
            })
            .collect())
    }

    /// Every target group's ARN, the load balancers it serves, and its tags.
    async fn tagged_target_groups(&self) -> Result<Vec<(String, Vec<String>, Tags)>, CloudError> {
        let mut groups = BTreeMap::new();
        let mut marker = None;
        loop {
            let page = self
                .elbv2
                .describe_target_groups()
                .set_marker(marker.clone())
                .send()
                .await
                .map_err(aws_error)?;
            for group in page.target_groups() {
                if let Some(arn) = group.target_group_arn() {
                    groups.insert(arn.to_owned(), group.load_balancer_arns().to_vec());
                }
            }
            marker = next_page(marker, page.next_marker())?;
            if marker.is_none() {
                break;
            }
        }
        let arns: Vec<String> = groups.keys().cloned().collect();
        let mut tags = self.elbv2_tags(&arns).await?;
        Ok(groups
            .into_iter()
            .map(|(arn, lbs)| {
                let tags = tags.remove(&arn).unwrap_or(Tags(Vec::new()));
                (arn, lbs, tags)
            })
            .collect())
    }

    /// The tags of ELBv2 resources, by ARN.
    async fn elbv2_tags(&self, arns: &[String]) -> Result<BTreeMap<String, Tags>, CloudError> {
        let outputs = in_chunks(arns, "DescribeTags of ELBv2 resources", |chunk| async move {
            self.elbv2
                .describe_tags()
                .set_resource_arns(Some(chunk))
                .send()
                .await
                .map_err(aws_error)
        })
        .await;
        let mut tagged = BTreeMap::new();
        for description in outputs.iter().flat_map(|o| o.tag_descriptions()) {
            let Some(arn) = description.resource_arn() else {
                continue;
            };
            let tags = description
                .tags()
                .iter()
                .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)));
            tagged.insert(arn.to_owned(), Tags(tags.collect()));
        }
        Ok(tagged)
    }

    /// The security groups called `k8s-elb-…` tagged with the cluster's tag key: ID, name, tags.
    async fn cluster_elb_groups(&self) -> Result<Vec<(String, String, Tags)>, CloudError> {
        let (key, _) = self.cluster_tag();
        let keys = [key, "KubernetesCluster".to_owned()];
        let mut groups = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .ec2
                .describe_security_groups()
                .filters(crate::filter("tag-key", &keys))
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(aws_error)?;
            for group in page.security_groups() {
                let (Some(id), Some(name)) = (group.group_id(), group.group_name()) else {
                    continue;
                };
                if !name.starts_with("k8s-elb-") {
                    continue;
                }
                let tags = group
                    .tags()
                    .iter()
                    .map(|t| (t.key().map(str::to_owned), t.value().map(str::to_owned)));
                groups.push((id.to_owned(), name.to_owned(), Tags(tags.collect())));
            }
            token = next_page(token, page.next_token())?;
            if token.is_none() {
                break;
            }
        }
        Ok(groups)
    }

    /// A classic ELB's group whose ELB is gone: the node groups' rules admitting it revoked, then deleted.
    async fn delete_lone_group(&self, id: &str) -> Result<(), CloudError> {
        let described = self.ec2.describe_security_groups().group_ids(id).send().await;
        let group = match described {
            Ok(output) => output.security_groups().first().cloned(),
            Err(error) if super::classic::ec2_code(&error) == "InvalidGroup.NotFound" => None,
            Err(error) => return Err(aws_error(error)),
        };
        let Some(group) = group else {
            return Ok(());
        };
        if let Some(vpc) = group.vpc_id() {
            self.node_ingress(vpc, id, &std::collections::BTreeSet::new(), false)
                .await?;
        }
        self.delete_group(id).await
    }

    /// A target group on no load balancer.
    async fn delete_lone_target_group(&self, arn: &str) -> Result<(), CloudError> {
        match self
            .elbv2
            .delete_target_group()
            .target_group_arn(arn)
            .send()
            .await
        {
            Ok(_) => {
                tracing::info!(target_group = %arn, "deleted a target group left without its NLB");
                Ok(())
            }
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_resource_in_use_exception()) =>
            {
                Err(CloudError::Retry {
                    after: std::time::Duration::from_secs(5),
                    message: format!("target group {arn} is in use"),
                })
            }
            // Deleted already.
            Err(error)
                if error
                    .as_service_error()
                    .and_then(aws_sdk_elasticloadbalancingv2::error::ProvideErrorMetadata::code)
                    == Some("TargetGroupNotFound") =>
            {
                Ok(())
            }
            Err(error) => Err(aws_error(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elb_and_an_nlb_of_one_name_are_one_entry() {
        let mut found = BTreeMap::new();
        let name = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";
        merge(&mut found, name, None, format!("{ELB}{name}"));
        merge(&mut found, name, Some("shop/web".into()), format!("{NLB}arn"));
        merge(
            &mut found,
            name,
            Some("shop/other".into()),
            format!("{GROUP}sg-1"),
        );
        assert_eq!(found.len(), 1);
        let entry = &found[name];
        assert_eq!(entry.service.as_deref(), Some("shop/web"));
        assert_eq!(
            entry.parts,
            [
                format!("{ELB}{name}"),
                format!("{NLB}arn"),
                format!("{GROUP}sg-1")
            ]
        );
    }
}
