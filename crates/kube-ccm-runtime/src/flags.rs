//! Flags a binary's own controllers add to the manager's command line, as upstream's AWS manager adds
//! `--tags` and `--resources` for its tagging controller: `kube_ccm_provider::flags`, where providers
//! declare theirs too, with its `Flag` named [`ControllerFlag`] here.
//!
//! A [`ControllerDefinition`](crate::ControllerDefinition) declares its flags
//! ([`ControllerDefinition::flags`](crate::ControllerDefinition::flags)); the running controller reads
//! them from [`ControllerSettings::flags`](crate::ControllerSettings::flags).

pub use kube_ccm_provider::flags::{Flag as ControllerFlag, FlagCheck, FlagKind, FlagValue, FlagValues};
