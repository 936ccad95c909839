//! `leader-migration status --report`: the Lease history a cluster still shows, drawn as a tenure chart.
//!
//! A cluster keeps no Lease history, but every process that acquires a Lease records an Event about it
//! (reason `LeaderElection`, "`<identity>` became leader", client-go's lock and ours alike), reported by its
//! component. Those Events (kept an hour by default), with each Lease's current record, give the tenures:
//! each acquisition lasts until the next acquisition by another process; the current holder's until now
//! (or its last renewal, when stale); a released Lease's until its release.
//!
//! Both this binary and client-go record core/v1 Events, and both merge a process's repeated Event into one
//! (a count, and the last time): then only its latest acquisition is known.
//!
//! The time axis starts at the earliest Event (an hour back when there is none): a holder that has led for
//! weeks would otherwise squeeze the hour the Events cover into a few pixels. Labels are clock times.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Event;
use kube::api::Api;
use kube_ccm_leadermigration::elector::{EVENT_REASON, who_became_leader};
use kube_ccm_leadermigration::status::{Condition, LeaseObservation, Observation, Status, component_of};

use super::list_all;
use crate::chart::{Bar, Chart, Tone};

/// One "X became leader" Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Acquisition {
    pub(super) lease: String,
    pub(super) identity: String,
    /// The component that reported it, when the Event says.
    pub(super) component: Option<String>,
    /// Microseconds since the epoch.
    pub(super) at_us: i64,
}

/// The `LeaderElection` Events about `leases` in `namespace`.
pub(super) async fn acquisitions(
    client: &kube::Client,
    namespace: &str,
    leases: &[&str],
) -> Result<Vec<Acquisition>, kube::Error> {
    list_all(&Api::<Event>::namespaced(client.clone(), namespace), |event| {
        acquisition(event, leases)
    })
    .await
}

