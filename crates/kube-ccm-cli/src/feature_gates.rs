//! `--feature-gates`, read as upstream's cloud-controller-manager reads it (component-base's feature gate):
//! `Name=bool` pairs separated by commas; an unknown name, a value that is not a Go boolean, or a locked gate
//! set away from its default is an error naming it; `AllAlpha`/`AllBeta` set every alpha/beta gate not named
//! on their own.
//!
//! The known gates are those of upstream's manager at Kubernetes v1.37.2 (`k8s.io/cloud-provider` and what
//! it links: the generic API server's, component-base's logging and metrics, controller-manager's), read from
//! the running upstream binary's own gate registry. Each gate here either changes what this manager does as it
//! does upstream, or says why it has no effect ([`Gate::effect`]); `kubernetes_feature_enabled` exposes them
//! all, as upstream's manager does.

use std::collections::BTreeMap;

/// A gate's maturity, as upstream labels it (`stage` of `kubernetes_feature_enabled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Alpha,
    Beta,
    /// Generally available.
    Ga,
    Deprecated,
}

impl Stage {
    /// Upstream's text: `ALPHA`, `BETA`, `` (GA), `DEPRECATED`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

/// One known gate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    pub(crate) name: &'static str,
    pub(crate) default: bool,
    pub(crate) stage: Stage,
    /// Upstream refuses a value other than the default.
    pub(crate) locked: bool,
    /// What it does here.
    pub(crate) effect: Effect,
}

/// What a gate does in this manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// It changes this manager's behaviour as it changes upstream's.
    Applies,
    /// It has no effect here, for this reason.
    None(&'static str),
}

const SERVER_SIDE: Effect =
    Effect::None("a kube-apiserver feature: nothing of it runs in a controller manager");

const fn gate(name: &'static str, default: bool, stage: Stage, effect: Effect) -> Gate {
    Gate {
        name,
        default,
        stage,
        locked: false,
        effect,
    }
}

const fn locked(name: &'static str, default: bool, stage: Stage) -> Gate {
    Gate {
        name,
        default,
        stage,
        locked: true,
        effect: Effect::None("locked to its default upstream"),
    }
}

use Stage::{Alpha, Beta, Deprecated, Ga};

