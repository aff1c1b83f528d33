use std::sync::Arc;

use crate::policy::Policy;
use crate::workers::Role;

/// The policies of each role.
pub struct Policies {
    /// Regular mode.
    pub regular: Arc<dyn Policy>,
    /// PD mode, choosing the prefill worker.
    pub prefill: Arc<dyn Policy>,
    /// PD mode, choosing the decode worker.
    pub decode: Arc<dyn Policy>,
}

impl Policies {
    /// One policy for every role.
    pub fn same(policy: Arc<dyn Policy>) -> Self {
        Policies {
            regular: policy.clone(),
            prefill: policy.clone(),
            decode: policy,
        }
    }

    /// The policy for `role`.
    pub fn of(&self, role: Role) -> &Arc<dyn Policy> {
        match role {
            Role::Regular => &self.regular,
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// Each distinct policy once, with the role it serves.
    pub fn each(&self) -> Vec<(Role, Arc<dyn Policy>)> {
        let mut out: Vec<(Role, Arc<dyn Policy>)> = Vec::new();
        for role in [Role::Regular, Role::Prefill, Role::Decode] {
            let p = self.of(role);
            if !out.iter().any(|(_, q)| Arc::ptr_eq(p, q)) {
                out.push((role, p.clone()));
            }
        }
        out
    }
}
