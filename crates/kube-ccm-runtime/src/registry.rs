//! What a binary can run: its cloud providers by name, and its controllers.
//!
//! Every controller, the framework's own included, is a [`ControllerDefinition`] registered in a
//! [`ControllerRegistry`]: its canonical name and aliases, whether `--controllers=*` runs it, whether the
//! default leader-migration configuration migrates it, the provider capabilities and settings it needs
//! (so `leader-migration plan` and start-up can say "skipped: …"), and how it runs. The runtime knows
//! controllers only through this table.
//!
//! Names are typed: the registry feeds a [`ControllerCatalog`], so `--controllers` and leader-migration
//! configurations resolve names (and aliases) against exactly what this binary has.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube_ccm_leadermigration::{CatalogError, ControllerCatalog, ControllerName, RunnableController};
use kube_ccm_provider::{CloudProvider, ProviderRegistry, ProviderRegistryError, Refused};

use crate::Binary;
use crate::config::ControllerSettings;
use crate::context::ControllerContext;
use crate::informers::SharedCache;
use kube_ccm_provider::flags::{Flag, FlagValues};

/// A capability of the cloud provider that a controller cannot run without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capability {
    /// [`CloudProvider::instances_v2`] (or the older [`CloudProvider::instances`]).
    Instances,
    /// [`CloudProvider::load_balancer`].
    LoadBalancers,
    /// [`CloudProvider::routes`].
    Routes,
    /// [`CloudProvider::pod_cidrs`].
    PodCidrs,
}

impl Capability {
    /// Whether `provider` has it.
    pub fn is_offered_by(self, provider: &dyn CloudProvider) -> bool {
        match self {
            Capability::Instances => provider.instances_v2().is_some() || provider.instances().is_some(),
            Capability::LoadBalancers => provider.load_balancer().is_some(),
            Capability::Routes => provider.routes().is_some(),
            Capability::PodCidrs => provider.pod_cidrs().is_some(),
        }
    }