/// The gates of upstream's cloud-controller-manager at Kubernetes v1.37.2, by name.
pub(crate) const GATES: &[Gate] = &[
    gate("APIResponseCompression", true, Beta, SERVER_SIDE),
    gate("APIServerIdentity", true, Beta, SERVER_SIDE),
    gate("APIServerWebhookAuthenticationToken", false, Alpha, SERVER_SIDE),
    gate("APIServingWithRoutine", false, Alpha, SERVER_SIDE),
    locked("AggregatedDiscoveryRemoveBetaType", true, Deprecated),
    gate("AllAlpha", false, Alpha, Effect::Applies),
    gate("AllBeta", false, Beta, Effect::Applies),
    gate("AllowParsingUserUIDFromCertAuth", true, Beta, SERVER_SIDE),
    gate("AllowUnsafeMalformedObjectDeletion", true, Beta, SERVER_SIDE),
    gate("CBORServingAndStorage", false, Alpha, SERVER_SIDE),
    gate(
        "CloudControllerManagerWatchBasedRoutesReconciliation",
        false,
        Alpha,
        Effect::None(
            "the route controller here always starts its next round early when a node is added, deleted or changes its pod CIDRs or addresses (never sooner than --route-reconciliation-period after the last), which is what this gate turns on upstream",
        ),
    ),
    gate("CloudControllerManagerWebhook", false, Alpha, Effect::Applies),
    gate(
        "ComponentFlagz",
        true,
        Beta,
        Effect::None("no /flagz endpoint is served"),
    ),
    gate(
        "ComponentStatusz",
        true,
        Beta,
        Effect::None("no /statusz endpoint is served"),
    ),
    gate("ConcurrentWatchObjectDecode", true, Beta, SERVER_SIDE),
    gate(
        "ConsistentListFromCacheSkipTimeoutFallback",
        false,
        Alpha,
        SERVER_SIDE,
    ),
    gate("ConstrainedImpersonation", true, Beta, SERVER_SIDE),
    gate(
        "ContextualLogging",
        true,
        Beta,
        Effect::None("every log line carries its controller and object as fields already"),
    ),
    gate(
        "ControllerManagerReleaseLeaderElectionLockOnExit",
        false,
        Alpha,
        Effect::None(
            "locks are always released on SIGTERM here, once everything under them stopped (see --on-lost-leadership)",
        ),
    ),
    gate(
        "CoordinatedLeaderElection",
        false,
        Beta,
        Effect::None(
            "the elector here is client-go's Lease protocol; it keeps the Lease fields of coordinated election it does not own",
        ),
    ),
    locked("DeclarativeValidation", true, Ga),
    gate("DeclarativeValidationBeta", true, Beta, SERVER_SIDE),
    locked("DeclarativeValidationTakeover", false, Deprecated),
    gate("DetectCacheInconsistency", true, Beta, SERVER_SIDE),
    gate("EtcdRangeStream", true, Beta, SERVER_SIDE),
    gate("ExcludeAdmissionWebhookVirtualResources", true, Beta, SERVER_SIDE),
    gate("KMSv1", false, Deprecated, SERVER_SIDE),
    gate("ListFromCacheSnapshot", true, Beta, SERVER_SIDE),
    gate("LoggingAlphaOptions", false, Alpha, Effect::Applies),
    gate(
        "LoggingBetaOptions",
        true,
        Beta,
        Effect::None("it gates options of the JSON format that upstream's manager does not register"),
    ),
    gate("ManifestBasedAdmissionControlConfig", true, Beta, SERVER_SIDE),
    gate("MutatingAdmissionPolicy", true, Ga, SERVER_SIDE),
    gate(
        "NativeHistograms",
        true,
        Beta,
        Effect::None("histograms are exposed with classic buckets"),
    ),
    gate("OpenAPIEnums", true, Beta, SERVER_SIDE),
    gate("RemoteRequestHeaderUID", true, Beta, SERVER_SIDE),
    locked("SeparateCacheWatchRPC", false, Deprecated),
    gate("ShardedListAndWatch", false, Alpha, SERVER_SIDE),
    gate("SizeBasedListCostEstimate", true, Beta, SERVER_SIDE),
    gate("StorageVersionAPI", false, Alpha, SERVER_SIDE),
    gate("StorageVersionHash", true, Beta, SERVER_SIDE),
    gate(
        "StructuredAuthenticationConfigurationEgressSelector",
        true,
        Beta,
        SERVER_SIDE,
    ),
    gate(
        "StructuredAuthenticationConfigurationJWKSMetrics",
        true,
        Beta,
        SERVER_SIDE,
    ),
    gate("TokenRequestServiceAccountUIDValidation", true, Beta, SERVER_SIDE),
    gate("UnauthenticatedHTTP2DOSMitigation", true, Beta, SERVER_SIDE),
    gate("UnknownVersionInteroperabilityProxy", true, Beta, SERVER_SIDE),
    locked("WatchCacheInitializationPostStartHook", true, Ga),
    gate(
        "WatchList",
        true,
        Beta,
        Effect::None("the caches here list, then watch (kube-runtime's default), whatever the gate says"),
    ),
    gate("WatchListCompression", true, Beta, SERVER_SIDE),
    gate("WebhookRoundTripLoadBalancing", true, Beta, SERVER_SIDE),
];

/// The gates' values: defaults, overridden by `--feature-gates`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            enabled: GATES.iter().map(|g| (g.name, g.default)).collect(),
        }
    }
}

fn find(name: &str) -> Option<&'static Gate> {
    GATES.iter().find(|g| g.name == name)
}

/// Go's `strconv.ParseBool`.
fn go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