fn acquisition(event: &Event, leases: &[&str]) -> Option<Acquisition> {
    if event.reason.as_deref() != Some(EVENT_REASON) {
        return None;
    }
    let about = &event.involved_object;
    let lease = about.name.as_deref()?;
    if about.kind.as_deref() != Some("Lease") || !leases.contains(&lease) {
        return None;
    }
    let identity = who_became_leader(event.message.as_deref()?)?;
    // This binary's Events carry an eventTime (microseconds); client-go's only whole seconds. A repeat
    // moves only lastTimestamp: the later of the two is the latest acquisition.
    let at = [
        event.event_time.as_ref().map(|t| t.0),
        event.last_timestamp.as_ref().map(|t| t.0),
        event
            .series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
    .or(event.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    let component = event
        .reporting_component
        .clone()
        .or_else(|| event.source.as_ref().and_then(|s| s.component.clone()))
        .filter(|c| !c.is_empty());
    Some(Acquisition {
        lease: lease.to_owned(),
        identity: identity.to_owned(),
        component,
        at_us: at.as_microsecond(),
    })
}

/// The chart of what `observation` and `acquisitions` show, with the conditions as its footer.
pub(super) fn chart(
    observation: &Observation,
    conditions: &[Condition],
    acquisitions: &[Acquisition],
    events_error: Option<&str>,
    now_us: i64,
) -> Chart {
    let leases: Vec<&LeaseObservation> = observation.leases().collect();
    let (start_us, end_us) = axis(acquisitions, now_us);
    Chart {
        title: format!(
            "Leader migration status at {}",
            jiff::Timestamp::from_second(observation.now)
                .map_or_else(|_| observation.now.to_string(), |t| t.to_string())
        ),
        start_us,
        end_us,
        leases: leases.iter().map(|l| l.name.clone()).collect(),
        bars: tenures(observation, &leases, acquisitions),
        gaps: Vec::new(),
        marks: Vec::new(),
        footer: footer(conditions, acquisitions.len(), events_error),
        clock: true,
    }
}

/// Every Lease's tenures as bars, each coloured by its holder's component: as its Event reported it, or as
/// status attributes a live holder.
fn tenures(
    observation: &Observation,
    leases: &[&LeaseObservation],
    acquisitions: &[Acquisition],
) -> Vec<Bar> {
    let mut components: BTreeMap<&str, String> = BTreeMap::new();
    for acquisition in acquisitions {
        if let Some(component) = &acquisition.component {
            components.insert(&acquisition.identity, component.clone());
        }
    }
    let component = |identity: &str| {
        components
            .get(identity)
            .cloned()
            .or_else(|| component_of(observation, identity).map(str::to_owned))
    };
    let mut bars = Vec::new();
    for lease in leases {
        for (identity, start_us, end_us) in lease_tenures(lease, observation.now, acquisitions) {
            bars.push(Bar {
                lease: lease.name.clone(),
                holder: identity.to_owned(),
                component: component(identity),
                start_us,
                end_us,
            });
        }
    }
    bars
}

/// The tenures of `lease` at `now` (Unix seconds), in order: who, from and until when (microseconds;
/// `None`: still held). A process's acquisitions in a row are one tenure; each lasts until another
/// process's acquisition, the last until now when its holder is live, else until the Lease's last renewal.
fn lease_tenures<'a>(
    lease: &'a LeaseObservation,
    now: i64,
    acquisitions: &'a [Acquisition],
) -> Vec<(&'a str, i64, Option<i64>)> {
    let mut starts: Vec<(i64, &str)> = acquisitions
        .iter()
        .filter(|a| a.lease == lease.name)
        .map(|a| (a.at_us, a.identity.as_str()))
        .collect();
    let holder = lease.holder.as_deref().filter(|h| !h.is_empty());
    // The current holder without an Event of this tenure (a process that records none, or an expired
    // Event): its tenure starts at the Lease's acquireTime (whole seconds; an Event is written after it).
    if let (Some(holder), Some(acquired)) = (holder, lease.acquired)
        && !starts
            .iter()
            .any(|(at, who)| *who == holder && *at >= acquired * 1_000_000)
    {
        starts.push((acquired * 1_000_000, holder));
    }
    starts.sort();
    starts.dedup_by(|later, earlier| later.1 == earlier.1);
    starts
        .iter()
        .enumerate()
        .map(|(index, &(start_us, identity))| {
            let end_us = match starts.get(index + 1) {
                Some((next, _)) => Some(*next),
                // The last acquisition: still held (open), stale (until its last renewal), or released.
                None if holder == Some(identity) && lease.stale_holder(now).is_none() => None,
                None => lease.renewed.map(|r| r * 1_000_000).or(Some(start_us)),
            };
            (identity, start_us, end_us)
        })
        .collect()
}

/// The time axis (from, to; microseconds): from a little before the earliest Event (an hour back when
/// there is none) to now, or to the newest Event when that is later.
fn axis(acquisitions: &[Acquisition], now_us: i64) -> (i64, i64) {
    let newest = acquisitions.iter().map(|a| a.at_us).max().unwrap_or(now_us);
    let end_us = now_us.max(newest);
    let earliest = acquisitions
        .iter()
        .map(|a| a.at_us)
        .min()
        .unwrap_or(end_us - 3_600_000_000);
    // A margin before the first Event, so that its bar does not start on the axis.
    let start_us = earliest - ((end_us - earliest) / 20).max(1_000_000);
    (start_us, end_us)
}

/// The footer: the conditions, `Completed` first, each in the tone of what it means; then what the
/// tenures were drawn from (`events` Events, or why they could not be read).
fn footer(conditions: &[Condition], events: usize, events_error: Option<&str>) -> Vec<(Tone, String)> {
    let mut footer: Vec<(Tone, String)> = conditions
        .iter()
        .map(|c| {
            (
                tone(c),
                format!("{}={} ({}): {}", c.kind, c.status, c.reason, c.message),
            )
        })
        .collect();
    if let Some(completed) = footer.iter().position(|(_, line)| line.starts_with("Completed=")) {
        let line = footer.remove(completed);
        footer.insert(0, line);
    }
    footer.push((
        Tone::Plain,
        match events_error {
            Some(why) => format!(
                "LeaderElection Events not readable ({why}): only the current holders are drawn"
            ),
            None => format!(
                "from {events} LeaderElection Event(s) and the Leases' current records; Events expire (an hour by default)"
            ),
        },
    ));
    footer
}

/// A condition's tone: good when the migration is completed, bad when another condition is false.
fn tone(condition: &Condition) -> Tone {
    match (condition.kind, condition.status) {
        ("Completed", Status::True) => Tone::Good,
        ("Completed", _) => Tone::Plain,
        (_, Status::False) => Tone::Bad,
        _ => Tone::Plain,
    }
}

#[cfg(test)]
mod tests {
    use kube_ccm_leadermigration::status::{Visibility, assess};

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn lease(name: &str, holder: &str, acquired: i64, renewed: i64) -> LeaseObservation {
        LeaseObservation {
            name: name.to_owned(),
            exists: true,
            holder: Some(holder.to_owned()),
            acquired: Some(acquired),
            renewed: Some(renewed),
            duration_seconds: Some(15),
        }
    }

    fn acquired(lease: &str, identity: &str, component: &str, at: i64) -> Acquisition {
        Acquisition {
            lease: lease.to_owned(),
            identity: identity.to_owned(),
            component: Some(component.to_owned()),
            at_us: at * 1_000_000,
        }
    }

    fn observation() -> Observation {
        Observation {
            now: NOW,
            kcm_lease: lease("kube-controller-manager", "kcm-b", NOW - 300, NOW - 200),
            ccm_lease: lease("cloud-controller-manager", "ccm-a", NOW - 100, NOW - 1),
            migration_leases: vec![(
                lease("migration", "ccm-a", NOW - 90, NOW - 1),
                vec!["service-lb-controller".to_owned()],
            )],
            pods: Visibility::Visible(Vec::new()),
            nodes: Visibility::Visible(Vec::new()),
            server_version: None,
        }
    }

    /// The bars of `lease`: holder, start and end in Unix seconds.
    fn seconds<'a>(chart: &'a Chart, lease: &str) -> Vec<(&'a str, i64, Option<i64>)> {
        chart
            .bars
            .iter()
            .filter(|b| b.lease == lease)
            .map(|b| {
                (
                    b.holder.as_str(),
                    b.start_us / 1_000_000,
                    b.end_us.map(|e| e / 1_000_000),
                )
            })
            .collect()
    }

    #[test]
    fn acquisitions_become_tenures_up_to_the_next_holder_or_now() {
        let observation = observation();
        let conditions = assess(&observation);
        let events = [
            acquired("migration", "kcm-a", "kube-controller-manager", NOW - 600),
            acquired("migration", "kcm-b", "kube-controller-manager", NOW - 400),
            acquired("migration", "ccm-a", "cloud-controller-manager", NOW - 90),
            acquired(
                "cloud-controller-manager",
                "ccm-a",
                "cloud-controller-manager",
                NOW - 100,
            ),
        ];
        let chart = chart(&observation, &conditions, &events, None, NOW * 1_000_000);
        assert_eq!(
            seconds(&chart, "migration"),
            [
                ("kcm-a", NOW - 600, Some(NOW - 400)),
                ("kcm-b", NOW - 400, Some(NOW - 90)),
                ("ccm-a", NOW - 90, None),
            ]
        );
        // kube-controller-manager's Lease has no Event: its holder (stale, renewed 200 s ago with a 15 s
        // duration) is drawn from the record, up to its last renewal.
        let kcm: Vec<&Bar> = chart
            .bars
            .iter()
            .filter(|b| b.lease == "kube-controller-manager")
            .collect();
        assert_eq!(kcm.len(), 1);
        assert_eq!(
            (kcm[0].start_us, kcm[0].end_us),
            ((NOW - 300) * 1_000_000, Some((NOW - 200) * 1_000_000))
        );
        // The axis: the earliest Event, less a twentieth of the span, to now.
        assert_eq!(chart.start_us, (NOW - 630) * 1_000_000);
        assert_eq!(chart.end_us, NOW * 1_000_000);
        assert!(chart.clock);
        assert_eq!(
            chart
                .bars
                .iter()
                .find(|b| b.holder == "ccm-a")
                .and_then(|b| b.component.as_deref()),
            Some("cloud-controller-manager")
        );
        assert!(chart.footer[0].1.starts_with("Completed="), "{:?}", chart.footer);
        assert!(
            chart
                .footer
                .last()
                .unwrap()
                .1
                .contains("4 LeaderElection Event(s)")
        );
    }

    #[test]
    fn a_holder_whose_event_is_of_an_earlier_tenure_gets_its_current_one_from_the_record() {
        let observation = observation();
        // Listed out of order, as an API server may; ccm-a's Event is of its tenure before kcm-b's.
        let events = [
            acquired("migration", "kcm-b", "kube-controller-manager", NOW - 400),
            acquired("migration", "ccm-a", "cloud-controller-manager", NOW - 500),
        ];
        let chart = chart(
            &observation,
            &assess(&observation),
            &events,
            None,
            NOW * 1_000_000,
        );
        assert_eq!(
            seconds(&chart, "migration"),
            [
                ("ccm-a", NOW - 500, Some(NOW - 400)),
                ("kcm-b", NOW - 400, Some(NOW - 90)),
                ("ccm-a", NOW - 90, None),
            ]
        );
    }

    #[test]
    fn without_events_the_axis_is_the_last_hour_not_the_holders_whole_reign() {
        let mut observation = observation();
        observation.kcm_lease = lease("kube-controller-manager", "kcm-b", NOW - 30 * 86_400, NOW - 1);
        let chart = chart(&observation, &assess(&observation), &[], None, NOW * 1_000_000);
        assert_eq!(chart.start_us, (NOW - 3_600 - 180) * 1_000_000);
        let kcm = chart
            .bars
            .iter()
            .find(|b| b.lease == "kube-controller-manager")
            .unwrap();
        assert_eq!(
            kcm.start_us,
            (NOW - 30 * 86_400) * 1_000_000,
            "drawn from the axis' start, dated in its title"
        );
        assert!(
            chart.to_svg().contains("held kube-controller-manager from 2026-"),
            "{}",
            chart.to_svg()
        );
    }

    #[test]
    fn a_process_that_led_twice_in_a_row_is_one_tenure() {
        let observation = observation();
        let events = [
            acquired("migration", "ccm-a", "cloud-controller-manager", NOW - 95),
            acquired("migration", "ccm-a", "cloud-controller-manager", NOW - 90),
        ];
        let chart = chart(
            &observation,
            &assess(&observation),
            &events,
            Some("forbidden"),
            NOW * 1_000_000,
        );
        let migration: Vec<&Bar> = chart.bars.iter().filter(|b| b.lease == "migration").collect();
        assert_eq!(migration.len(), 1, "{migration:?}");
        assert_eq!(migration[0].start_us, (NOW - 95) * 1_000_000);
        assert!(
            chart
                .footer
                .last()
                .unwrap()
                .1
                .contains("not readable (forbidden)")
        );
    }
}
