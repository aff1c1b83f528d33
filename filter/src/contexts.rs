//! The VM's live requests, so the root context can act for one: deliver
//! the answer that came on the session stream, or the answer to a call
//! the request made while the root was acting for it.
//!
//! The SDK hands a call's answer to the context that was *active* when the
//! call went out. A call a request makes while the root acts for it (the
//! `AwaitPrefill` after a decision that came on the stream) is therefore
//! answered to the root; the request registers such calls here so the root
//! can pass their answers on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use crate::http::Request;

#[derive(Default)]
struct Inner {
    live: HashMap<u32, Weak<RefCell<Request>>>,
    /// Calls in flight by token, with the context that made them.
    calls: HashMap<u32, u32>,
}

/// The live requests of one VM, by HTTP context id.
#[derive(Clone, Default)]
pub struct Contexts(Rc<RefCell<Inner>>);

impl Contexts {
    /// Request `context` is live.
    pub fn add(&self, context: u32, request: &Rc<RefCell<Request>>) {
        self.0
            .borrow_mut()
            .live
            .insert(context, Rc::downgrade(request));
    }

    /// Request `context` is gone.
    pub fn remove(&self, context: u32) {
        self.0.borrow_mut().live.remove(&context);
    }

    /// Request `context`, if it is still live.
    pub fn get(&self, context: u32) -> Option<Rc<RefCell<Request>>> {
        self.0.borrow().live.get(&context).and_then(Weak::upgrade)
    }

    /// Call `token` was made by `context`.
    pub fn own_call(&self, token: u32, context: u32) {
        self.0.borrow_mut().calls.insert(token, context);
    }

    /// Call `token` answered (or was dropped): who made it.
    pub fn disown_call(&self, token: u32) -> Option<u32> {
        self.0.borrow_mut().calls.remove(&token)
    }

    /// How many requests are live.
    pub fn len(&self) -> usize {
        self.0.borrow().live.len()
    }

    /// True when no request is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