impl FeatureGates {
    /// `--feature-gates`' value: errors as upstream words them, after `--feature-gates: `. Warnings (setting
    /// a GA or deprecated gate) are returned beside the gates.
    pub(crate) fn parse(text: &str) -> Result<(FeatureGates, Vec<String>), String> {
        let mut gates = FeatureGates::default();
        let mut warnings = Vec::new();
        let mut explicit: BTreeMap<&'static str, bool> = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(format!(
                    "--feature-gates: malformed pair, expect string=bool: {pair:?}"
                ));
            };
            let (name, value) = (name.trim(), value.trim());
            let gate =
                find(name).ok_or_else(|| format!("--feature-gates: unrecognized feature gate: {name}"))?;
            let enabled = go_bool(value).ok_or_else(|| {
                format!(
                    "--feature-gates: invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
                )
            })?;
            if gate.locked && enabled != gate.default {
                return Err(format!(
                    "--feature-gates: cannot set feature gate {name} to {enabled}, feature is locked to {}",
                    gate.default
                ));
            }
            match gate.stage {
                Ga => warnings.push(format!(
                    "Setting GA feature gate {name}={enabled}. It will be removed in a future release."
                )),
                Deprecated => warnings.push(format!(
                    "Setting deprecated feature gate {name}={enabled}. It will be removed in a future release."
                )),
                Alpha | Beta => {}
            }
            explicit.insert(gate.name, enabled);
        }
        // AllAlpha and AllBeta move every gate of their stage that was not named itself.
        for (all, stage) in [("AllAlpha", Alpha), ("AllBeta", Beta)] {
            if let Some(&value) = explicit.get(all) {
                for gate in GATES
                    .iter()
                    .filter(|g| g.stage == stage && !explicit.contains_key(g.name))
                {
                    gates.enabled.insert(gate.name, value);
                }
            }
        }
        gates.enabled.extend(explicit);
        Ok((gates, warnings))
    }

    /// Whether `name` (a known gate) is on.
    pub(crate) fn enabled(&self, name: &str) -> bool {
        self.enabled.get(name).copied().unwrap_or(false)
    }

    /// Every gate with its value, by name.
    pub(crate) fn all(&self) -> impl Iterator<Item = (&'static Gate, bool)> + '_ {
        GATES.iter().map(|g| (g, self.enabled(g.name)))
    }

    /// The gates set away from their defaults that have no effect here, with why: the manager logs them at
    /// start, so an operator knows.
    pub(crate) fn without_effect(&self) -> Vec<(&'static str, bool, &'static str)> {
        self.all()
            .filter(|(gate, on)| *on != gate.default)
            .filter_map(|(gate, on)| match gate.effect {
                Effect::None(why) => Some((gate.name, on, why)),
                Effect::Applies => None,
            })
            .collect()
    }
}

