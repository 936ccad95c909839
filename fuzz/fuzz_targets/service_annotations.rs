//! Any JSON as a Service: what every provider reads of it (source ranges, health checks, the AWS
//! classic ELB's and NLB's annotations, GCE's external and internal plans) is a value or an error, never
//! a panic.
#![no_main]

use k8s_openapi::api::core::v1::Service;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(service) = serde_json::from_slice::<Service>(data) else {
        return;
    };
    let _ = kube_ccm_provider::service::requested_source_ranges(&service);
    let _ = kube_ccm_provider::service::load_balancer_source_ranges(&service);
    let _ = kube_ccm_provider::service::health_check_path_port(&service);
    let _ = kube_ccm_provider::service::needs_health_check(&service);
    let _ = kube_ccm_provider::service::wants_default_load_balancer(&service);
    let _ = kube_ccm_provider::service::ip_families(&service);
    let _ = kube_ccm_provider::service::ip_family_policy(&service);
    let _ = kube_ccm_aws::load_balancer::kind(&service);
    let _ = kube_ccm_aws::load_balancer::annotated_subnets(&service);
    let _ = kube_ccm_aws::load_balancer::classic::wanted(&service);
    let _ = kube_ccm_aws::load_balancer::network::wanted(&service, None, false);
    let _ = kube_ccm_aws::load_balancer::network::wanted(&service, None, true);
    let _ = kube_ccm_gce::load_balancer::external::plan(&service, "cluster");
    let _ = kube_ccm_gce::load_balancer::internal::plan(&service, "cluster");
});
