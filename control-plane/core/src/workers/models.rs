//! Which workers may take a request for a given model.
//!
//! The rule, smg's (1.13.0: `routers/http/router.rs`, the registry's model
//! index) with sglang-router's one-model fleets kept as they were:
//!
//! - A request that names no model (no `model` field, an empty one, or
//!   smg's wildcard `"unknown"`, which smg itself sends for `/generate`
//!   without a model) may go to any worker.
//! - A fleet whose workers serve one model between them (or whose models
//!   could not be read) takes every request, whatever model it names:
//!   sglang-router 0.3.2 never reads the model, and clients of a one-model
//!   fleet often send a placeholder (`"model":"default"`). Here this router
//!   parts from smg, which answers 404 to a name its one worker does not
//!   serve.
//! - In a fleet of several models, a request naming a model goes only to
//!   the workers serving exactly that name (compared as bytes, as smg
//!   does); a worker whose model could not be read serves no named model.
//!   No registered worker serves it: [`ModelMatch::NotServed`], smg's 404
//!   `model_not_found`; some do but none may take requests now:
//!   [`ModelMatch::Unavailable`], smg's 503.
//!
//! In PD mode the rule is applied to the prefill and the decode workers
//! alike, each against the whole fleet's models.

use std::sync::Arc;

use crate::workers::{Role, Worker};

/// smg's name for "no model given": a request naming it may go anywhere.
pub const ANY_MODEL: &str = "unknown";

/// Whether `model` (the request's `model` field, empty when it has none)
/// names a model to route by.
pub fn names_a_model(model: &str) -> bool {
    !model.is_empty() && model != ANY_MODEL
}

/// Whether the registered workers `all` serve more than one model between
/// them (workers whose model is unknown do not count).
pub fn several_models(all: &[Arc<Worker>]) -> bool {
    let mut known = all.iter().filter_map(|w| w.model());
    let Some(first) = known.next() else {
        return false;
    };
    known.any(|m| m != first)
}

/// The distinct models the registered workers `all` serve, in order of
/// first registration.
pub fn served_models(all: &[Arc<Worker>]) -> Vec<&str> {
    let mut models: Vec<&str> = Vec::new();
    for model in all.iter().filter_map(|w| w.model()) {
        if !models.contains(&model) {
            models.push(model);
        }
    }
    models
}

/// What the rule makes of a request's model for one role's workers.
#[derive(Debug)]
pub enum ModelMatch {
    /// The model does not narrow anything: route among all of them.
    Any,
    /// Route among these (available, serving the model, in order).
    Serving(Vec<Arc<Worker>>),
    /// No registered worker of the role serves the model.
    NotServed,
    /// Some serve it, but none may take requests now.
    Unavailable,
}

