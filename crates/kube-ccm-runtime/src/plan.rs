//! Where each controller runs for a manager: leader migration's plan, with why one that would run cannot.

use std::collections::BTreeMap;

use kube_ccm_leadermigration::{ControllerName, Placement, PlanInput, Planned, plan};
use kube_ccm_provider::CloudProvider;

use crate::config::ControllerSettings;
use crate::registry::ControllerRegistry;

/// A controller, where it runs for this manager, and why it will not run when it will not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedController {
    /// Its canonical name.
    pub controller: ControllerName,
    /// Placement by leader migration and `--controllers`.
    pub placement: Placement,
    /// Set when the controller would run here but cannot (its capability is missing, a setting is off).
    pub skipped: Option<String>,
}

impl PlannedController {
    /// Whether it starts when its lock is held.
    pub fn runs(&self) -> bool {
        matches!(
            self.placement,
            Placement::Main { .. } | Placement::Migration { .. }
        ) && self.skipped.is_none()
    }
}

/// Where each controller of `controllers` runs ([`kube_ccm_leadermigration::plan`]), and why one that would run
/// cannot: its provider, settings or capabilities. Without a provider, only the settings are checked.
pub fn plan_controllers(
    controllers: &ControllerRegistry,
    input: PlanInput<'_>,
    provider: Option<&dyn CloudProvider>,
    settings: &ControllerSettings,
) -> Vec<PlannedController> {
    plan(input)
        .into_iter()
        .map(
            |Planned {
                 controller,
                 placement,
             }| {
                let skipped = match placement {
                    Placement::Main { .. } | Placement::Migration { .. } => match controllers.get(controller)
                    {
                        Some(definition) => match provider {
                            Some(provider) => definition.skip_reason(provider, settings),
                            None => definition.settings_skip_reason(settings),
                        },
                        None => Some("no implementation is registered for this controller".to_owned()),
                    },
                    Placement::Elsewhere { .. } | Placement::Disabled => None,
                };
                PlannedController {
                    controller,
                    placement,
                    skipped,
                }
            },
        )
        .collect()
}

/// Placements by lock, for logs and tests.
pub fn summarize(planned: &[PlannedController]) -> BTreeMap<String, Vec<String>> {
    let mut summary: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in planned {
        let key = match (&p.skipped, p.placement.lease()) {
            (Some(_), _) => "skipped".to_owned(),
            (None, Some(lease)) => lease.to_owned(),
            (None, None) => p.placement.lock_name().to_owned(),
        };
        summary
            .entry(key)
            .or_default()
            .push(p.controller.as_str().to_owned());
    }
    summary
}
