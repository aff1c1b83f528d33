//! The VM's live requests, so the root context can act for one: deliver
//! the answer that came on the session stream, or the answer to a call
//! the request made while the root was acting for it.
//!
//! The SDK hands a call's answer to the context that was *active* when the
//! call went out. A call a request makes while the root acts for it (the
//! `AwaitPrefill` after a decision that came on the stream) is therefore
//! answered to the root; the request registers such calls in
//! [`CallOwners`] so the root can pass their answers on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

/// The live requests (of type `R`) of one VM, by HTTP context id.
pub struct Contexts<R>(Rc<RefCell<HashMap<u32, Weak<RefCell<R>>>>>);

impl<R> Clone for Contexts<R> {
    fn clone(&self) -> Self {
        Contexts(self.0.clone())
    }
}

impl<R> Default for Contexts<R> {
    fn default() -> Self {
        Contexts(Rc::default())
    }
}

impl<R> Contexts<R> {
    /// Request `context` is live.
    pub fn add(&self, context: u32, request: &Rc<RefCell<R>>) {
        self.0.borrow_mut().insert(context, Rc::downgrade(request));
    }

    /// Request `context` is gone.
    pub fn remove(&self, context: u32) {
        self.0.borrow_mut().remove(&context);
    }

    /// Request `context`, if it is still live.
    pub fn get(&self, context: u32) -> Option<Rc<RefCell<R>>> {
        self.0.borrow().get(&context).and_then(Weak::upgrade)
    }

    /// How many requests are live.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    /// True when no request is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which request made each call in flight (call token -> HTTP context id).
#[derive(Clone, Default)]
pub struct CallOwners(Rc<RefCell<HashMap<u32, u32>>>);

impl CallOwners {
    /// Call `token` was made by `context`.
    pub fn own(&self, token: u32, context: u32) {
        self.0.borrow_mut().insert(token, context);
    }

    /// Call `token` answered (or was dropped): who made it.
    pub fn disown(&self, token: u32) -> Option<u32> {
        self.0.borrow_mut().remove(&token)
    }
}
