use super::*;

struct Bare;

impl CloudProvider for Bare {
    fn provider_name(&self) -> &str {
        "bare"
    }
}

#[test]
fn the_builtins_are_registered_like_any_other_in_start_order() {
    let registry = ControllerRegistry::builtin();
    let names: Vec<&str> = registry.definitions().map(|d| d.name()).collect();
    assert_eq!(
        names,
        [
            "cloud-node-controller",
            "cloud-node-lifecycle-controller",
            "service-lb-controller",
            "node-route-controller",
            "node-ipam-controller"
        ]
    );
    let catalog_order: Vec<&str> = registry.catalog().runnable().map(|e| e.name.as_str()).collect();
    assert_eq!(catalog_order, names);
    let migrated: Vec<&str> = registry
        .catalog()
        .runnable()
        .filter(|e| e.migrated_by_default)
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        migrated,
        [
            "cloud-node-lifecycle-controller",
            "service-lb-controller",
            "node-route-controller"
        ]
    );
}

#[test]
fn skip_reasons_name_the_missing_capability_the_provider_or_the_setting() {
    let settings = ControllerSettings::defaults("c");
    let registry = ControllerRegistry::builtin();
    let reason = |name: &str| {
        let entry = registry.catalog().resolve(name).unwrap();
        registry.get(entry.name).unwrap().skip_reason(&Bare, &settings)
    };
    assert_eq!(
        reason("cloud-node"),
        Some("the cloud provider does not support instances".to_owned())
    );
    assert_eq!(
        reason("service"),
        Some("the cloud provider does not support load balancers".to_owned())
    );
    let owned = ControllerDefinition::new("tagging-controller", |_| async {}).for_provider("aws");
    assert_eq!(
        owned.skip_reason(&Bare, &settings),
        Some("it belongs to cloud provider \"aws\", and --cloud-provider is \"bare\"".to_owned())
    );
    let off = ControllerDefinition::new("x-controller", |_| async {}).requires_settings(|s| {
        if s.configure_cloud_routes {
            Err("routes are on".into())
        } else {
            Ok(())
        }
    });
    assert_eq!(
        off.skip_reason(&Bare, &settings),
        Some("routes are on".to_owned())
    );
}

#[test]
fn a_name_is_registered_once() {
    let mut registry = Registry::new();
    let clash = ControllerDefinition::new("my-controller", |_| async {}).aliases(&["route"]);
    assert_eq!(
        registry.register_controller(clash).unwrap_err().to_string(),
        "controller name \"route\" is already registered (by node-route-controller)"
    );
    registry
        .register_controller(ControllerDefinition::new("my-controller", |_| async {}))
        .unwrap();
    assert!(
        registry
            .controllers()
            .catalog()
            .resolve("my-controller")
            .unwrap()
            .runnable
    );
}