/// The gate reference of `docs/operations.md`: every gate with its default, stage and what it does here.
#[cfg(test)]
pub(crate) fn reference() -> String {
    let mut text = String::from("| Gate | Default | Stage | Here |\n|---|---|---|---|\n");
    for gate in GATES {
        let stage = match gate.stage {
            Ga => "GA",
            other => other.label(),
        };
        let locked = if gate.locked { " (locked)" } else { "" };
        let here = match gate.effect {
            Effect::Applies => match gate.name {
                "AllAlpha" | "AllBeta" => "sets every gate of its stage not named itself",
                "LoggingAlphaOptions" => {
                    "allows `--log-text-split-stream` (implemented) and `--log-text-info-buffer-size` (accepted)"
                }
                _ => "as upstream",
            },
            Effect::None(why) => why,
        };
        text.push_str(&format!(
            "| `{}` | `{}` | {stage}{locked} | {here} |\n",
            gate.name, gate.default
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/operations.md` lists every gate as [`reference`] renders it. To regenerate:
    /// `UPDATE_DOCS=1 cargo test -p kube-ccm-cli --lib lists_every_gate`.
    #[test]
    fn the_operations_guide_lists_every_gate() {
        const BEGIN: &str = "<!-- feature gate reference: generated by feature_gates::reference -->\n";
        const END: &str = "<!-- end of the feature gate reference -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let start = text.find(BEGIN).expect("the reference's opening marker") + BEGIN.len();
        let end = start + text[start..].find(END).expect("the reference's closing marker");
        let generated = reference();
        if text[start..end] != generated {
            if std::env::var_os("UPDATE_DOCS").is_some() {
                std::fs::write(&path, format!("{}{generated}{}", &text[..start], &text[end..])).unwrap();
                return;
            }
            panic!(
                "docs/operations.md's feature gate reference is out of date; run `UPDATE_DOCS=1 cargo test -p kube-ccm-cli --lib lists_every_gate`. Generated:\n{generated}"
            );
        }
    }

    #[test]
    fn gates_parse_as_upstream_reads_them() {
        let (gates, warnings) = FeatureGates::parse("").unwrap();
        assert_eq!(gates, FeatureGates::default());
        assert!(warnings.is_empty());
        assert!(gates.enabled("LoggingBetaOptions") && !gates.enabled("LoggingAlphaOptions"));

        let (gates, _) = FeatureGates::parse(" LoggingAlphaOptions=true , ContextualLogging=F").unwrap();
        assert!(gates.enabled("LoggingAlphaOptions"));
        assert!(!gates.enabled("ContextualLogging"));

        for (text, error) in [
            (
                "NoSuchGate=true",
                "--feature-gates: unrecognized feature gate: NoSuchGate",
            ),
            (
                "LoggingAlphaOptions=maybe",
                "--feature-gates: invalid value of LoggingAlphaOptions=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax",
            ),
            (
                "LoggingAlphaOptions",
                "--feature-gates: malformed pair, expect string=bool: \"LoggingAlphaOptions\"",
            ),
            (
                "DeclarativeValidation=false",
                "--feature-gates: cannot set feature gate DeclarativeValidation to false, feature is locked to true",
            ),
            (
                "loggingalphaoptions=true",
                "--feature-gates: unrecognized feature gate: loggingalphaoptions",
            ),
        ] {
            assert_eq!(FeatureGates::parse(text).unwrap_err(), error, "{text}");
        }
        let (_, warnings) = FeatureGates::parse("DeclarativeValidation=true,KMSv1=false").unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
    }

    #[test]
    fn all_alpha_and_all_beta_move_the_gates_not_named_themselves() {
        let (gates, _) = FeatureGates::parse("AllAlpha=true,CBORServingAndStorage=false").unwrap();
        assert!(gates.enabled("LoggingAlphaOptions"));
        assert!(!gates.enabled("CBORServingAndStorage"));
        assert!(
            gates.enabled("LoggingBetaOptions"),
            "beta gates keep their defaults"
        );
        let (gates, _) = FeatureGates::parse("AllBeta=false").unwrap();
        assert!(!gates.enabled("LoggingBetaOptions"));
        assert!(gates.enabled("MutatingAdmissionPolicy"), "GA gates keep theirs");
    }

    #[test]
    fn every_gate_is_known_once_and_says_what_it_does() {
        let mut names: Vec<&str> = GATES.iter().map(|g| g.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a gate is listed twice");
        assert_eq!(before, 49, "upstream's manager knows 49 gates at v1.37.2");
        let (gates, _) = FeatureGates::parse(
            "CoordinatedLeaderElection=true,CloudControllerManagerWebhook=true,AllBeta=true",
        )
        .unwrap();
        let quiet: Vec<&str> = gates.without_effect().iter().map(|(n, _, _)| *n).collect();
        assert!(quiet.contains(&"CoordinatedLeaderElection"), "{quiet:?}");
        assert!(
            !quiet.contains(&"CloudControllerManagerWebhook"),
            "it serves the webhooks"
        );
        assert!(!quiet.contains(&"AllBeta"));
    }
}