    /// As `plan` and logs name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Capability::Instances => "instances",
            Capability::LoadBalancers => "load balancers",
            Capability::Routes => "routes",
            Capability::PodCidrs => "pod CIDRs",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Run = Arc<dyn Fn(ControllerContext) -> BoxFuture<'static, ()> + Send + Sync>;

/// A settings check: `Err(reason)` when the settings turn the controller off.
pub type SettingsCheck = fn(&ControllerSettings) -> Result<(), Refused>;

/// Whether settings ask for something ([`ControllerDefinition::requires_when`]).
pub type SettingsPredicate = fn(&ControllerSettings) -> bool;

/// A check of a controller's flags together: `Err(problem)` stops the manager's start when the controller
/// is enabled (and its provider chosen).
pub type FlagsCheck = fn(&FlagValues) -> Result<(), Refused>;

/// One controller: how it is named, when it runs, and how.
#[derive(Clone)]
pub struct ControllerDefinition {
    name: &'static str,
    aliases: &'static [&'static str],
    disabled_by_default: bool,
    migrated_by_default: bool,
    requires: Vec<Capability>,
    requires_when: Vec<(Capability, &'static str, SettingsPredicate)>,
    provider: Option<&'static str>,
    settings_checks: Vec<SettingsCheck>,
    flags: &'static [Flag],
    flags_checks: Vec<FlagsCheck>,
    event_reporter: Option<&'static str>,
    service_account: Option<&'static str>,
    reads: &'static [SharedCache],
    run: Run,
}

impl fmt::Debug for ControllerDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerDefinition")
            .field("name", &self.name)
            .field("aliases", &self.aliases)
            .field("disabled_by_default", &self.disabled_by_default)
            .field("migrated_by_default", &self.migrated_by_default)
            .field("requires", &self.requires)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl ControllerDefinition {
    /// A controller called `name` (upstream's rule: lower-case words joined by `-`, ending in
    /// `-controller`) that runs `run(context)` until `context.stop()` fires, then returns.
    ///
    /// Enabled by default, not migrated by default, needing nothing.
    pub fn new<F, Fut>(name: &'static str, run: F) -> ControllerDefinition
    where
        F: Fn(ControllerContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        ControllerDefinition {
            name,
            aliases: &[],
            disabled_by_default: false,
            migrated_by_default: false,
            requires: Vec::new(),
            requires_when: Vec::new(),
            provider: None,
            settings_checks: Vec::new(),
            flags: &[],
            flags_checks: Vec::new(),
            event_reporter: None,
            service_account: None,
            reads: &[],
            run: Arc::new(move |context| Box::pin(run(context))),
        }
    }

    /// More names that resolve to it in `--controllers` and leader-migration configurations.
    pub fn aliases(mut self, aliases: &'static [&'static str]) -> ControllerDefinition {
        self.aliases = aliases;
        self
    }

    /// `--controllers=*` leaves it off; it runs only when named.
    pub fn disabled_by_default(mut self) -> ControllerDefinition {
        self.disabled_by_default = true;
        self
    }

    /// The default leader-migration configuration migrates it: kube-controller-manager ran it with an
    /// in-tree cloud provider, so it moves to the cloud-controller-manager during the migration.
    pub fn migrated_by_default(mut self) -> ControllerDefinition {
        self.migrated_by_default = true;
        self
    }

    /// It cannot run unless the provider offers `capability`.
    pub fn requires(mut self, capability: Capability) -> ControllerDefinition {
        self.requires.push(capability);
        self
    }

    /// It needs `capability` when `applies` holds for the settings (described by `setting`, e.g.
    /// `--cidr-allocator-type=CloudAllocator`), and is skipped, saying so, when the provider lacks it.
    pub fn requires_when(
        mut self,
        capability: Capability,
        setting: &'static str,
        applies: SettingsPredicate,
    ) -> ControllerDefinition {
        self.requires_when.push((capability, setting, applies));
        self
    }

    /// It belongs to the provider called `provider` and runs only with `--cloud-provider=<provider>`.
    pub fn for_provider(mut self, provider: &'static str) -> ControllerDefinition {
        self.provider = Some(provider);
        self
    }

    /// It runs only when `check` passes for the manager's settings (for example a flag that turns it off).
    pub fn requires_settings(mut self, check: SettingsCheck) -> ControllerDefinition {
        self.settings_checks.push(check);
        self
    }

    /// Flags it adds to the manager's command line (read, with their values checked, whether or not it
    /// runs; see [`kube_ccm_provider::flags`]). Their names must not be the manager's or another controller's.
    pub fn flags(mut self, flags: &'static [Flag]) -> ControllerDefinition {
        self.flags = flags;
        self
    }

    /// When it is enabled and its provider chosen, `check` must pass for the flags' values or the manager
    /// does not start (upstream's tagging controller exits on an empty `--tags`).
    pub fn validated_by(mut self, check: FlagsCheck) -> ControllerDefinition {
        self.flags_checks.push(check);
        self
    }

    /// Its Events report as `reporter` instead of its name (upstream's service controller reports as
    /// `service-controller`, its route controller as `route_controller`).
    pub fn event_reporter(mut self, reporter: &'static str) -> ControllerDefinition {
        self.event_reporter = Some(reporter);
        self
    }

    /// With `--use-service-account-credentials` it acts as service account `account` in `kube-system`
    /// instead of one named after it (upstream's cloud-node and cloud-node-lifecycle controllers both act as
    /// `node-controller`, its service controller as `service-controller`), so the cluster's bootstrap role
    /// `system:controller:<account>` applies.
    pub fn service_account(mut self, account: &'static str) -> ControllerDefinition {
        self.service_account = Some(account);
        self
    }

    /// The shared caches it reads. A cache starts when a controller first reads it; with `--warm-standby`
    /// the caches the process's controllers declare here start before it leads instead (decision 0036).
    /// Undeclared, a cache it reads starts when it first runs.
    pub fn reads(mut self, caches: &'static [SharedCache]) -> ControllerDefinition {
        self.reads = caches;
        self
    }

    /// The shared caches it declared it reads ([`Self::reads`]).
    pub fn cache_reads(&self) -> &'static [SharedCache] {
        self.reads
    }

