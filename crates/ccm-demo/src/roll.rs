//! The roll itself: replicas of this binary join and leave one at a time, N to N+1 (and with `--rollback`,
//! half-way and back), each step settling before the next, while work keeps arriving.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use harness::{Cloud, Created, Environment, Replica, Side, Workload};
use kube_ccm_leadermigration::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER};
use tokio_util::sync::CancellationToken;

use super::peers::{From, Peers, is_pending, pending};
use super::{Args, LEASES, MIGRATION_LEASE, Names, Timeline, progress};
use kube_ccm_cli::chart::Mark;

/// What the migration leaves: every replica (those that left stopped), the nodes and services registered
/// in all, and when replicas joined and left.
pub(super) struct Migrated {
    pub(super) replicas: Vec<Replica>,
    pub(super) registered: Created,
    pub(super) marks: Vec<Mark>,
}

/// The replicas of a roll, with the identities of those still running.
struct Roll<'a> {
    args: &'a Args,
    from: From,
    peers: Option<&'a Peers>,
    environment: &'a Environment,
    client: &'a kube::Client,
    names: &'a Names,
    wait: Duration,
    kcms: Vec<Replica>,
    ccms: Vec<Replica>,
    live_kcms: Vec<String>,
    live_ccms: Vec<String>,
    /// When replicas joined and left, for the report.
    marks: Vec<Mark>,
}

impl Roll<'_> {
    /// Starts replica `name` on `side`; returns its index among that side's replicas.
    fn join(&mut self, name: &str, side: Side) -> Result<usize> {
        let (replica, identity) = match (side, self.peers) {
            (Side::Kcm, Some(peers)) if self.from != From::Ours => {
                // A Go replica says who it is once it leads: learnt then ([`Roll::learn`]).
                let replica = peers.start(self.from, self.environment, name)?;
                (replica, pending(name))
            }
            _ => {
                let mut replica = Replica::start(self.environment, name, side)?;
                let identity = self.names.add(&mut replica, self.wait)?;
                (replica, identity)
            }
        };
        self.marks.push(Mark {
            at_us: harness::now_us(),
            label: format!("{name} joins"),
        });
        let (replicas, live) = match side {
            Side::Kcm => (&mut self.kcms, &mut self.live_kcms),
            Side::Ccm => (&mut self.ccms, &mut self.live_ccms),
        };
        replicas.push(replica);
        live.push(identity);
        Ok(replicas.len() - 1)
    }

    /// Stops replica `index` of `side` (SIGTERM, or SIGKILL with `--crash`) and waits for it to exit.
    async fn leave(&mut self, side: Side, index: usize) -> Result<()> {
        let how = if self.args.crash { "SIGKILL" } else { "SIGTERM" };
        let replica = match side {
            Side::Kcm => &mut self.kcms[index],
            Side::Ccm => &mut self.ccms[index],
        };
        self.marks.push(Mark {
            at_us: harness::now_us(),
            label: format!("{} {how}", replica.name),
        });
        if self.args.crash {
            replica.kill()?;
        } else {
            replica.terminate()?;
        }
        // A blocking wait: off the runtime's workers' async duty, which serves the in-process API server.
        let status = tokio::task::block_in_place(|| replica.wait(self.wait))?;
        let foreign = side == Side::Kcm && self.from != From::Ours;
        if foreign {
            // What it said while it ran (if it led, who it was); the Go programs' exit status on SIGTERM
            // is theirs.
            self.names.learn(replica);
            let placeholder = pending(&replica.name);
            self.live_kcms.retain(|id| *id != placeholder);
        } else if !self.args.crash && !status.success() {
            bail!(
                "{} exited with {status} on SIGTERM: {}",
                replica.name,
                replica.log_tail()
            );
        }
        let identity = self.names.identity_of(&replica.name);
        self.live_kcms.retain(|id| Some(id) != identity.as_ref());
        self.live_ccms.retain(|id| Some(id) != identity.as_ref());
        Ok(())
    }

    /// Learns the identities the Go replicas have reported (once they led) in place of their placeholders.
    fn learn(&mut self) {
        if self.from == From::Ours {
            return;
        }
        for replica in &mut self.kcms {
            let placeholder = pending(&replica.name);
            if let Some(index) = self.live_kcms.iter().position(|id| *id == placeholder)
                && let Some(identity) = self.names.learn(replica)
            {
                self.live_kcms[index] = identity;
            }
        }
    }

    /// Whether `holder` is a live replica of those `live` identities: one of them, or, where some are
    /// still placeholders, anyone who is none of ours (a Go replica whose identity is not known yet).
    fn held_by_live(names: &Names, live: &[String], holder: Option<&String>) -> bool {
        holder.is_some_and(|holder| {
            live.contains(holder) || (live.iter().any(|id| is_pending(id)) && names.get(holder).is_none())
        })
    }

    /// The replicas of `side`, and the identities of those still running.
    fn side(&self, side: Side) -> (&[Replica], &[String]) {
        match side {
            Side::Kcm => (&self.kcms, &self.live_kcms),
            Side::Ccm => (&self.ccms, &self.live_ccms),
        }
    }

    /// Waits until a live replica of `side` leads both its main lock and the migration lock.
    async fn lead_both(&mut self, side: Side) -> Result<()> {
        self.learn();
        let (_, live) = self.side(side);
        let main = self.from.main_lease(side);
        let names = self.names;
        harness::wait_for_holders(
            self.client,
            &LEASES,
            self.wait,
            &format!("a {} to lead both of its locks", side.component()),
            |h| Roll::held_by_live(names, live, h[MIGRATION_LEASE].as_ref()) && h[main] == h[MIGRATION_LEASE],
        )
        .await?;
        Ok(())
    }

    /// Waits until every lock a live replica contends for is held by a live replica of the right side.
    async fn settle(&mut self) -> Result<BTreeMap<String, Option<String>>> {
        self.learn();
        let (kcms, ccms) = (&self.live_kcms, &self.live_ccms);
        let (names, shared_main) = (self.names, self.from == From::GoCcm);
        harness::wait_for_holders(
            self.client,
            &LEASES,
            self.wait,
            "the locks to settle on live replicas",
            |h| {
                let held_by = |lease: &str, ids: &[String]| Roll::held_by_live(names, ids, h[lease].as_ref());
                let migration = held_by(MIGRATION_LEASE, kcms) || held_by(MIGRATION_LEASE, ccms);
                // The Go CCM and ours share the main Lease: one of either side holds it.
                let main = if shared_main {
                    held_by(CLOUD_CONTROLLER_MANAGER, kcms) || held_by(CLOUD_CONTROLLER_MANAGER, ccms)
                } else {
                    (kcms.is_empty() || held_by(KUBE_CONTROLLER_MANAGER, kcms))
                        && (ccms.is_empty() || held_by(CLOUD_CONTROLLER_MANAGER, ccms))
                };
                migration && main
            },
        )
        .await
    }

    /// The index of the live replica of `side` holding the migration lock now, if one does.
    async fn migration_holder(&self, side: Side) -> Result<Option<usize>> {
        let holders = harness::holders(self.client, &[MIGRATION_LEASE]).await?;
        let Some(holder) = holders[MIGRATION_LEASE].as_deref() else {
            return Ok(None);
        };
        let (replicas, live) = self.side(side);
        if !live.iter().any(|id| id == holder) {
            return Ok(None);
        }
        Ok(replicas
            .iter()
            .position(|r| self.names.identity_of(&r.name).as_deref() == Some(holder)))
    }

    /// The index of the first replica of `side` still running.
    fn first_live(&self, side: Side) -> usize {
        let (replicas, live) = self.side(side);
        replicas
            .iter()
            .position(|r| {
                live.contains(&pending(&r.name))
                    || self
                        .names
                        .identity_of(&r.name)
                        .is_some_and(|id| live.contains(&id))
            })
            .unwrap_or(0)
    }
}

