//! The cloud itself: instances, load balancers, routes, and the knobs.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::model::{CloudWrite, FakeInstance, FakeLoadBalancer, FakeRoute, InstanceState, Knobs};
use crate::protocol::{AdminRequest, CloudRequest, CloudResponse, HostSet, NodeRef};

#[derive(Debug, Default)]
struct State {
    instances: BTreeMap<String, FakeInstance>,
    /// The names of the instances by provider ID, so that a look-up by provider ID is no scan of every
    /// instance (a describe of a 100k-node cluster would be 10¹⁰ comparisons).
    by_provider_id: HashMap<String, BTreeSet<String>>,
    load_balancers: BTreeMap<String, FakeLoadBalancer>,
    routes: BTreeMap<String, FakeRoute>,
    knobs: Knobs,
    calls: u64,
    calls_by_kind: BTreeMap<String, u64>,
    /// Calls being answered now, and the most there have been at once, by kind.
    in_flight: BTreeMap<&'static str, u64>,
    peak_in_flight: BTreeMap<String, u64>,
    writes: Vec<CloudWrite>,
    next_ip: u32,
    unreachable_zones: std::collections::BTreeSet<String>,
    rate_limit: Option<RateLimit>,
    throttled: u64,
    blind: bool,
}

/// A cloud's API rate limit, as the fake cloud keeps one and the other clouds' test doubles (the Compute
/// double, the proxy in front of moto) too: a bucket of one second's calls, refilled continuously; a call
/// finding it empty is refused. It reads tokio's clock, so paused time drives it in tests.
#[derive(Debug, Clone, Copy)]
pub struct RateLimit {
    per_second: f64,
    tokens: f64,
    refilled: tokio::time::Instant,
}

impl RateLimit {
    /// A full bucket of `per_second` calls (at least one).
    pub fn new(per_second: f64) -> RateLimit {
        RateLimit {
            per_second,
            tokens: per_second.max(1.0),
            refilled: tokio::time::Instant::now(),
        }
    }

