//! The configured payment providers: each a `Provider` adapter with its own fee schedule. A payment
//! names its provider; the flow, the webhook worker and the reconciler all look it up here.

use std::collections::BTreeMap;
use std::sync::Arc;

use asiento_domain::{FeeSchedule, ProviderName};
use asiento_psp::Provider;

use crate::metered::Metered;

/// One configured provider.
#[derive(Clone)]
pub struct ConfiguredProvider {
    pub adapter: Arc<dyn Provider>,
    /// What the platform charges on payments through this provider.
    pub fees: FeeSchedule,
}

/// Providers by name. Cheap to clone.
#[derive(Clone, Default)]
pub struct Providers(Arc<BTreeMap<ProviderName, ConfiguredProvider>>);

impl Providers {
    /// Each adapter is measured (`crate::metered`): every call the ledger makes is counted and
    /// timed by provider, operation and outcome.
    pub fn new(providers: impl IntoIterator<Item = (ProviderName, ConfiguredProvider)>) -> Self {
        Self(Arc::new(
            providers
                .into_iter()
                .map(|(name, configured)| {
                    let adapter: Arc<dyn Provider> = Arc::new(Metered::new(configured.adapter));
                    (
                        name,
                        ConfiguredProvider {
                            adapter,
                            fees: configured.fees,
                        },
                    )
                })
                .collect(),
        ))
    }

    pub fn get(&self, name: &ProviderName) -> Option<&ConfiguredProvider> {
        self.0.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &ProviderName> {
        self.0.keys()
    }
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}
