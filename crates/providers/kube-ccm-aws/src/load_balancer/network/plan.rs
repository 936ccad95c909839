//! What an NLB's ensure changes, decided from what ELBv2 holds (as described) and what the service asks
//! ([`super::wanted`]): pure, no AWS call, so each decision is tested alone. The ensure runs in stages,
//! because a later decision needs what an earlier request found or made (the NLB's ARN, each target
//! group's): the NLB and its security groups ([`nlb`]); per mapping, in order, its target group
//! ([`target_group`]), the group's targets ([`targets`]) and its listener ([`listener`]); the NLB's
//! attributes ([`attribute_changes`]); last, what no mapping wants any more ([`removals`]). The module
//! above performs each plan with its requests.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::types::{
    Listener, LoadBalancer as Nlb, LoadBalancerSchemeEnum, ProtocolEnum, TargetGroup,
};
use kube_ccm_provider::CloudError;

use super::security_group::NlbGroups;
use super::wanted::same_listener;
use super::{Health, Mapping, NlbAttributes};

/// What becomes of the NLB and of the security groups around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NlbPlan {
    /// The NLB's own step.
    pub(super) step: NlbStep,
    /// The groups the NLB leaves: released after the listeners, as upstream (best effort).
    pub(super) detached: Vec<String>,
    /// The managed group, whose ingress is made the listener ports.
    pub(super) managed: Option<String>,
    /// Groups of the service's own replaced the managed one: it is looked for by name and released, so a
    /// group that a failed clean-up left goes at a later ensure.
    pub(super) release_unused_managed: bool,
}

/// The NLB's own step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NlbStep {
    /// There is none: it is made, with the groups (if any).
    Create,
    /// It is as wanted (its subnets and addresses are only chosen when it is made).
    Keep,
    /// Its groups are not the wanted ones: they are set.
    SetGroups {
        /// The NLB's ARN.
        lb: String,
        /// The groups it is to have.
        groups: Vec<String>,
    },
}

/// What becomes of a mapping's target group, looked up by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TargetGroupStep {
    /// None has the name: it is made.
    Create,
    /// The group (its ARN) is as wanted.
    Keep(String),
    /// The group (its ARN) has another health-check port, path or thresholds: they are modified.
    Modify(String),
}

/// What becomes of a mapping's listener, once its target group is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ListenerStep {
    /// The mapping's port has no listener: one is made.
    Create,
    /// The listener forwards to the group and is the mapping's.
    Keep,
    /// The listener differs: it is made the mapping's, forwarding to the group.
    Modify {
        /// The listener's ARN.
        listener: String,
        /// The group it forwarded to: deleted at the end, unless a mapping keeps it.
        retired: Option<String>,
    },
}

/// The instances to register in a target group and to deregister from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct TargetChanges {
    /// Wanted, not registered.
    pub(super) register: Vec<String>,
    /// Registered, not wanted.
    pub(super) deregister: Vec<String>,
}

/// What goes once every mapping has its listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Removals {
    /// The listeners (ARNs) of ports no mapping has.
    pub(super) listeners: Vec<String>,
    /// The target groups (ARNs) that listeners forwarded to before they were modified or deleted, and
    /// that no mapping keeps.
    pub(super) target_groups: Vec<String>,
}

/// The NLB `name`'s plan: made when there is none (`existing`); else refused when its scheme is not
/// `internal`'s (ELBv2 cannot change it), and given `groups` when they differ from its own (none wanted:
/// its own are left as they are).
pub(super) fn nlb(
    name: &str,
    internal: bool,
    existing: Option<&Nlb>,
    groups: &NlbGroups,
) -> Result<NlbPlan, CloudError> {
    let mut plan = NlbPlan {
        step: NlbStep::Create,
        detached: Vec::new(),
        managed: groups.managed.clone(),
        release_unused_managed: groups.managed.is_none() && !groups.ids.is_empty(),
    };
    let Some(lb) = existing else {
        return Ok(plan);
    };
    let is_internal = lb.scheme() == Some(&LoadBalancerSchemeEnum::Internal);
    if is_internal != internal {
        return Err(CloudError::provider(format!(
            "NLB {name}'s scheme cannot change; recreate the service to change {}internal",
            if internal { "to " } else { "from " }
        )));
    }
    let have: BTreeSet<&String> = lb.security_groups().iter().collect();
    if !groups.ids.is_empty() && have != groups.ids.iter().collect() {
        plan.step = NlbStep::SetGroups {
            lb: lb.load_balancer_arn().unwrap_or_default().to_owned(),
            groups: groups.ids.clone(),
        };
        plan.detached = lb
            .security_groups()
            .iter()
            .filter(|g| !groups.ids.contains(g))
            .cloned()
            .collect();
    } else {
        plan.step = NlbStep::Keep;
    }
    Ok(plan)
}