    /// Takes a token for one call; false when there is none (the call is throttled).
    pub fn admit(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let added = now.duration_since(self.refilled).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + added).min(self.per_second.max(1.0));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The cloud. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct FakeCloud {
    state: Arc<Mutex<State>>,
}

impl FakeCloud {
    /// A cloud with these instances and knobs.
    pub fn new(instances: Vec<FakeInstance>, knobs: Knobs) -> FakeCloud {
        let mut state = State {
            knobs,
            ..State::default()
        };
        for instance in instances {
            state.put(instance);
        }
        FakeCloud {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Handles one anonymous call (see [`FakeCloud::handle_as`]).
    pub async fn handle(&self, request: CloudRequest) -> CloudResponse {
        self.handle_as(request, "").await
    }

    /// Handles one call from `caller` (a `User-Agent`): waits the configured latency, fails or hangs at the
    /// configured rates, then applies and answers; a change is logged with its caller when applied. A call
    /// dropped before then (its caller gave up) changes nothing.
    pub async fn handle_as(&self, request: CloudRequest, caller: &str) -> CloudResponse {
        if let CloudRequest::Admin(admin) = request {
            return self.admin(admin);
        }
        let knobs = {
            let mut state = self.state.lock();
            state.calls += 1;
            *state.calls_by_kind.entry(request.kind().to_owned()).or_insert(0) += 1;
            if state.rate_limit.as_mut().is_some_and(|limit| !limit.admit()) {
                state.throttled += 1;
                return CloudResponse::Error {
                    message: "rate limit exceeded".into(),
                    not_found: false,
                    throttled: true,
                };
            }
            let kind = request.kind();
            let now = state.in_flight.entry(kind).or_insert(0);
            *now += 1;
            let now = *now;
            let peak = state.peak_in_flight.entry(kind.to_owned()).or_insert(0);
            *peak = (*peak).max(now);
            state.knobs
        };
        let _in_flight = InFlight {
            state: &self.state,
            kind: request.kind(),
        };
        if let Some(injected) = injected(knobs).await {
            return injected;
        }
        let lost = request.mutated_object().is_some()
            && knobs.lost_answer_rate > 0.0
            && rand::random::<f64>() < knobs.lost_answer_rate;
        let answer = self.apply(request, caller);
        if lost {
            // Applied, and the answer held until the caller gives up (an hour bounds one that never does):
            // the caller cannot tell this from a call that never reached the cloud.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return CloudResponse::Error {
                message: "injected lost answer".into(),
                not_found: false,
                throttled: false,
            };
        }
        answer
    }

    /// Applies one call (not an admin request) and answers it.
    fn apply(&self, request: CloudRequest, caller: &str) -> CloudResponse {
        let mut state = self.state.lock();
        record(&mut state, &request, caller);
        match request {
            CloudRequest::DescribeInstances { nodes } => describe(&state, &nodes),
            CloudRequest::GetLoadBalancer { name } => CloudResponse::LoadBalancer {
                load_balancer: state.load_balancers.get(&name).cloned(),
            },
            CloudRequest::EnsureLoadBalancer {
                name,
                service,
                cluster,
                ports,
                nodes,
                ipv6,
            } => ensure(
                &mut state,
                Wanted {
                    name,
                    service,
                    cluster,
                    ports,
                    nodes,
                    ipv6,
                },
            ),
            CloudRequest::ListLoadBalancers { cluster } => CloudResponse::LoadBalancers {
                load_balancers: state
                    .load_balancers
                    .values()
                    .filter(|lb| !lb.cluster.is_empty() && lb.cluster == cluster)
                    .cloned()
                    .collect(),
            },
            CloudRequest::UpdateLoadBalancer { name, mut nodes } => match state.load_balancers.get_mut(&name)
            {
                Some(load_balancer) => {
                    nodes.sort();
                    load_balancer.nodes = nodes;
                    CloudResponse::Done
                }
                None => CloudResponse::Error {
                    message: format!("load balancer {name} not found"),
                    not_found: true,
                    throttled: false,
                },
            },
            CloudRequest::DeleteLoadBalancer { name } => {
                state.load_balancers.remove(&name);
                CloudResponse::Done
            }
            CloudRequest::ListRoutes => CloudResponse::Routes {
                routes: state.routes.values().cloned().collect(),
            },
            CloudRequest::CreateRoute {
                name,
                target_node,
                destination_cidr,
                target_node_addresses,
            } => {
                let route = FakeRoute {
                    name: name.clone(),
                    target_node,
                    destination_cidr,
                    target_node_addresses,
                };
                state.routes.insert(name, route);
                CloudResponse::Done
            }
            CloudRequest::DeleteRoute { name } => {
                state.routes.remove(&name);
                CloudResponse::Done
            }
            CloudRequest::Admin(_) => unreachable!("handled above"),
        }
    }

    fn admin(&self, request: AdminRequest) -> CloudResponse {
        let mut state = self.state.lock();
        match request {
            AdminRequest::PutInstance(instance) => {
                state.put(instance);
                CloudResponse::Done
            }
            AdminRequest::SetInstanceState { name, state: power } => match state.instances.get_mut(&name) {
                Some(instance) => {
                    instance.state = power;
                    CloudResponse::Done
                }
                None => CloudResponse::Error {
                    message: format!("instance {name} not found"),
                    not_found: true,
                    throttled: false,
                },
            },
            AdminRequest::SetRateLimit { per_second } => {
                state.rate_limit = (per_second > 0.0).then(|| RateLimit::new(per_second));
                CloudResponse::Done
            }
            AdminRequest::PutLoadBalancer(load_balancer) => {
                state
                    .load_balancers
                    .insert(load_balancer.name.clone(), load_balancer);
                CloudResponse::Done
            }
            AdminRequest::SetBlind { blind } => {
                state.blind = blind;
                CloudResponse::Done
            }
            AdminRequest::SetKnobs(knobs) => {
                state.knobs = knobs;
                CloudResponse::Done
            }
            AdminRequest::SetZoneReachable { zone, reachable } => {
                if reachable {
                    state.unreachable_zones.remove(&zone);
                } else {
                    state.unreachable_zones.insert(zone);
                }
                CloudResponse::Done
            }
            AdminRequest::PutRoute(route) => {
                state.routes.insert(route.name.clone(), route);
                CloudResponse::Done
            }
            AdminRequest::Snapshot => CloudResponse::Snapshot {
                instances: state.instances.values().cloned().collect(),
                load_balancers: state.load_balancers.values().cloned().collect(),
                routes: state.routes.values().cloned().collect(),
                calls: state.calls,
                calls_by_kind: state.calls_by_kind.clone(),
                throttled: state.throttled,
                peak_in_flight: state.peak_in_flight.clone(),
            },
            AdminRequest::HostSets => {
                let mut sets: HashMap<&[String], usize> = HashMap::new();
                for load_balancer in state.load_balancers.values() {
                    *sets.entry(&load_balancer.nodes).or_default() += 1;
                }
                let mut sets: Vec<HostSet> = sets
                    .into_iter()
                    .map(|(nodes, load_balancers)| HostSet {
                        nodes: nodes.to_vec(),
                        load_balancers,
                    })
                    .collect();
                sets.sort_by(|a, b| {
                    b.load_balancers
                        .cmp(&a.load_balancers)
                        .then_with(|| a.nodes.cmp(&b.nodes))
                });
                CloudResponse::HostSets {
                    sets,
                    calls_by_kind: state.calls_by_kind.clone(),
                    writes: state.writes.len(),
                }
            }
            AdminRequest::Writes { from } => CloudResponse::Writes {
                writes: state.writes.get(from..).unwrap_or_default().to_vec(),
            },
        }
    }
}

/// A call being answered: counted in flight until answered or dropped (its caller gave up).
struct InFlight<'a> {
    state: &'a Mutex<State>,
    kind: &'static str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(now) = self.state.lock().in_flight.get_mut(self.kind) {
            *now = now.saturating_sub(1);
        }
    }
}