    /// The service account it acts as with `--use-service-account-credentials`.
    pub fn account(&self) -> &'static str {
        self.service_account.unwrap_or(self.name)
    }

    /// The canonical name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// What its Events name as their reporting controller.
    pub fn reporter(&self) -> &'static str {
        self.event_reporter.unwrap_or(self.name)
    }

    /// The flags it adds.
    pub fn declared_flags(&self) -> &'static [Flag] {
        self.flags
    }

    /// The first problem [`ControllerDefinition::validated_by`]'s checks find in `flags`.
    pub fn flags_problem(&self, flags: &FlagValues) -> Option<String> {
        self.flags_checks
            .iter()
            .find_map(|check| check(flags).err().map(|r| r.to_string()))
    }

    /// The provider it belongs to, if any.
    pub fn provider(&self) -> Option<&'static str> {
        self.provider
    }

    /// Why it will not run with this provider and these settings; `None` when it can.
    pub fn skip_reason(&self, provider: &dyn CloudProvider, settings: &ControllerSettings) -> Option<String> {
        if let Some(owner) = self.provider
            && owner != provider.provider_name()
        {
            return Some(format!(
                "it belongs to cloud provider {owner:?}, and --cloud-provider is {:?}",
                provider.provider_name()
            ));
        }
        if let Some(reason) = self
            .settings_checks
            .iter()
            .find_map(|check| check(settings).err())
        {
            return Some(reason.to_string());
        }
        if let Some(missing) = self.requires.iter().find(|c| !c.is_offered_by(provider)) {
            return Some(format!("the cloud provider does not support {missing}"));
        }
        self.requires_when
            .iter()
            .find(|(capability, _, applies)| applies(settings) && !capability.is_offered_by(provider))
            .map(|(missing, setting, _)| format!("the cloud provider does not support {missing} ({setting})"))
    }

    /// Why the settings alone keep it from running; `None` when they do not.
    pub fn settings_skip_reason(&self, settings: &ControllerSettings) -> Option<String> {
        self.settings_checks
            .iter()
            .find_map(|check| check(settings).err().map(|r| r.to_string()))
    }

    /// What it needs beyond its settings, in words (`instances`, `--cloud-provider=aws`), for `plan`.
    pub fn needs(&self) -> Vec<String> {
        self.provider
            .map(|p| format!("--cloud-provider={p}"))
            .into_iter()
            .chain(self.requires.iter().map(|c| c.to_string()))
            .chain(
                self.requires_when
                    .iter()
                    .map(|(capability, setting, _)| format!("{capability} with {setting}")),
            )
            .collect()
    }

    /// Runs the controller until its context's stop token fires.
    pub(crate) fn run(&self, context: ControllerContext) -> BoxFuture<'static, ()> {
        (self.run)(context)
    }

    fn runnable(&self) -> RunnableController {
        RunnableController {
            name: self.name,
            aliases: self.aliases,
            disabled_by_default: self.disabled_by_default,
            migrated_by_default: self.migrated_by_default,
        }
    }
}

/// The controllers of a binary, in start order. [`ControllerRegistry::builtin`] (also its `Default`) holds
/// the framework's own.
#[derive(Clone, Debug)]
pub struct ControllerRegistry {
    definitions: Vec<Arc<ControllerDefinition>>,
    catalog: ControllerCatalog,
}

impl ControllerRegistry {
    /// No controllers (names of Kubernetes' controllers are still recognised in configurations).
    pub fn empty() -> ControllerRegistry {
        ControllerRegistry {
            definitions: Vec::new(),
            catalog: ControllerCatalog::kubernetes(),
        }
    }

    /// Adds a controller. Its name and aliases must be new, or name a well-known controller this binary
    /// does not run yet (a provider's `node-ipam-controller`).
    pub fn register(&mut self, definition: ControllerDefinition) -> Result<(), CatalogError> {
        self.catalog = self.catalog.clone().with_runnable(definition.runnable())?;
        self.definitions.push(Arc::new(definition));
        Ok(())
    }

    /// Every name this binary knows, for resolving `--controllers` and configurations.
    pub fn catalog(&self) -> &ControllerCatalog {
        &self.catalog
    }

    /// The controller called `name`.
    pub fn get(&self, name: ControllerName) -> Option<&ControllerDefinition> {
        self.definitions
            .iter()
            .map(Arc::as_ref)
            .find(|d| d.name == name.as_str())
    }

    /// Every controller, in registration (start) order.
    pub fn definitions(&self) -> impl Iterator<Item = &ControllerDefinition> {
        self.definitions.iter().map(Arc::as_ref)
    }
}