/// Waits until every registered node is initialised and every service has its load balancer.
async fn finished(client: &kube::Client, registered: Created, wait: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (nodes, services) = progress(client).await?;
        if (nodes, services) == (registered.nodes as usize, registered.services as usize) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "after {wait:?}: {nodes}/{} nodes initialised, {services}/{} services with a load balancer",
                registered.nodes,
                registered.services
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the cloud has caught up with the cluster: a route to every node's pod range, and every load
/// balancer sending to every node.
async fn converged(cloud: &Cloud, registered: Created, wait: Duration) -> Result<()> {
    let nodes = registered.nodes as usize;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let inventory = cloud.inventory().await?;
        let lagging = inventory
            .load_balancers
            .iter()
            .filter(|lb| lb.backends != nodes)
            .count();
        if inventory.routes >= nodes && lagging == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "after {wait:?} the cloud has {} route(s) for {nodes} node(s), and {lagging} of {} load balancer(s) do not send to every node",
                inventory.routes,
                inventory.load_balancers.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The migration itself (and with `--rollback`, half of it and back).
#[allow(clippy::too_many_arguments)]
pub(super) async fn migrate(
    args: &Args,
    from: From,
    peers: Option<&Peers>,
    migration: &kube_ccm_leadermigration::MigrationConfig,
    environment: &Environment,
    client: &kube::Client,
    cloud: &Cloud,
    names: &Names,
    timeline: &Timeline,
    wait: Duration,
) -> Result<Migrated> {
    let mut roll = Roll {
        args,
        from,
        peers,
        environment,
        client,
        names,
        wait,
        kcms: Vec::new(),
        ccms: Vec::new(),
        live_kcms: Vec::new(),
        live_ccms: Vec::new(),
        marks: Vec::new(),
    };
    for index in 1..=args.replicas {
        roll.join(&format!("{}-{index}", from.old_prefix()), Side::Kcm)?;
    }
    timeline.say(&format!(
        "started {} as {}{}",
        roll.kcms
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        from.old_side(),
        match (from, peers) {
            (From::Ours, _) | (_, None) => " with the N configuration".to_owned(),
            (From::Kcm, Some(peers)) => format!(
                " {} with the N configuration: since v1.31 it has no cloud provider, so it holds its Leases and runs no cloud controller",
                peers.version
            ),
            (From::GoCcm, Some(peers)) => format!(" {}, on the Leases ours will share", peers.version),
        }
    ));
    let old_main = from.old_main_lease();
    harness::wait_for_holders(client, &LEASES, wait, "an old-side leader", |h| {
        h[old_main].is_some() && h[old_main] == h[MIGRATION_LEASE]
    })
    .await?;
    roll.learn();
    if from == From::Kcm {
        super::say_status(client, migration, timeline).await;
    }

    let workload = Workload::on(client.clone(), cloud.clone());
    for index in 0..args.nodes {
        workload.add_node(index).await?;
    }
    for index in 0..args.services {
        workload.add_service(index).await?;
    }
    timeline.say(&format!(
        "registered {} node(s) tainted uninitialized and {} LoadBalancer service(s); more keep arriving",
        args.nodes, args.services
    ));
    // Work for the controllers throughout the roll: a node and a service every half second.
    let churn_period = Duration::from_millis(500);
    let mut next_index = args.nodes.max(args.services);
    let stop_churn = CancellationToken::new();
    let churn = workload
        .clone()
        .churn(churn_period, next_index, stop_churn.clone());
    let dwell = Duration::from_secs_f64(args.dwell_seconds.max(0.0));
    tokio::time::sleep(dwell).await;

    // Forward: a new replica joins, an old one leaves, each step settling before the next. A rollback goes
    // half-way, and on until a cloud-controller-manager leads the migration lock (so that there is something
    // to roll back).
    let replicas = args.replicas as usize;
    let forward_steps = if args.rollback {
        replicas.div_ceil(2)
    } else {
        replicas
    };
    for step in 0..replicas {
        let name = format!("ccm-{}", step + 1);
        // In order; a rollback takes the node whose kube-controller-manager holds the migration lock first,
        // so that the lock moves early.
        let leaving = if args.rollback {
            roll.migration_holder(Side::Kcm).await?
        } else {
            None
        }
        .unwrap_or_else(|| roll.first_live(Side::Kcm));
        timeline.say(&format!(
            "step {}/{}: {name} joins as this cloud-controller-manager (N+1); {} leaves ({})",
            step + 1,
            replicas,
            roll.kcms[leaving].name,
            if args.crash { "SIGKILL" } else { "SIGTERM" }
        ));
        roll.join(&name, Side::Ccm)?;
        roll.leave(Side::Kcm, leaving).await?;
        roll.settle().await?;
        // This configuration of the control plane runs for a while before the next step.
        tokio::time::sleep(dwell).await;
        if step + 1 >= forward_steps && (!args.rollback || roll.migration_holder(Side::Ccm).await?.is_some())
        {
            break;
        }
    }
    stop_churn.cancel();
    let churned = churn.await.context("the workload task")??;
    next_index += churned.nodes.max(churned.services);
    let mut registered = Created {
        nodes: args.nodes + churned.nodes,
        services: args.services + churned.services,
    };

    if args.rollback {
        let holders = harness::holders(client, &LEASES).await?;
        timeline.say(&format!(
            "half-way: {} leads the migration lease; once every node and service is served, rolling back to N",
            holders[MIGRATION_LEASE]
                .as_deref()
                .map_or_else(|| "nobody".to_owned(), |h| names.name(h))
        ));
        // The nodes are the cloud-controller-manager's to initialise (kube-controller-manager never runs the
        // cloud-node controller), so they are finished before the roll back; services keep arriving.
        finished(client, registered, wait).await?;
        let stop_churn = CancellationToken::new();
        let churn = workload.churn_services(churn_period, next_index, stop_churn.clone());
        let leaving = roll.ccms.len();
        for step in 0..leaving {
            let name = format!("{}-{}", from.old_prefix(), replicas + step + 1);
            timeline.say(&format!(
                "rollback {}/{leaving}: {name} joins as {}; {} leaves ({})",
                step + 1,
                from.old_side(),
                roll.ccms[step].name,
                if args.crash { "SIGKILL" } else { "SIGTERM" }
            ));
            roll.join(&name, Side::Kcm)?;
            roll.leave(Side::Ccm, step).await?;
            roll.settle().await?;
            tokio::time::sleep(dwell).await;
        }
        roll.lead_both(Side::Kcm).await?;
        stop_churn.cancel();
        registered.services += churn.await.context("the workload task")??.services;
    } else {
        roll.lead_both(Side::Ccm).await?;
    }
    // The side now in charge finishes the work: every node initialised, every service with its load balancer,
    // and in the cloud every node routed and behind every load balancer.
    finished(client, registered, wait).await?;
    converged(cloud, registered, wait).await?;
    roll.learn();
    Ok(Migrated {
        replicas: roll.kcms.into_iter().chain(roll.ccms).collect(),
        registered,
        marks: roll.marks,
    })
}