/// Applies the rule to a request for `model` (empty: none) among the
/// `available` units of `role`, `all` being every registered unit of
/// every role.
pub fn narrow(
    all: &[Arc<Worker>],
    available: &[Arc<Worker>],
    role: Role,
    model: &str,
) -> ModelMatch {
    if !names_a_model(model) || !several_models(all) {
        return ModelMatch::Any;
    }
    let serving: Vec<Arc<Worker>> = available
        .iter()
        .filter(|w| w.model() == Some(model))
        .cloned()
        .collect();
    if !serving.is_empty() {
        return ModelMatch::Serving(serving);
    }
    // A registered worker of the role serving it makes it a health matter.
    let registered = all
        .iter()
        .any(|w| w.role() == role && w.model() == Some(model));
    if registered {
        ModelMatch::Unavailable
    } else {
        ModelMatch::NotServed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::{Registry, ServerFacts, WorkerAddress, WorkerSpec};

    /// A registry with one healthy worker per `(model, spec)`, ports from 1.
    fn fleet(workers: &[(Option<&str>, WorkerSpec)]) -> Registry {
        let r = Registry::default();
        for (i, (model, spec)) in workers.iter().enumerate() {
            let port = u16::try_from(i + 1).unwrap();
            let address = WorkerAddress::from(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
            let facts = ServerFacts {
                model: model.map(Arc::from),
                ..ServerFacts::default()
            };
            for unit in r.add(address, *spec, facts).unwrap() {
                r.set_healthy(&unit, true);
            }
        }
        r
    }

    fn ports(m: &ModelMatch) -> Vec<u16> {
        match m {
            ModelMatch::Serving(ws) => ws.iter().map(|w| w.endpoint.port()).collect(),
            _ => Vec::new(),
        }
    }

    fn narrow_regular(r: &Registry, model: &str) -> ModelMatch {
        narrow(&r.all(), &r.available(Role::Regular), Role::Regular, model)
    }

    const R: WorkerSpec = WorkerSpec::REGULAR;

    #[test]
    fn several_models_narrow_to_exact_name() {
        let r = fleet(&[(Some("a"), R), (Some("b"), R), (Some("a"), R), (None, R)]);
        assert_eq!(ports(&narrow_regular(&r, "a")), vec![1, 3]);
        assert_eq!(ports(&narrow_regular(&r, "b")), vec![2]);
        assert!(matches!(narrow_regular(&r, "A"), ModelMatch::NotServed));
        assert!(matches!(narrow_regular(&r, "c"), ModelMatch::NotServed));
    }

    #[test]
    fn no_model_or_wildcard_goes_anywhere() {
        let r = fleet(&[(Some("a"), R), (Some("b"), R)]);
        assert!(matches!(narrow_regular(&r, ""), ModelMatch::Any));
        assert!(matches!(narrow_regular(&r, ANY_MODEL), ModelMatch::Any));
    }

    #[test]
    fn one_model_fleet_takes_any_name() {
        let r = fleet(&[(Some("sim-model"), R), (Some("sim-model"), R), (None, R)]);
        assert!(!several_models(&r.all()));
        assert!(matches!(narrow_regular(&r, "m"), ModelMatch::Any));
        let unread = fleet(&[(None, R), (None, R)]);
        assert!(matches!(narrow_regular(&unread, "m"), ModelMatch::Any));
    }

    #[test]
    fn served_but_unhealthy_is_unavailable_not_unknown() {
        let r = fleet(&[(Some("a"), R), (Some("b"), R)]);
        let b = r
            .all()
            .iter()
            .find(|w| w.model() == Some("b"))
            .cloned()
            .unwrap();
        r.set_healthy(&b, false);
        assert!(matches!(narrow_regular(&r, "b"), ModelMatch::Unavailable));
        assert_eq!(ports(&narrow_regular(&r, "a")), vec![1]);
    }

    #[test]
    fn pd_roles_are_narrowed_each_against_their_own_workers() {
        let p = WorkerSpec::Prefill {
            bootstrap_port: None,
        };
        let d = WorkerSpec::Decode;
        let r = fleet(&[(Some("a"), p), (Some("a"), d), (Some("b"), p)]);
        let of = |role| narrow(&r.all(), &r.available(role), role, "b");
        assert_eq!(ports(&of(Role::Prefill)), vec![3]);
        // "b" has a prefill worker but no decode worker: not served there.
        assert!(matches!(of(Role::Decode), ModelMatch::NotServed));
    }

    #[test]
    fn a_model_learned_later_counts_and_does_not_replace_a_known_one() {
        let r = fleet(&[(Some("a"), R), (None, R)]);
        let all = r.all();
        assert!(!several_models(&all));
        all[1].learn_model(Arc::from("b"));
        assert!(several_models(&all));
        assert_eq!(ports(&narrow_regular(&r, "b")), vec![2]);
        all[0].learn_model(Arc::from("z"));
        assert_eq!(all[0].model(), Some("a"));
    }

    #[test]
    fn served_models_lists_each_once_in_order() {
        let r = fleet(&[(Some("b"), R), (None, R), (Some("a"), R), (Some("b"), R)]);
        let all = r.all();
        assert_eq!(served_models(&all), vec!["b", "a"]);
    }
}
