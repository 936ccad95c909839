//! Providers by name, registered explicitly by the binary (no global registry).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::CloudProvider;

/// Builds a provider from the bytes of `--cloud-config` (None when not given).
pub type ProviderFactory = Box<
    dyn Fn(
            Option<Vec<u8>>,
        )
            -> BoxFuture<'static, Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + Sync,
>;

/// Why a provider cannot be registered or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderRegistryError {
    /// Two factories for one name.
    #[error("cloud provider {0:?} was registered twice")]
    Duplicate(String),
    /// No factory for the name.
    #[error("--cloud-provider: unknown cloud provider {name:?} (this binary has: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// Registered names, comma-separated.
        known: String,
    },
    /// The factory failed (typically on its cloud-config).
    #[error("could not init cloud provider {name:?}: {source}")]
    Init {
        /// The provider.
        name: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Name → factory.
#[derive(Default)]
pub struct ProviderRegistry {
    factories: BTreeMap<String, ProviderFactory>,
}

impl ProviderRegistry {
    /// An empty registry.
    pub fn new() -> ProviderRegistry {
        ProviderRegistry::default()
    }

    /// Registers a factory.
    pub fn register<F, Fut>(&mut self, name: &str, factory: F) -> Result<(), ProviderRegistryError>
    where
        F: Fn(Option<Vec<u8>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'static,
    {
        if self.factories.contains_key(name) {
            return Err(ProviderRegistryError::Duplicate(name.to_owned()));
        }
        self.factories
            .insert(name.to_owned(), Box::new(move |config| Box::pin(factory(config))));
        Ok(())
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Whether a provider called `name` is registered (an error naming the known ones when not), so a
    /// command line can be refused before anything starts.
    pub fn check(&self, name: &str) -> Result<(), ProviderRegistryError> {
        if self.factories.contains_key(name) {
            Ok(())
        } else {
            Err(ProviderRegistryError::Unknown {
                name: name.to_owned(),
                known: self.names().collect::<Vec<_>>().join(", "),
            })
        }
    }

    /// Builds the provider called `name`.
    pub async fn build(
        &self,
        name: &str,
        config: Option<Vec<u8>>,
    ) -> Result<Arc<dyn CloudProvider>, ProviderRegistryError> {
        self.check(name)?;
        let factory = &self.factories[name];
        factory(config)
            .await
            .map_err(|source| ProviderRegistryError::Init {
                name: name.to_owned(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    impl CloudProvider for Nothing {
        fn provider_name(&self) -> &str {
            "nothing"
        }
    }

    async fn nothing(
        _: Option<Vec<u8>>,
    ) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Arc::new(Nothing))
    }

    async fn broken(
        config: Option<Vec<u8>>,
    ) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("bad config: {} bytes", config.map_or(0, |c| c.len())).into())
    }

    #[tokio::test]
    async fn unknown_duplicate_and_failing_providers_are_errors() {
        let mut registry = ProviderRegistry::new();
        registry.register("nothing", nothing).unwrap();
        registry.register("broken", broken).unwrap();
        assert!(
            matches!(registry.register("nothing", nothing), Err(ProviderRegistryError::Duplicate(name)) if name == "nothing")
        );
        assert_eq!(
            registry.build("nothing", None).await.unwrap().provider_name(),
            "nothing"
        );
        let unknown = registry.build("aws", None).await.err().unwrap();
        assert_eq!(
            unknown.to_string(),
            "--cloud-provider: unknown cloud provider \"aws\" (this binary has: broken, nothing)"
        );
        let failed = registry
            .build("broken", Some(b"xyz".to_vec()))
            .await
            .err()
            .unwrap();
        assert_eq!(
            failed.to_string(),
            "could not init cloud provider \"broken\": bad config: 3 bytes"
        );
    }
}