/// A provider or controller that cannot be registered. New kinds may be added (`#[non_exhaustive]`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// A cloud provider's name is taken.
    #[error(transparent)]
    Provider(#[from] ProviderRegistryError),
    /// A controller's name or alias is taken or malformed.
    #[error(transparent)]
    Controller(#[from] CatalogError),
    /// A flag of a controller or provider is another's.
    #[error("{owner}'s flag --{flag} is already {existing}'s")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// Who declares it (`controller NAME`, `provider NAME`).
        owner: String,
        /// Who declared it first.
        existing: String,
    },
    /// A webhook's name or path is taken or malformed.
    #[error(transparent)]
    Webhook(#[from] crate::webhooks::WebhookError),
    /// The binary's name or version cannot be shown in a `User-Agent` or `--version`.
    #[error("binary {field} {value:?}: {problem}")]
    Binary {
        /// `name` or `version`.
        field: &'static str,
        /// What was given.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Everything a binary can run: cloud providers by name, and controllers. A provider's own `main` builds
/// one and hands it to `kube_ccm_cli::main`.
#[derive(Default)]
pub struct Registry {
    providers: ProviderRegistry,
    controllers: ControllerRegistry,
    /// Flags of providers, with the provider's name.
    provider_flags: Vec<(String, &'static Flag)>,
    webhooks: Vec<crate::webhooks::WebhookDefinition>,
    binary: Binary,
}

impl Registry {
    /// Names the binary and its version (a provider's binary passes `env!("CARGO_PKG_NAME")` and
    /// `env!("CARGO_PKG_VERSION")`); see [`Binary::new`].
    pub fn set_binary(&mut self, name: &str, version: &str) -> Result<(), RegistrationError> {
        self.binary = Binary::new(name, version)?;
        Ok(())
    }

    /// What the binary says it is.
    pub fn binary(&self) -> &Binary {
        &self.binary
    }

    /// The framework's controllers and no provider.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers a cloud provider's factory under `name` (`--cloud-provider=<name>`).
    pub fn register_provider<F, Fut>(&mut self, name: &str, factory: F) -> Result<(), RegistrationError>
    where
        F: Fn(Option<Vec<u8>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'static,
    {
        Ok(self.providers.register(name, factory)?)
    }

    /// Registers a controller (a provider's own, usually with [`ControllerDefinition::for_provider`]).
    pub fn register_controller(&mut self, definition: ControllerDefinition) -> Result<(), RegistrationError> {
        for flag in definition.flags {
            self.flag_is_new(flag, || format!("controller {}", definition.name))?;
        }
        Ok(self.controllers.register(definition)?)
    }

    /// Declares the flags of the provider `provider` (`kube_ccm_provider::flags`): offered on the command
    /// line whatever `--cloud-provider` names, as upstream's binaries offer the flags of every provider
    /// built in, and given to the provider in `InitializeContext::flags`.
    pub fn register_provider_flags(
        &mut self,
        provider: &str,
        flags: &'static [Flag],
    ) -> Result<(), RegistrationError> {
        for flag in flags {
            self.flag_is_new(flag, || format!("provider {provider}"))?;
            self.provider_flags.push((provider.to_owned(), flag));
        }
        Ok(())
    }

    /// `Err` when a provider or controller already declares `flag`.
    fn flag_is_new(&self, flag: &Flag, owner: impl FnOnce() -> String) -> Result<(), RegistrationError> {
        let existing = self
            .controllers
            .definitions()
            .find(|d| d.flags.iter().any(|f| f.name == flag.name))
            .map(|d| format!("controller {}", d.name))
            .or_else(|| {
                self.provider_flags
                    .iter()
                    .find(|(_, f)| f.name == flag.name)
                    .map(|(provider, _)| format!("provider {provider}"))
            });
        match existing {
            Some(existing) => Err(RegistrationError::Flag {
                flag: flag.name,
                owner: owner(),
                existing,
            }),
            None => Ok(()),
        }
    }

    /// Registers an admission webhook (served on `--webhook-secure-port` with the
    /// `CloudControllerManagerWebhook` feature gate, when `--webhooks` enables it).
    pub fn register_webhook(
        &mut self,
        definition: crate::webhooks::WebhookDefinition,
    ) -> Result<(), RegistrationError> {
        crate::webhooks::check_definitions(&self.webhooks, &definition)?;
        self.webhooks.push(definition);
        Ok(())
    }

    /// The webhooks, in registration order.
    pub fn webhooks(&self) -> &[crate::webhooks::WebhookDefinition] {
        &self.webhooks
    }

    /// The providers' flags, each with its provider's name, in registration order.
    pub fn provider_flags(&self) -> impl Iterator<Item = (&str, &'static Flag)> {
        self.provider_flags.iter().map(|(p, f)| (p.as_str(), *f))
    }

    /// The cloud providers.
    pub fn providers(&self) -> &ProviderRegistry {
        &self.providers
    }

    /// The controllers.
    pub fn controllers(&self) -> &ControllerRegistry {
        &self.controllers
    }
}

#[cfg(test)]
mod tests;
