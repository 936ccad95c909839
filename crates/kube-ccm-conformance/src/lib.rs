//! Does a cloud provider behave as the controllers expect? A suite a provider's crate generates in its own
//! `tests/`, run against the provider's cloud (or a stand-in for it) through a small [`Fixture`].
//!
//! ```ignore
//! // tests/conformance.rs of a provider's crate
//! struct MyCloud { /* a test account, a local emulator, … */ }
//!
//! #[kube_ccm_conformance::async_trait]
//! impl kube_ccm_conformance::Fixture for MyCloud { /* make an instance, stop it, … */ }
//!
//! async fn my_cloud() -> MyCloud { /* … */ }
//!
//! kube_ccm_conformance::contract_suite!(my_cloud);
//! ```
//!
//! - [`contract`]: each capability's promises, call by call, in seconds: instance look-ups (running,
//!   stopped, gone; batch and single answers agree; an outage is an error, never "gone"; provider IDs),
//!   load balancers (ensure is idempotent and a second ensure writes nothing, update follows the nodes,
//!   delete is idempotent, a new process adopts what an old one made), routes, and deadlines (a call
//!   abandoned at its deadline or cancelled writes nothing afterwards).
//! - [`controllers`]: the framework's own manager, every built-in controller, with the provider, against
//!   the in-process test API server (the `kube-ccm-test-apiserver` crate, re-exported as [`test_apiserver`]):
//!   nodes initialised from the cloud, a service's load balancer through its life (made, following the
//!   nodes, adopted by a new process, deleted), routes for the nodes' pod ranges, and a node deleted only
//!   when its instance is gone (never during an outage). Tens of seconds each.
//! - [`fencing`]: a leading manager's lock taken away with a cloud call in flight: no cloud write lands
//!   once the lock may have passed to another process.
//! - [`broken`]: providers broken on purpose, each wrapping a good one, which the suites must fail: the
//!   negative controls that show a passing suite means something.
//!
//! `contract_suite!`, `controllers_suite!` and `fencing_suite!` generate each suite's tests (so a vendor
//! may run the fast one alone); `negative_controls!` generates the controls over all three. Every check is
//! named as its generated test is; a failure says what was asked, what the provider answered and what the
//! controllers need instead.

pub mod broken;
pub mod contract;
pub mod controllers;
pub mod fencing;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
pub use kube_ccm_provider::CloudProvider;
/// The in-process Kubernetes API server the controllers checks run against: start one in a provider's own
/// tests (`TestApiServer::start()`) to run its binary against, with no other dependency.
pub use kube_ccm_test_apiserver as test_apiserver;

/// A fixture's own failure (the cloud could not be set up as asked), not the provider's.
pub type FixtureError = Box<dyn std::error::Error + Send + Sync>;

/// A load balancer as the cloud holds it, read by the fixture independently of the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudLoadBalancer {
    /// Its name in the cloud (the provider's `load_balancer_name`).
    pub name: String,
    /// The nodes it sends traffic to, by node name, sorted.
    pub nodes: Vec<String>,
}

impl CloudLoadBalancer {
    /// A load balancer called `name` sending to `nodes` (sorted here).
    pub fn new(name: impl Into<String>, nodes: impl IntoIterator<Item = String>) -> CloudLoadBalancer {
        let mut nodes: Vec<String> = nodes.into_iter().collect();
        nodes.sort();
        CloudLoadBalancer {
            name: name.into(),
            nodes,
        }
    }
}

/// A route as the cloud holds it, read by the fixture independently of the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudRoute {
    /// The node it sends to, by node name.
    pub node: String,
    /// The destination range.
    pub cidr: String,
}

impl CloudRoute {
    /// A route to `node` for `cidr`.
    pub fn new(node: impl Into<String>, cidr: impl Into<String>) -> CloudRoute {
        CloudRoute {
            node: node.into(),
            cidr: cidr.into(),
        }
    }
}

/// A capability a provider may not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capability {
    /// [`CloudProvider::load_balancer`].
    LoadBalancer,
    /// [`CloudProvider::routes`].
    Routes,
}

