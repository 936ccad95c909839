use super::*;

#[test]
fn restarts_back_off_per_lease_and_reset_once_led() {
    let mut restarts = Restarts::default();
    let seconds: Vec<u64> = (0..7).map(|_| restarts.next("a").as_secs()).collect();
    assert_eq!(seconds, [1, 2, 4, 8, 16, 30, 30]);
    assert_eq!(
        restarts.next("b"),
        Duration::from_secs(1),
        "each lease backs off on its own"
    );
    restarts.led("a");
    assert_eq!(restarts.next("a"), Duration::from_secs(1));
}

#[test]
fn after_a_tenure_the_policy_decides_between_exit_and_campaigning_again() {
    let grace = Duration::from_secs(30);
    let lost = || LossReason::RenewDeadline;
    let cases = [
        ("shutdown", Outcome::Shutdown, LossPolicy::Recontend, Some("Ok")),
        (
            "main lost, recontend",
            Outcome::MainLost(lost()),
            LossPolicy::Recontend,
            None,
        ),
        (
            "main lost, exit",
            Outcome::MainLost(lost()),
            LossPolicy::Exit,
            Some("leader election lost on lease main"),
        ),
        (
            "a migration lock lost, exit",
            Outcome::Lost("migration".to_owned(), lost()),
            LossPolicy::Exit,
            Some("leader election lost on lease migration"),
        ),
        (
            "stop timeout",
            Outcome::StopTimeout("migration".to_owned()),
            LossPolicy::Recontend,
            Some("the controllers of lease migration did not stop within 30s after the lease was lost"),
        ),
    ];
    for (case, outcome, policy, expected) in cases {
        let got = after(outcome, policy, "main", grace).map(|result| match result {
            Ok(()) => "Ok".to_owned(),
            Err(error) => error.to_string(),
        });
        match (got, expected) {
            (None, None) => {}
            (Some(got), Some(expected)) => assert!(got.starts_with(expected), "{case}: {got}"),
            (got, expected) => panic!("{case}: {got:?}, expected {expected:?}"),
        }
    }
    assert_eq!(loss_reason(Ended::Released), LossReason::RenewDeadline);
    assert_eq!(
        loss_reason(Ended::Lost(LossReason::RenewDeadline)),
        LossReason::RenewDeadline
    );
}
