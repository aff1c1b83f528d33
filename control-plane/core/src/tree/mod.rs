//! The approximate radix tree of the cache-aware policies.
//!
//! One tree holds every worker's ("tenant's") history: a node is an edge
//! label plus the set of tenants that were sent a prompt passing through it,
//! each with its last-use time. That is the per-worker trees of sglang-router
//! overlaid, so one walk down the tree answers "how much of this prompt does
//! each worker hold" for all workers at once.
//!
//! Concurrency: each node has its own `RwLock`; there is no tree-wide lock on
//! the insert/match path. Locks are only ever taken parent before child, and
//! a node's label changes (splits) only under its parent's write lock, so a
//! walker holding a parent's read lock sees its children's labels stable.
//! Hence no deadlock.
//!
//! Eviction and tenant removal take a tenant away from nodes an insert may be
//! walking below at that very moment, which would leave a node below one that
//! no longer holds its tenant. So inserts hold a shared `gate` (a read lock:
//! inserts never wait for each other) and every eviction step holds it
//! exclusively for the few microseconds it takes. With that, "a tenant held by
//! a node is held by all its ancestors" always holds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{RawRwLock, RwLock, RwLockWriteGuard};

/// Small integer id of a worker (or a worker's DP rank) in the tree.
pub type TenantId = u32;

type NodeRef = Arc<RwLock<Node>>;

#[derive(Default)]
struct Node {
    /// Bytes of the edge from the parent to this node.
    label: Box<[u8]>,
    /// Children keyed by the first byte of their label.
    children: Vec<(u8, NodeRef)>,
    /// Tenants holding this node, with the logical time of their last use.
    tenants: Vec<(TenantId, AtomicU64)>,
}

impl Node {
    fn child(&self, first: u8) -> Option<&NodeRef> {
        self.children
            .iter()
            .find(|(b, _)| *b == first)
            .map(|(_, c)| c)
    }

    fn tenant(&self, t: TenantId) -> Option<&AtomicU64> {
        self.tenants
            .iter()
            .find(|(id, _)| *id == t)
            .map(|(_, ts)| ts)
    }

    fn holds(&self, t: TenantId) -> bool {
        self.tenant(t).is_some()
    }
}

/// Length of the longest common prefix of `a` and `b`.
///
/// Compares eight bytes at a time: this runs over every byte of a prompt
/// twice per decision (match, then insert), and a byte-at-a-time loop was
/// the largest single cost of a decision on 4 KB prompts.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut done = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let (mut wx, mut wy) = ([0u8; 8], [0u8; 8]);
        wx.copy_from_slice(x);
        wy.copy_from_slice(y);
        let diff = u64::from_le_bytes(wx) ^ u64::from_le_bytes(wy);
        if diff != 0 {
            // Little-endian: the first differing byte holds the lowest set bit.
            return done + diff.trailing_zeros() as usize / 8;
        }
        done += 8;
    }
    done + a[done..]
        .iter()
        .zip(&b[done..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// For each tenant holding a prefix of a text, the length of that prefix.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    lens: Vec<(TenantId, usize)>,
}

impl PrefixMatch {
    /// Bytes of the text `tenant` holds (0 when none).
    pub fn len_for(&self, tenant: TenantId) -> usize {
        self.lens
            .iter()
            .find(|(t, _)| *t == tenant)
            .map_or(0, |(_, l)| *l)
    }

    /// The tenant holding the longest prefix.
    pub fn best(&self) -> Option<(TenantId, usize)> {
        self.lens.iter().copied().max_by_key(|(_, l)| *l)
    }

    /// Every tenant holding a non-empty prefix, with its length.
    pub fn iter(&self) -> impl Iterator<Item = (TenantId, usize)> + '_ {
        self.lens.iter().copied()
    }
}

/// The multi-tenant approximate radix tree.
pub struct Tree {
    root: NodeRef,
    /// Bytes held per tenant (sum of the labels of the nodes it holds).
    sizes: DashMap<TenantId, usize>,
    clock: AtomicU64,
    /// Shared by inserts, exclusive for each eviction or removal step.
    gate: RwLock<()>,
}

impl Drop for Tree {
    /// Frees the nodes iteratively: the default recursive drop would overflow
    /// the stack on a deep chain (one node per byte of a long prompt).
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.root.write().children);
        while let Some((_, node)) = stack.pop() {
            if let Ok(lock) = Arc::try_unwrap(node) {
                stack.extend(lock.into_inner().children);
            }
        }
    }
}

impl Default for Tree {
    fn default() -> Self {
        Tree::new()
    }
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Self {
        Tree {
            root: Arc::new(RwLock::new(Node::default())),
            sizes: DashMap::new(),
            clock: AtomicU64::new(1),
            gate: RwLock::new(()),
        }
    }

    fn add_size(&self, t: TenantId, delta: usize) {
        *self.sizes.entry(t).or_insert(0) += delta;
    }

    fn sub_size(&self, t: TenantId, delta: usize) {
        if let Some(mut s) = self.sizes.get_mut(&t) {
            *s = s.saturating_sub(delta);
        }
    }