/// What the suite needs of a provider's cloud: the provider under test, ways to change the cloud, and a
/// view of what the cloud holds that does not go through the provider.
///
/// One fixture serves one check: each check gets a fresh one, so a fixture need not clean up between
/// checks (but the names it is given are unique within a check only).
#[async_trait]
pub trait Fixture: Send + Sync {
    /// The provider, as the binary's factory builds it from a cloud-config. Called more than once: each
    /// call is a new process's provider over the same cloud (to check that one adopts what another made).
    async fn provider(&self) -> Result<Arc<dyn CloudProvider>, FixtureError>;

    /// `Some(why)` when the cloud is not available where the test runs (an emulator not installed): every
    /// check is then reported not applicable, with that reason. Make it fail where it must run (in CI).
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// The capabilities the provider does not have, on purpose: their checks are then not applicable
    /// (and reported so) instead of failed. A capability listed here that the provider has fails them.
    fn lacks(&self) -> &[Capability] {
        &[]
    }

    /// The cluster name the manager is given (`--cluster-name`).
    fn cluster_name(&self) -> &str {
        "kubernetes"
    }

    /// Starts an instance for a node called `name` and returns the node as its kubelet registers it
    /// (its name, and `spec.providerID` where the kubelet sets it; nothing the cloud-node controller
    /// would fill in).
    async fn launch(&self, name: &str) -> Result<Node, FixtureError>;

    /// Stops the instance of node `name` (it still exists).
    async fn stop(&self, name: &str) -> Result<(), FixtureError>;

    /// Terminates the instance of node `name` (it is gone).
    async fn terminate(&self, name: &str) -> Result<(), FixtureError>;

    /// The cluster's load balancers, as the cloud holds them.
    async fn load_balancers(&self) -> Result<Vec<CloudLoadBalancer>, FixtureError>;

    /// The cluster's routes, as the cloud holds them (empty when the cloud has no routes).
    async fn routes(&self) -> Result<Vec<CloudRoute>, FixtureError>;

    /// How many changes the cloud has applied so far (its audit log's length: CloudTrail, Cloud Audit
    /// Logs, a recording proxy's count).
    async fn writes(&self) -> Result<u64, FixtureError>;

    /// Makes every request of the provider to its cloud fail (`true`: an outage, a wrong endpoint or
    /// credentials) or succeed again (`false`).
    async fn set_outage(&self, outage: bool) -> Result<(), FixtureError>;

    /// Makes every request of the provider to its cloud take at least `latency` before the cloud acts on it
    /// (a proxy that holds requests, an emulator's knob); zero for none.
    async fn set_latency(&self, latency: Duration) -> Result<(), FixtureError>;
}

/// The suite a check belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Suite {
    /// [`contract`]: the provider asked call by call.
    Contract,
    /// [`controllers`]: the manager's controllers with the provider, against an API server.
    Controllers,
    /// [`fencing`]: a lock taken away mid-flight.
    Fencing,
}

/// One check's future.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send + 'a>>;

/// A named check.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Check {
    /// Its name, which is also its generated test's.
    pub name: &'static str,
    /// Its suite.
    pub suite: Suite,
    /// Runs it against a fixture.
    pub run: for<'a> fn(&'a dyn Fixture) -> CheckFuture<'a>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("name", &self.name)
            .field("suite", &self.suite)
            .finish_non_exhaustive()
    }
}

crate::__checks!(@list const);

/// The check called `name`.
pub fn check(name: &str) -> Option<Check> {
    CHECKS.iter().find(|c| c.name == name).copied()
}

/// Why a check failed: what was asked, what came back, what the controllers need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

const FIXTURE_FAILED: &str = "the fixture failed (not the provider)";

/// How a check that did not fail ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// It judged the provider, and the provider passed.
    Passed,
    /// It could not apply: the provider lacks a capability, as its fixture declares ([`Fixture::lacks`]).
    NotApplicable(String),
}

/// The prefix of a check's "failure" that means it does not apply.
pub(crate) const NOT_APPLICABLE: &str = "not applicable: ";

impl From<FixtureError> for Failure {
    fn from(error: FixtureError) -> Failure {
        Failure(format!("{FIXTURE_FAILED}: {error}"))
    }
}