impl State {
    /// Adds `instance`, or replaces the one of its name.
    fn put(&mut self, instance: FakeInstance) {
        if let Some(before) = self.instances.get(&instance.name) {
            let provider_id = before.provider_id();
            if let Some(names) = self.by_provider_id.get_mut(&provider_id) {
                names.remove(&instance.name);
                if names.is_empty() {
                    self.by_provider_id.remove(&provider_id);
                }
            }
        }
        self.by_provider_id
            .entry(instance.provider_id())
            .or_default()
            .insert(instance.name.clone());
        self.instances.insert(instance.name.clone(), instance);
    }
}

/// The instance `node` names: by its provider ID when it has one (the first by name, should two
/// instances share one), else by its name.
fn find<'s>(state: &'s State, node: &NodeRef) -> Option<&'s FakeInstance> {
    if let Some(provider_id) = node.provider_id.as_deref().filter(|p| !p.is_empty()) {
        let name = state.by_provider_id.get(provider_id)?.first()?;
        return state.instances.get(name);
    }
    state.instances.get(&node.name)
}

/// What the knobs do to a call before it reaches the cloud: the latency, then an injected failure or hang.
async fn injected(knobs: Knobs) -> Option<CloudResponse> {
    if knobs.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(knobs.latency_ms)).await;
    }
    if knobs.error_rate > 0.0 && rand::random::<f64>() < knobs.error_rate {
        return Some(CloudResponse::Error {
            message: "injected fake cloud error".into(),
            not_found: false,
            throttled: false,
        });
    }
    if knobs.hang_rate > 0.0 && rand::random::<f64>() < knobs.hang_rate {
        // Held until the caller gives up (the future is dropped); an hour bounds a caller that never does.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return Some(CloudResponse::Error {
            message: "injected fake cloud hang".into(),
            not_found: false,
            throttled: false,
        });
    }
    None
}

/// Logs the change `request` makes, with its caller. An ensure of a load balancer already as asked changes
/// nothing: the cloud's declarative upsert, answered without a change to log (so a provider need not read
/// before it ensures).
fn record(state: &mut State, request: &CloudRequest, caller: &str) {
    let unchanged = match request {
        CloudRequest::EnsureLoadBalancer {
            name,
            service,
            cluster,
            ports,
            nodes,
            ipv6,
        } => state.load_balancers.get(name).is_some_and(|lb| {
            let mut sorted = nodes.clone();
            sorted.sort();
            &lb.service == service
                && &lb.cluster == cluster
                && &lb.ports == ports
                && lb.nodes == sorted
                && lb.ipv6.is_some() == *ipv6
        }),
        _ => false,
    };
    if let Some(object) = request.mutated_object().filter(|_| !unchanged) {
        let time_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let write = CloudWrite {
            time_us,
            call: request.kind().to_owned(),
            object: object.to_owned(),
            caller: caller.to_owned(),
        };
        state.writes.push(write);
    }
}

/// The instances of `nodes`, in order; an instance the cloud cannot tell about (found in a zone it cannot
/// reach, or not found while some zone is unreachable) is listed as unknown.
fn describe(state: &State, nodes: &[NodeRef]) -> CloudResponse {
    let mut unknown = Vec::new();
    let instances = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let found = find(state, node).filter(|_| !state.blind);
            let reachable = match found {
                Some(instance) => !state.unreachable_zones.contains(&instance.zone),
                None => state.unreachable_zones.is_empty(),
            };
            if !reachable {
                unknown.push(index);
                return None;
            }
            found.filter(|i| i.state != InstanceState::Terminated).cloned()
        })
        .collect();
    CloudResponse::Instances { instances, unknown }
}

/// Makes or updates a load balancer; an existing one keeps its address.
/// What an ensure asks for.
struct Wanted {
    name: String,
    service: String,
    cluster: String,
    ports: Vec<i32>,
    nodes: Vec<String>,
    ipv6: bool,
}

fn ensure(state: &mut State, wanted: Wanted) -> CloudResponse {
    let Wanted {
        name,
        service,
        cluster,
        ports,
        mut nodes,
        ipv6,
    } = wanted;
    nodes.sort();
    let existing = state.load_balancers.get(&name);
    let kept_ipv6 = existing.and_then(|lb| lb.ipv6.clone());
    let ip = match existing {
        Some(existing) => existing.ip.clone(),
        None => {
            state.next_ip += 1;
            let n = state.next_ip;
            format!("203.0.{}.{}", (n >> 8) & 0xff, n & 0xff)
        }
    };
    // An IPv6 address is kept while the load balancer serves IPv6, and made when it starts to.
    let ipv6 = ipv6.then(|| {
        kept_ipv6.unwrap_or_else(|| {
            state.next_ip += 1;
            format!("2001:db8::{:x}", state.next_ip)
        })
    });
    let load_balancer = FakeLoadBalancer {
        name: name.clone(),
        service,
        cluster,
        ports,
        nodes,
        ip,
        ipv6,
    };
    state.load_balancers.insert(name, load_balancer.clone());
    CloudResponse::LoadBalancer {
        load_balancer: Some(load_balancer),
    }
}

#[cfg(test)]
mod tests;
