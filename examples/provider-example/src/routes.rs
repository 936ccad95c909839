//! Routes to nodes' pod ranges.

use kube_ccm::async_trait;
use kube_ccm::provider::{CallContext, CloudError, Route, Routes};

use crate::ExampleCloud;
use crate::cloud;

#[async_trait]
impl Routes for ExampleCloud {
    async fn list_routes(&self, cx: &CallContext, _cluster_name: &str) -> Result<Vec<Route>, CloudError> {
        let state = cx.guard(self.cloud.read()).await?;
        Ok(state
            .routes
            .iter()
            .map(|r| Route {
                name: r.name.clone(),
                target_node: r.node.clone(),
                destination_cidr: r.cidr.clone(),
                // A route to an instance that is gone drops traffic: the route controller deletes it.
                blackhole: !state
                    .instances
                    .iter()
                    .any(|i| i.name == r.node && i.state != "terminated"),
                ..Route::default()
            })
            .collect())
    }

    async fn create_route(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        let wanted = cloud::Route {
            name: name_hint.to_owned(),
            node: route.target_node.clone(),
            cidr: route.destination_cidr.clone(),
        };
        cx.guard(self.cloud.update(move |state| {
            state.routes.retain(|r| r.name != wanted.name);
            state.routes.push(wanted);
        }))
        .await
    }

    async fn delete_route(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        let name = route.name.clone();
        cx.guard(
            self.cloud
                .update(move |state| state.routes.retain(|r| r.name != name)),
        )
        .await
    }
}
