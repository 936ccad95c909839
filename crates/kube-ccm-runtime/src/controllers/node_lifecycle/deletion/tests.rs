use super::*;

use proptest::prelude::*;

const PERIOD: Duration = Duration::from_secs(5);

/// The nodes `a`, `b`, … with one answer each.
fn uids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("uid-{i}")).collect()
}

/// A round `seconds` after `start` with `answers` for the not-ready nodes and ready nodes cross-checked.
fn round<'a>(
    start: Instant,
    seconds: u64,
    answers: &'a [(&'a str, Answer)],
    cross_checked: (usize, usize),
) -> Round<'a> {
    Round {
        at: start + Duration::from_secs(seconds),
        answers,
        cross_checked: cross_checked.0,
        cross_checked_gone: cross_checked.1,
    }
}

#[test]
fn a_node_goes_on_the_second_gone_a_period_later() {
    let policy = NodeDeletion::default();
    let start = Instant::now();
    let mut memory = GoneSince::default();
    let gone = [("uid-a", Answer::Gone)];
    let first = memory.decide(&policy, PERIOD, &round(start, 0, &gone, (1, 0)));
    assert_eq!(first.delete, Vec::<usize>::new(), "one answer is not enough");
    assert_eq!(first.waiting, 1);
    assert_eq!(memory.len(), 1);
    let early = memory.decide(&policy, PERIOD, &round(start, 4, &gone, (1, 0)));
    assert!(early.delete.is_empty(), "not a period apart yet");
    let second = memory.decide(&policy, PERIOD, &round(start, 5, &gone, (1, 0)));
    assert_eq!(second.delete, [0]);
    assert_eq!(second.held, None);
}

#[test]
fn each_sequence_of_answers_deletes_or_not() {
    use Answer::{Exists as E, Gone as G, Unknown as U};
    // (case, the answers at 0 s, 5 s, 10 s, …, whether the last round deletes)
    let cases: [(&str, &[Answer], bool); 8] = [
        ("gone twice", &[G, G], true),
        ("gone once", &[G], false),
        ("gone, exists, gone", &[G, E, G], false),
        ("gone, exists, gone, gone", &[G, E, G, G], true),
        ("an error between is no answer", &[G, U, G], true),
        ("gone then an error", &[G, G, U], false),
        ("exists twice", &[E, E], false),
        ("errors only", &[U, U, U], false),
    ];
    for (case, answers, deletes) in cases {
        let mut memory = GoneSince::default();
        let start = Instant::now();
        let mut last = Decision::default();
        for (i, answer) in answers.iter().enumerate() {
            let these = [("uid-a", *answer)];
            last = memory.decide(
                &NodeDeletion::default(),
                PERIOD,
                &round(start, 5 * i as u64, &these, (1, 0)),
            );
        }
        assert_eq!(!last.delete.is_empty(), deletes, "{case}");
    }
}

#[test]
fn a_configured_delay_replaces_the_period() {
    let policy = NodeDeletion {
        confirm_after: Duration::from_secs(60),
        ..NodeDeletion::default()
    };
    let start = Instant::now();
    let mut memory = GoneSince::default();
    let gone = [("uid-a", Answer::Gone)];
    for seconds in [0, 5, 30, 55] {
        let d = memory.decide(&policy, PERIOD, &round(start, seconds, &gone, (1, 0)));
        assert!(d.delete.is_empty(), "{seconds} s");
    }
    let d = memory.decide(&policy, PERIOD, &round(start, 60, &gone, (1, 0)));
    assert_eq!(d.delete, [0]);
}

#[test]
fn the_breaker_holds_a_round_that_says_most_nodes_are_gone() {
    let policy = NodeDeletion::default();
    let start = Instant::now();
    let ids = uids(4);
    // A wrong cloud-config: four not-ready nodes and the four ready ones beside them, all "gone".
    let all_gone: Vec<(&str, Answer)> = ids.iter().map(|u| (u.as_str(), Answer::Gone)).collect();
    let mut memory = GoneSince::default();
    for seconds in [0, 5, 10, 15] {
        let d = memory.decide(&policy, PERIOD, &round(start, seconds, &all_gone, (4, 4)));
        assert!(d.delete.is_empty(), "{seconds} s: {d:?}");
        assert_eq!(
            d.held,
            Some(Held {
                gone: 8,
                asked: 8,
                ready_gone: 4
            })
        );
        assert_eq!(d.waiting, 4);
    }
    // The cloud answers truly again: the ready ones exist, so do three not-ready ones; one is gone.
    let truth: Vec<(&str, Answer)> = ids
        .iter()
        .enumerate()
        .map(|(i, u)| (u.as_str(), if i == 2 { Answer::Gone } else { Answer::Exists }))
        .collect();
    let d = memory.decide(&policy, PERIOD, &round(start, 20, &truth, (4, 0)));
    assert_eq!(d.delete, [2], "its gone stood since 0 s, never contradicted");
    assert_eq!(memory.len(), 1, "the others were contradicted");
}

/// `(case, the not-ready nodes' answers, ready ones cross-checked (asked, gone), the ratio, whether it
/// trips)`.
type BreakerCase<'a> = (&'a str, &'a [(&'a str, Answer)], (usize, usize), f64, bool);