/// The step for the target group `found` under the mapping's name, as upstream's `ensureTargetGroup`:
/// its health check's port, path (not for TCP) and thresholds are compared; its protocol and interval
/// are in its name, so a group that differs in them is not found, and another is made.
pub(super) fn target_group(found: Option<&TargetGroup>, health: &Health) -> TargetGroupStep {
    let Some(group) = found else {
        return TargetGroupStep::Create;
    };
    let arn = group.target_group_arn().unwrap_or_default().to_owned();
    let path_differs =
        health.protocol != ProtocolEnum::Tcp && group.health_check_path() != health.path.as_deref();
    let differs = group.health_check_port() != Some(health.port.as_str())
        || group.healthy_threshold_count() != Some(health.healthy)
        || group.unhealthy_threshold_count() != Some(health.unhealthy)
        || path_differs;
    if differs {
        TargetGroupStep::Modify(arn)
    } else {
        TargetGroupStep::Keep(arn)
    }
}

/// The changes that make a target group's instances (`have`) exactly `wanted`, each in ID order.
pub(super) fn targets(have: &BTreeSet<String>, wanted: &BTreeSet<String>) -> TargetChanges {
    TargetChanges {
        register: wanted.difference(have).cloned().collect(),
        deregister: have.difference(wanted).cloned().collect(),
    }
}

/// The target group a listener forwards to.
fn forwarded(listener: &Listener) -> Option<String> {
    listener
        .default_actions()
        .iter()
        .find_map(|a| a.target_group_arn().map(str::to_owned))
}

/// The step for `mapping`'s listener among the NLB's `listeners` (as described before any change), its
/// target group being `group`: the one on its port is kept when it forwards to `group` and is the
/// mapping's ([`same_listener`]), else modified.
pub(super) fn listener(listeners: &[Listener], mapping: &Mapping, group: &str) -> ListenerStep {
    match listeners.iter().find(|l| l.port() == Some(mapping.port)) {
        Some(listener)
            if forwarded(listener).as_deref() == Some(group) && same_listener(listener, mapping) =>
        {
            ListenerStep::Keep
        }
        Some(listener) => ListenerStep::Modify {
            listener: listener.listener_arn().unwrap_or_default().to_owned(),
            retired: forwarded(listener),
        },
        None => ListenerStep::Create,
    }
}

/// The NLB's attributes to set: those of `wanted` whose value the NLB's (`have`, as ELBv2 describes
/// them; a missing one counts as empty) differs from.
pub(super) fn attribute_changes(
    have: &BTreeMap<&str, &str>,
    wanted: &NlbAttributes,
) -> Vec<(&'static str, String)> {
    wanted
        .pairs()
        .into_iter()
        .filter(|(key, value)| have.get(key).copied().unwrap_or_default() != value)
        .collect()
}

/// What goes after the mappings are done: the listeners (of `listeners`, as described before any change)
/// on ports no mapping has, and the groups they or modified listeners forwarded to (`retired`) that no
/// mapping keeps (`kept`), each group once, in ARN order.
pub(super) fn removals(
    listeners: &[Listener],
    mappings: &[Mapping],
    retired: &BTreeSet<String>,
    kept: &BTreeSet<String>,
) -> Removals {
    let mut retired = retired.clone();
    let mut removals = Removals::default();
    for listener in listeners
        .iter()
        .filter(|l| !mappings.iter().any(|m| Some(m.port) == l.port()))
    {
        removals
            .listeners
            .push(listener.listener_arn().unwrap_or_default().to_owned());
        retired.extend(forwarded(listener));
    }
    removals.target_groups = retired.difference(kept).cloned().collect();
    removals
}

#[cfg(test)]
mod tests;
