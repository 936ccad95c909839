//! `example-tagging-controller`: tags each node's instance with `kubernetes-node=<node name>`, as
//! cloud-provider-aws's tagging controller tags EC2 instances. Off by default: enable it with
//! `--controllers=*,example-tagging-controller`.

use std::time::Duration;

use kube_ccm::runtime::{Capability, ControllerContext, ControllerDefinition, SharedCache};

use crate::{ExampleCloud, PROVIDER_NAME};

/// The tag it sets.
pub const TAG: &str = "kubernetes-node";

// ANCHOR: definition
/// The controller, as the binary registers it.
pub fn definition() -> ControllerDefinition {
    ControllerDefinition::new("example-tagging-controller", run)
        .aliases(&["example-tagging"])
        .for_provider(PROVIDER_NAME) // only with --cloud-provider=example
        .requires(Capability::Instances)
        .reads(&[SharedCache::Nodes]) // a warm standby fills it before it leads
        .disabled_by_default()
}
// ANCHOR_END: definition

// ANCHOR: run
/// Runs until `context.stop()` fires. Every cloud call goes through `context.call_context()`, whose
/// deadline ends with the lock this controller runs under: a process that lost its lock stops acting.
async fn run(context: ControllerContext) {
    let Some(cloud) = context.provider_as::<ExampleCloud>() else {
        tracing::error!("example-tagging-controller needs --cloud-provider=example");
        return;
    };
    let nodes = context.nodes().store();
    tokio::select! {
        () = context.stop().cancelled() => return,
        () = context.nodes().ready() => context.set_started(),
    }
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            () = context.stop().cancelled() => return,
            _ = tick.tick() => {}
        }
        let _pass = context.working();
        let wanted: Vec<(String, String)> = nodes
            .state()
            .iter()
            .filter_map(|node| {
                let id = ExampleCloud::instance_id(node.provider_id()?)?;
                Some((id.to_owned(), node.name().to_owned()))
            })
            .collect();
        let cx = context.call_context();
        let tagged = cx
            .call(
                "TagInstances",
                cloud.cloud.update(move |state| {
                    let mut changed = 0;
                    for (id, name) in wanted {
                        let instance = state.instances.iter_mut().find(|i| i.id == id);
                        if let Some(instance) = instance.filter(|i| i.tags.get(TAG) != Some(&name)) {
                            instance.tags.insert(TAG.to_owned(), name);
                            changed += 1;
                        }
                    }
                    changed
                }),
            )
            .await;
        match tagged {
            Ok(0) => {}
            Ok(changed) => tracing::info!(changed, "tagged instances"),
            Err(error) => tracing::warn!(%error, "cannot tag instances"),
        }
    }
}
// ANCHOR_END: run