    /// Records that `tenant` holds `text` and all its prefixes, as used now.
    /// Copies only the part of `text` the tree did not have.
    pub fn insert(&self, text: &[u8], tenant: TenantId) {
        let _gate = self.gate.read();
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut node = self.root.clone();
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let parent = node.read();
            let Some(child) = parent.child(rest[0]).cloned() else {
                drop(parent);
                let mut parent = node.write();
                if parent.child(rest[0]).is_some() {
                    continue; // another insert added it; walk into it
                }
                parent.children.push((
                    rest[0],
                    Arc::new(RwLock::new(Node {
                        label: rest.into(),
                        children: Vec::new(),
                        tenants: vec![(tenant, AtomicU64::new(now))],
                    })),
                ));
                self.add_size(tenant, rest.len());
                return;
            };
            let c = child.read();
            let common = common_prefix(&c.label, rest);
            if common == c.label.len() {
                // Whole edge matches. The parent's read lock keeps the label
                // stable while we mark the child.
                let len = c.label.len();
                if let Some(ts) = c.tenant(tenant) {
                    ts.store(now, Ordering::Relaxed);
                    drop(c);
                } else {
                    drop(c);
                    let mut c = child.write();
                    if let Some(ts) = c.tenant(tenant) {
                        ts.store(now, Ordering::Relaxed);
                    } else {
                        c.tenants.push((tenant, AtomicU64::new(now)));
                        self.add_size(tenant, len);
                    }
                }
                drop(parent);
                node = child;
                pos += len;
                continue;
            }
            drop(c);
            drop(parent);
            // Diverges inside the edge: split it at `common` under the
            // parent's write lock, then walk again from the parent.
            self.split(&node, &child, rest, common);
        }
    }

    fn split(&self, node: &NodeRef, child: &NodeRef, rest: &[u8], common: usize) {
        let mut parent = node.write();
        let Some(slot) = parent
            .children
            .iter_mut()
            .find(|(b, c)| *b == rest[0] && Arc::ptr_eq(c, child))
        else {
            return; // changed meanwhile; the caller walks again
        };
        let mut c = child.write();
        if common_prefix(&c.label, rest) != common || common >= c.label.len() {
            return;
        }
        let upper: Box<[u8]> = c.label[..common].into();
        let lower: Box<[u8]> = c.label[common..].into();
        let tenants = c
            .tenants
            .iter()
            .map(|(t, ts)| (*t, AtomicU64::new(ts.load(Ordering::Relaxed))))
            .collect();
        // Each tenant keeps the same number of bytes: the label is split in two.
        c.label = lower;
        let first = c.label[0];
        drop(c);
        slot.1 = Arc::new(RwLock::new(Node {
            label: upper,
            children: vec![(first, child.clone())],
            tenants,
        }));
    }

    /// For every tenant, the longest prefix of `text` it holds. One walk;
    /// read-only (last-use times change only on insert).
    pub fn match_prefix(&self, text: &[u8]) -> PrefixMatch {
        // The nodes on the matched path, with how far into `text` each ends
        // and who holds it. A tenant's match is its deepest node, so the path
        // is read bottom-up with a bitset of tenants already placed: linear
        // in the tenants on the path (a per-node search of the result made
        // it quadratic in the number of workers).
        // `flat` holds every path node's tenants in walk order; `ends[i]` is
        // (where node i's match ends in `text`, end of its run in `flat`).
        // Two flat vectors instead of one per node: no allocation per node.
        let mut flat: Vec<TenantId> = Vec::new();
        let mut ends: Vec<(usize, usize)> = Vec::new();
        let mut guard: ArcRwLockReadGuard<RawRwLock, Node> = self.root.read_arc();
        let mut pos = 0;
        while pos < text.len() {
            let Some(child) = guard.child(text[pos]).cloned() else {
                break;
            };
            // Hand over hand: lock the child before letting go of the parent,
            // so a split cannot happen in between.
            let next = child.read_arc();
            drop(guard);
            guard = next;
            let matched = common_prefix(&guard.label, &text[pos..]);
            pos += matched;
            flat.extend(guard.tenants.iter().map(|(t, _)| *t));
            ends.push((pos, flat.len()));
            if matched < guard.label.len() {
                break;
            }
        }
        drop(guard);
        let mut placed: Vec<u64> = Vec::new();
        let mut result = PrefixMatch::default();
        for (i, &(len, end)) in ends.iter().enumerate().rev() {
            let start = if i == 0 { 0 } else { ends[i - 1].1 };
            for &t in &flat[start..end] {
                let (word, bit) = (t as usize / 64, 1u64 << (t % 64));
                if word >= placed.len() {
                    placed.resize(word + 1, 0);
                }
                if placed[word] & bit == 0 {
                    placed[word] |= bit;
                    result.lens.push((t, len));
                }
            }
        }
        result
    }

    /// Bytes of text `tenant` holds.
    pub fn tenant_size(&self, tenant: TenantId) -> usize {
        self.sizes.get(&tenant).map_or(0, |s| *s)
    }

    /// `(tenant, bytes held)` for every tenant.
    pub fn tenant_sizes(&self) -> Vec<(TenantId, usize)> {
        self.sizes.iter().map(|e| (*e.key(), *e.value())).collect()
    }

    /// Trims every tenant to at most `max_size` bytes by removing it from its
    /// least recently used leaves first. Takes two node locks at a time, so
    /// inserts and matches elsewhere in the tree go on meanwhile.
    pub fn evict_to(&self, max_size: usize) {
        let over: Vec<TenantId> = self
            .sizes
            .iter()
            .filter(|e| *e.value() > max_size)
            .map(|e| *e.key())
            .collect();
        for t in over {
            self.evict_tenant(t, max_size, None);
        }
    }

    /// Removes `t` from its least recently used leaves until it holds at most
    /// `max_size` bytes. With `held` (the gate, held exclusively by the
    /// caller) it runs as one step; without, it takes the gate per leaf.
    fn evict_tenant(&self, t: TenantId, max_size: usize, held: Option<&RwLockWriteGuard<'_, ()>>) {
        // The nodes `t` holds, each with the index of its parent: a path is
        // followed through the indices, so deep chains cost linear memory.
        let mut nodes: Vec<(NodeRef, usize)> = vec![(self.root.clone(), 0)];
        // Leaves of `t`, least recently used first.
        let mut heap = BinaryHeap::new();
        let mut stack = vec![0usize];
        while let Some(i) = stack.pop() {
            let node = nodes[i].0.clone();
            let node = node.read();
            let mut leaf = true;
            for (_, c) in &node.children {
                if c.read().holds(t) {
                    leaf = false;
                    nodes.push((c.clone(), i));
                    stack.push(nodes.len() - 1);
                }
            }
            if leaf && i != 0 {
                let ts = node.tenant(t).map_or(0, |ts| ts.load(Ordering::Relaxed));
                heap.push(Reverse((ts, i)));
            }
        }
        while self.tenant_size(t) > max_size {
            let Some(Reverse((_, i))) = heap.pop() else {
                break;
            };
            let (node, parent_index) = (&nodes[i].0, nodes[i].1);
            let parent = &nodes[parent_index].0;
            let _gate = held.is_none().then(|| self.gate.write());
            let mut p = parent.write();
            if !p.children.iter().any(|(_, c)| Arc::ptr_eq(c, node)) {
                continue; // a split moved the node since the walk; next round
            }
            let mut n = node.write();
            let still_leaf = n.holds(t) && !n.children.iter().any(|(_, c)| c.read().holds(t));
            if !still_leaf {
                continue;
            }
            n.tenants.retain(|(id, _)| *id != t);
            self.sub_size(t, n.label.len());
            if n.tenants.is_empty() && n.children.is_empty() {
                p.children.retain(|(_, c)| !Arc::ptr_eq(c, node));
            }
            drop(n);
            // The parent may now be a leaf of `t`.
            if parent_index != 0 && !p.children.iter().any(|(_, c)| c.read().holds(t)) {
                if let Some(ts) = p.tenant(t) {
                    heap.push(Reverse((ts.load(Ordering::Relaxed), parent_index)));
                }
            }
        }
    }

    /// Removes every tenant `keep` rejects. Policies call it with the
    /// registered workers: a decision made on a snapshot taken just before a
    /// worker was removed can insert into its tenant after the removal.
    pub fn retain_tenants(&self, keep: impl Fn(TenantId) -> bool) {
        for (tenant, _) in self.tenant_sizes() {
            if !keep(tenant) {
                self.remove_tenant(tenant);
            }
        }
    }

    /// Removes `tenant` everywhere, freeing nodes no other tenant holds.
    /// Inserts wait meanwhile, so the removal is atomic.
    pub fn remove_tenant(&self, tenant: TenantId) {
        let gate = self.gate.write();
        self.evict_tenant(tenant, 0, Some(&gate));
        self.sizes.remove(&tenant);
    }

    /// Checks the structural invariants (tests only).
    #[cfg(test)]
    fn check_invariants(&self) {
        use std::collections::HashMap;
        let mut sizes: HashMap<TenantId, usize> = HashMap::new();
        fn walk(node: &Node, sizes: &mut HashMap<TenantId, usize>, is_root: bool) {
            for (first, c) in &node.children {
                let c = c.read();
                assert_eq!(
                    c.label.first(),
                    Some(first),
                    "child keyed by its first byte"
                );
                assert!(!c.tenants.is_empty(), "node without tenants kept");
                for (t, _) in &c.tenants {
                    assert!(
                        is_root || node.holds(*t),
                        "tenant {t} held below a node it does not hold"
                    );
                    *sizes.entry(*t).or_default() += c.label.len();
                }
                walk(&c, sizes, false);
            }
        }
        walk(&self.root.read(), &mut sizes, true);
        for (t, s) in self.tenant_sizes() {
            assert_eq!(sizes.get(&t).copied().unwrap_or(0), s, "size of tenant {t}");
        }
        for (t, s) in sizes {
            assert_eq!(self.tenant_size(t), s, "size of tenant {t}");
        }
    }
}

#[cfg(test)]
mod tests;
