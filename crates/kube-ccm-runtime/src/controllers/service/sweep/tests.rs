use proptest::prelude::*;

use super::*;

fn lb(name: &str) -> ClusterLoadBalancer {
    ClusterLoadBalancer {
        name: name.to_owned(),
        service: Some(format!("default/{name}")),
        parts: vec![format!("lb-{name}")],
    }
}

fn names(found: &Found) -> Vec<&str> {
    found.due.iter().map(|lb| lb.name.as_str()).collect()
}

fn claimed(names: &[&str]) -> Claims {
    Claims {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        services: HashSet::new(),
    }
}

const GRACE: Duration = Duration::from_secs(600);

#[test]
fn an_unclaimed_load_balancer_is_due_after_the_grace_and_a_claimed_one_never() {
    let start = Instant::now();
    let mut unclaimed = Unclaimed::default();
    let listed = || vec![lb("gone"), lb("live")];
    let first = unclaimed.sweep(listed(), &claimed(&["live"]), start, GRACE);
    assert_eq!(
        first,
        Found {
            due: vec![],
            waiting: 1
        },
        "first seen: waits"
    );
    let early = unclaimed.sweep(listed(), &claimed(&["live"]), start + GRACE / 2, GRACE);
    assert_eq!(early.waiting, 1);
    assert!(early.due.is_empty());
    let due = unclaimed.sweep(listed(), &claimed(&["live"]), start + GRACE, GRACE);
    assert_eq!(names(&due), ["gone"]);
    assert_eq!(due.waiting, 0);
}

#[test]
fn a_claim_or_an_absence_in_between_starts_the_grace_again() {
    let start = Instant::now();
    let at = |minutes: u64| start + Duration::from_secs(60 * minutes);
    let mut unclaimed = Unclaimed::default();
    unclaimed.sweep(vec![lb("a"), lb("b")], &claimed(&[]), at(0), GRACE);
    // `a` is claimed for a moment (a service re-created under the name), `b` not listed (a list that
    // missed it): both start again.
    unclaimed.sweep(vec![lb("a")], &claimed(&["a"]), at(5), GRACE);
    let after = unclaimed.sweep(vec![lb("a"), lb("b")], &claimed(&[]), at(10), GRACE);
    assert!(after.due.is_empty(), "{after:?}");
    let later = unclaimed.sweep(vec![lb("a"), lb("b")], &claimed(&[]), at(20), GRACE);
    assert_eq!(names(&later), ["a", "b"]);
}

#[test]
fn the_longest_unclaimed_go_first_and_at_most_a_sweeps_worth() {
    let start = Instant::now();
    let mut unclaimed = Unclaimed::default();
    let many: Vec<_> = (0..MAX_PER_SWEEP + 5).map(|i| lb(&format!("n{i:03}"))).collect();
    unclaimed.sweep(vec![lb("old")], &claimed(&[]), start, GRACE);
    let mut listed = many.clone();
    listed.push(lb("old"));
    unclaimed.sweep(
        listed.clone(),
        &claimed(&[]),
        start + Duration::from_secs(1),
        GRACE,
    );
    let found = unclaimed.sweep(listed, &claimed(&[]), start + GRACE * 2, GRACE);
    assert_eq!(found.due.len(), MAX_PER_SWEEP);
    assert_eq!(found.due[0].name, "old");
    assert_eq!(found.waiting, 6, "the rest wait for the next sweep");
}

#[test]
fn a_part_without_a_name_is_claimed_while_its_service_exists_and_always_without_one() {
    let start = Instant::now();
    let part = |service: Option<&str>, arn: &str| ClusterLoadBalancer {
        name: String::new(),
        service: service.map(str::to_owned),
        parts: vec![format!("target-group/{arn}")],
    };
    let claims = Claims {
        names: HashSet::new(),
        services: ["default/live".to_owned()].into(),
    };
    let listed = || {
        vec![
            part(Some("default/live"), "1"),
            part(Some("default/gone"), "2"),
            part(None, "3"),
        ]
    };
    let mut unclaimed = Unclaimed::default();
    unclaimed.sweep(listed(), &claims, start, GRACE);
    let found = unclaimed.sweep(listed(), &claims, start + GRACE, GRACE);
    assert_eq!(found.due, [part(Some("default/gone"), "2")]);
    assert_eq!(found.waiting, 0);
    assert_eq!(found.due[0].key(), "target-group/2");
}

#[test]
fn a_dry_run_reports_each_orphan_once_and_again_after_it_was_forgotten() {
    let start = Instant::now();
    let mut unclaimed = Unclaimed::default();
    unclaimed.sweep(vec![lb("a")], &claimed(&[]), start, Duration::ZERO);
    assert!(unclaimed.report("a"));
    assert!(!unclaimed.report("a"));
    assert!(!unclaimed.report("never-seen"));
    unclaimed.sweep(vec![], &claimed(&[]), start, Duration::ZERO);
    unclaimed.sweep(vec![lb("a")], &claimed(&[]), start, Duration::ZERO);
    assert!(unclaimed.report("a"));
}

#[test]
fn a_gone_service_is_referred_to_by_kind_namespace_and_name() {
    let reference = service_reference("shop/web").unwrap();
    assert_eq!(reference.kind.as_deref(), Some("Service"));
    assert_eq!(reference.namespace.as_deref(), Some("shop"));
    assert_eq!(reference.name.as_deref(), Some("web"));
    assert!(reference.uid.is_none());
    assert!(service_reference("no-slash").is_none());
}

proptest! {
    /// Over random sweeps (which load balancers are listed, which claimed, how much time passes), a
    /// load balancer is due only if every sweep of the last `grace` listed it unclaimed, and it was
    /// first seen so at least `grace` ago.
    #[test]
    fn never_due_while_claimed_or_unseen_within_the_grace(
        sweeps in prop::collection::vec((0u8..16, 0u8..16, 0u64..400), 1..40),
    ) {
        let names = ["a", "b", "c", "d"];
        let start = Instant::now();
        let mut unclaimed = Unclaimed::default();
        // Per name: the time of the first sweep of the current unbroken run of "listed and unclaimed".
        let mut run_start: HashMap<&str, Instant> = HashMap::new();
        let mut now = start;
        for (listed_mask, claimed_mask, step) in sweeps {
            now += Duration::from_secs(step);
            let listed: Vec<_> =
                names.iter().enumerate().filter(|(i, _)| listed_mask & (1 << i) != 0).map(|(_, n)| lb(n)).collect();
            let claims = Claims {
                names: names
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| claimed_mask & (1 << i) != 0)
                    .map(|(_, n)| (*n).to_owned())
                    .collect(),
                services: HashSet::new(),
            };
            for (i, name) in names.iter().enumerate() {
                let orphan = listed_mask & (1 << i) != 0 && claimed_mask & (1 << i) == 0;
                if orphan {
                    run_start.entry(name).or_insert(now);
                } else {
                    run_start.remove(name);
                }
            }
            let found = unclaimed.sweep(listed, &claims, now, GRACE);
            for due in &found.due {
                prop_assert!(!claims.names.contains(&due.name), "{} is claimed", due.name);
                let since = run_start[due.name.as_str()];
                prop_assert!(now.duration_since(since) >= GRACE, "{} unclaimed only since {since:?}", due.name);
                unclaimed.forget(&due.name);
                run_start.remove(due.name.as_str());
            }
        }
    }
}