#[test]
fn the_breakers_edges() {
    let start = Instant::now();
    let ids = uids(3);
    let gone: Vec<(&str, Answer)> = ids.iter().map(|u| (u.as_str(), Answer::Gone)).collect();
    let cases: [BreakerCase<'_>; 7] = [
        ("one gone alone never trips", &gone[..1], (0, 0), 0.5, false),
        (
            "a ready node gone beside a not-ready one",
            &gone[..1],
            (1, 1),
            0.5,
            true,
        ),
        ("two of four: half", &gone[..2], (2, 0), 0.5, false),
        ("three of four", &gone[..3], (1, 0), 0.5, true),
        ("ready ones gone count", &gone[..2], (2, 2), 0.5, true),
        ("a ratio of 1 never trips", &gone[..3], (3, 3), 1.0, false),
        ("a ratio of 0 trips on two", &gone[..2], (8, 0), 0.0, true),
    ];
    for (case, answers, cross, ratio, trips) in cases {
        let policy = NodeDeletion {
            breaker_ratio: ratio,
            ..NodeDeletion::default()
        };
        let d = GoneSince::default().decide(&policy, PERIOD, &round(start, 0, answers, cross));
        assert_eq!(d.held.is_some(), trips, "{case}: {d:?}");
    }
}

#[test]
fn a_round_deletes_at_most_its_cap_the_longest_confirmed_first() {
    let policy = NodeDeletion {
        max_per_round: 2,
        breaker_ratio: 1.0,
        ..NodeDeletion::default()
    };
    let start = Instant::now();
    let ids = uids(4);
    let mut memory = GoneSince::default();
    // uid-3 was answered gone first, the others a round later.
    memory.decide(
        &policy,
        PERIOD,
        &round(start, 0, &[(&ids[3], Answer::Gone)], (0, 0)),
    );
    let all: Vec<(&str, Answer)> = ids.iter().map(|u| (u.as_str(), Answer::Gone)).collect();
    memory.decide(&policy, PERIOD, &round(start, 5, &all, (0, 0)));
    let d = memory.decide(&policy, PERIOD, &round(start, 10, &all, (0, 0)));
    assert_eq!(d.delete, [3, 0]);
    assert_eq!(d.waiting, 2);
    let none = NodeDeletion {
        max_per_round: 0,
        ..policy
    };
    let d = memory.decide(&none, PERIOD, &round(start, 15, &all, (0, 0)));
    assert!(d.delete.is_empty(), "0 deletes none");
}

/// The reference: a node answered `answers[k]` at `times[k]` is deleted at round `k` when that answer is
/// "gone", and some earlier "gone", at least `confirm` before, was followed by no "exists".
fn should_delete(answers: &[Answer], times: &[u64], k: usize, confirm: u64) -> bool {
    if answers[k] != Answer::Gone {
        return false;
    }
    let mut j = k;
    // Back to the first "gone" of the stretch without an "exists".
    let mut first = None;
    while j > 0 {
        j -= 1;
        match answers[j] {
            Answer::Exists => break,
            Answer::Gone => first = Some(j),
            Answer::Unknown => {}
        }
    }
    first.is_some_and(|j| times[k] - times[j] >= confirm)
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![Just(Answer::Exists), Just(Answer::Gone), Just(Answer::Unknown)]
}

proptest! {
    /// Never a deletion on a "gone" that a check since contradicted or that is not old enough; always one
    /// when it stood long enough.
    #[test]
    fn deletions_follow_only_uncontradicted_gone_answers(
        steps in prop::collection::vec((answer(), 1u64..12), 1..40),
        confirm in 0u64..20,
    ) {
        let policy = NodeDeletion {
            confirm_after: Duration::from_secs(confirm),
            ..NodeDeletion::default()
        };
        let start = Instant::now();
        let mut memory = GoneSince::default();
        let (mut answers, mut times, mut now) = (Vec::new(), Vec::new(), 0);
        for (answer, gap) in steps {
            now += gap;
            answers.push(answer);
            times.push(now);
            let these = [("uid-a", answer)];
            let d = memory.decide(&policy, PERIOD, &round(start, now, &these, (1, 0)));
            let k = answers.len() - 1;
            let confirm = if confirm == 0 { PERIOD.as_secs() } else { confirm };
            prop_assert_eq!(!d.delete.is_empty(), should_delete(&answers, &times, k, confirm),
                "answers {:?} at {:?}", answers, times);
            if !d.delete.is_empty() {
                // Deleted: the node is gone from the cluster, and a namesake is another node.
                memory.forget("uid-a");
                answers.clear();
                times.clear();
            }
        }
    }

    /// A cloud that answers "gone" for every node asked about never deletes more than one node, whatever
    /// the cluster's shape, for as long as it lies.
    #[test]
    fn a_cloud_that_says_gone_for_all_deletes_at_most_a_lone_node(
        not_ready in 1usize..60,
        ready in 0usize..200,
        rounds in 2usize..8,
    ) {
        let policy = NodeDeletion::default();
        let start = Instant::now();
        let ids = uids(not_ready);
        let all: Vec<(&str, Answer)> = ids.iter().map(|u| (u.as_str(), Answer::Gone)).collect();
        let cross = not_ready.min(ready);
        let mut memory = GoneSince::default();
        let mut deleted = std::collections::BTreeSet::new();
        for r in 0..rounds {
            let d = memory.decide(&policy, PERIOD, &round(start, 5 * r as u64, &all, (cross, cross)));
            deleted.extend(d.delete);
        }
        prop_assert!(deleted.len() <= usize::from(not_ready == 1 && ready == 0), "{:?} deleted", deleted);
    }
}