/// How long one check may take in all before it fails: every wait inside it is bounded more tightly.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one check against a fixture `make` builds, on a runtime of its own; `Err` says why it failed.
/// The generated tests call this; call it yourself to run a check outside a test.
pub fn run_check<F, Fut>(make: impl FnOnce() -> Fut, check: Check) -> Result<Outcome, Failure>
where
    F: Fixture + 'static,
    Fut: Future<Output = F>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("cannot start a runtime for the check: {e}")))?;
    runtime.block_on(async {
        let fixture = make().await;
        if let Some(why) = fixture.unavailable() {
            return Ok(Outcome::NotApplicable(why));
        }
        match tokio::time::timeout(CHECK_TIMEOUT, (check.run)(&fixture)).await {
            Ok(Ok(())) => Ok(Outcome::Passed),
            Ok(Err(failure)) => match failure.0.strip_prefix(NOT_APPLICABLE) {
                Some(why) => Ok(Outcome::NotApplicable(why.to_owned())),
                None => Err(failure),
            },
            Err(_) => Err(Failure(format!(
                "{} did not finish within {CHECK_TIMEOUT:?}",
                check.name
            ))),
        }
    })
}

/// Runs the check called `name` (see [`CHECKS`]) and panics with its failure: the body of each generated
/// test.
#[doc(hidden)]
pub fn run_named<F, Fut>(make: impl FnOnce() -> Fut, name: &str)
where
    F: Fixture + 'static,
    Fut: Future<Output = F>,
{
    let check = check(name).unwrap_or_else(|| panic!("no conformance check is called {name}"));
    match run_check(make, check) {
        Ok(Outcome::Passed) => {}
        // Said where a test runner shows it: not applicable is not passed.
        #[allow(clippy::print_stderr)]
        Ok(Outcome::NotApplicable(why)) => eprintln!("conformance check {name}: not applicable: {why}"),
        Err(failure) => panic!("conformance check {name} failed: {failure}"),
    }
}

