//! The engine's side of model-aware routing: a question's candidates
//! narrowed to the workers serving its model, by the rule in
//! [`crate::workers::models`] (several models: only those serving the
//! named one; one model, or none named: all of them); and `/v1/models`
//! over several models, answered from the registry as smg answers it.

use std::sync::Arc;

use sglang_envoy_lifecycle::{LocalReply, Question, Unrouted};

use super::Engine;
use crate::workers::models::{narrow, served_models, several_models, ModelMatch};
use crate::workers::{Role, Worker};

impl Engine {
    /// The `available` units of `role` that may take `req`: those serving
    /// its model when the fleet serves several. A model no registered
    /// worker of `role` serves is smg's 404 `model_not_found`; one whose
    /// workers are all unavailable, the usual 503.
    pub(super) fn for_model(
        &self,
        req: &Question,
        role: Role,
        available: Arc<Vec<Arc<Worker>>>,
    ) -> Result<Arc<Vec<Arc<Worker>>>, Unrouted> {
        match narrow(&self.registry.all(), &available, role, &req.model) {
            ModelMatch::Any => Ok(available),
            ModelMatch::Serving(units) => Ok(Arc::new(units)),
            ModelMatch::NotServed => {
                self.metrics.error("model_not_found");
                Err(Unrouted::Rejected(LocalReply::model_not_found(&req.model)))
            }
            ModelMatch::Unavailable => Err(self.no_workers(role)),
        }
    }

    /// smg's answer to `GET /v1/models` (`path`, query included) when the
    /// fleet serves several models: every registered worker's model, once
    /// (`{"object":"list","data":[{"id","object":"model","created":0,
    /// "owned_by":"self_hosted"}]}`). `None` otherwise: one worker's own
    /// answer stands, as sglang-router forwards it.
    pub(super) fn model_list(&self, path: &str) -> Option<LocalReply> {
        let path = path.split('?').next().unwrap_or(path);
        let all = self.registry.all();
        if path != "/v1/models" || !several_models(&all) {
            return None;
        }
        let data: Vec<serde_json::Value> = served_models(&all)
            .iter()
            .map(|id| {
                serde_json::json!({
                    "id": id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "self_hosted",
                })
            })
            .collect();
        let body = serde_json::json!({"object": "list", "data": data});
        Some(LocalReply::answer("list", body.to_string()))
    }
}