/// Runs every check `fault` must fail ([`broken::Fault::failed_checks`]) against fixtures from `make`
/// whose providers have that fault; `Err` names a check that passed anyway (the suite could not tell).
pub fn run_negative_control<F, Fut>(make: impl Fn() -> Fut, fault: broken::Fault) -> Result<(), Failure>
where
    F: Fixture + 'static,
    Fut: Future<Output = F>,
{
    for name in fault.failed_checks() {
        let check = check(name).ok_or_else(|| Failure(format!("{fault:?} names no check {name}")))?;
        let made = make();
        let broken = async move { broken::WithFault::new(made.await, fault) };
        match run_check(move || broken, check) {
            // The fault is in a capability the provider lacks, as its fixture declares.
            Ok(Outcome::NotApplicable(_)) => {}
            Ok(Outcome::Passed) => {
                return Err(Failure(format!(
                    "{name} passed a provider broken with {fault:?}: the check cannot tell"
                )));
            }
            // Failing because the fixture did would show nothing about the check.
            Err(failure) if failure.0.starts_with(FIXTURE_FAILED) => {
                return Err(Failure(format!(
                    "{name} failed with {fault:?}, but for the fixture's reason: {failure}"
                )));
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// The body of each generated negative-control test.
#[doc(hidden)]
pub fn assert_negative_control<F, Fut>(make: impl Fn() -> Fut, fault: broken::Fault)
where
    F: Fixture + 'static,
    Fut: Future<Output = F>,
{
    if let Err(failure) = run_negative_control(make, fault) {
        panic!("negative control {fault:?}: {failure}");
    }
}

/// Generates one `#[test]` per [fault](broken::Fault): the suite must fail a provider broken that way,
/// over the same fixture (see [`run_negative_control`]).
#[macro_export]
macro_rules! negative_controls {
    ($fixture:path) => {
        #[test]
        fn negative_control_gone_on_error() {
            $crate::assert_negative_control($fixture, $crate::broken::Fault::GoneOnError);
        }
        #[test]
        fn negative_control_non_idempotent_ensure() {
            $crate::assert_negative_control($fixture, $crate::broken::Fault::NonIdempotentEnsure);
        }
        #[test]
        fn negative_control_ignores_deadline() {
            $crate::assert_negative_control($fixture, $crate::broken::Fault::IgnoresDeadline);
        }
        #[test]
        fn negative_control_lists_by_cloud_id() {
            $crate::assert_negative_control($fixture, $crate::broken::Fault::ListsByCloudId);
        }
        #[test]
        fn negative_control_refuses_declared_class() {
            $crate::assert_negative_control($fixture, $crate::broken::Fault::RefusesDeclaredClass);
        }
    };
}

/// Generates one `#[test]` per [contract check](contract), each against a fresh fixture from
/// `$fixture`, an `async fn() -> impl Fixture`. Use it once per test file; wrap it in a module to
/// generate the suite for several fixtures.
#[macro_export]
macro_rules! contract_suite {
    ($fixture:path) => {
        $crate::__checks!(@list tests contract $fixture);
    };
}

/// Generates one `#[test]` per [controllers check](controllers), as [`contract_suite!`] does.
#[macro_export]
macro_rules! controllers_suite {
    ($fixture:path) => {
        $crate::__checks!(@list tests controllers $fixture);
    };
}

/// Generates the [fencing check](fencing)'s `#[test]`, as [`contract_suite!`] does.
#[macro_export]
macro_rules! fencing_suite {
    ($fixture:path) => {
        $crate::__checks!(@list tests fencing $fixture);
    };
}

/// Every check's name, by suite, in order: the one list [`CHECKS`] and the suites' generated tests are
/// all made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __checks {
    (@list $($what:tt)*) => {
        $crate::__checks!(@make [$($what)*]
            contract [
            instances_follow_the_instance_through_its_life,
            metadata_describes_the_instance,
            batch_answers_agree_with_single_answers,
            an_outage_is_an_error_never_gone,
            provider_ids_are_checked,
            ensure_is_idempotent_and_a_second_ensure_writes_nothing,
            update_follows_the_nodes,
            delete_is_idempotent,
            a_new_process_adopts_an_existing_load_balancer,
            listed_load_balancers_are_named_as_their_services_and_deleted_whole,
            declared_classes_are_served,
            routes_are_created_listed_and_deleted,
            a_call_abandoned_at_its_deadline_writes_nothing_later,
            a_cancelled_call_writes_nothing_later,
            ]
            controllers [
            nodes_are_initialised_from_the_cloud,
            a_node_is_deleted_only_when_its_instance_is_gone,
            a_service_load_balancer_through_its_life,
            routes_follow_the_nodes,
            ]
            fencing [
            no_cloud_write_lands_after_the_lock_is_lost,
            ]
        );
    };
    (@make [const] contract [$($c:ident,)*] controllers [$($k:ident,)*] fencing [$($f:ident,)*]) => {
        /// Every check of the three suites, in the order the generated tests list them.
        pub const CHECKS: &[Check] = &[
            $(Check { name: stringify!($c), suite: Suite::Contract, run: |fixture| Box::pin(contract::$c(fixture)) },)*
            $(Check { name: stringify!($k), suite: Suite::Controllers, run: |fixture| Box::pin(controllers::$k(fixture)) },)*
            $(Check { name: stringify!($f), suite: Suite::Fencing, run: |fixture| Box::pin(fencing::$f(fixture)) },)*
        ];
    };
    (@make [tests contract $fixture:path] contract [$($name:ident,)*] $($rest:tt)*) => {
        $crate::__checks!(@tests $fixture => $($name,)*);
    };
    (@make [tests controllers $fixture:path] contract [$($c:ident,)*] controllers [$($name:ident,)*] $($rest:tt)*) => {
        $crate::__checks!(@tests $fixture => $($name,)*);
    };
    (@make [tests fencing $fixture:path] contract [$($c:ident,)*] controllers [$($k:ident,)*] fencing [$($name:ident,)*]) => {
        $crate::__checks!(@tests $fixture => $($name,)*);
    };
    (@tests $fixture:path => $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $crate::run_named($fixture, stringify!($name));
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_check_has_a_name_of_its_own() {
        let mut names: Vec<&str> = super::CHECKS.iter().map(|c| c.name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "{names:?}");
        let of = |suite| super::CHECKS.iter().filter(|c| c.suite == suite).count();
        assert_eq!(of(super::Suite::Contract), 14);
        assert_eq!(of(super::Suite::Controllers), 4);
        assert_eq!(of(super::Suite::Fencing), 1);
    }

    #[test]
    fn every_fault_names_checks_that_exist() {
        for fault in super::broken::Fault::ALL {
            assert!(!fault.failed_checks().is_empty(), "{fault:?}");
            for name in fault.failed_checks() {
                assert!(super::check(name).is_some(), "{fault:?}: {name}");
            }
        }
    }
}
