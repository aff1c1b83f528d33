//! The radix tree's matches, inserts, eviction and invariants, including
//! under concurrent use.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

#[test]
fn insert_and_match() {
    let t = Tree::new();
    assert_eq!(t.match_prefix(b"hello").best(), None);
    t.insert(b"hello world", 1);
    t.insert(b"hello there", 2);
    let m = t.match_prefix(b"hello world!");
    assert_eq!(m.len_for(1), 11);
    assert_eq!(m.len_for(2), 6);
    assert_eq!(m.best(), Some((1, 11)));
    assert_eq!(
        t.match_prefix(b"help").len_for(1),
        3,
        "partial match inside an edge counts"
    );
    assert_eq!(t.match_prefix(b"").best(), None);
    assert_eq!(t.tenant_size(1), 11);
    assert_eq!(t.tenant_size(2), 11);
    t.check_invariants();
}

#[test]
fn split_keeps_tenants_and_sizes() {
    let t = Tree::new();
    t.insert(b"abcdef", 1);
    t.insert(b"abcxyz", 2);
    t.insert(b"ab", 3);
    assert_eq!(t.tenant_size(1), 6);
    assert_eq!(t.tenant_size(2), 6);
    assert_eq!(t.tenant_size(3), 2);
    assert_eq!(t.match_prefix(b"abcdef").len_for(2), 3);
    t.check_invariants();
}

#[test]
fn eviction_removes_least_recently_used_leaf_first() {
    let t = Tree::new();
    t.insert(b"common-AAAA", 1);
    t.insert(b"common-BBBB", 1);
    t.insert(b"common-AAAA", 1); // A is now the most recent
    assert_eq!(t.tenant_size(1), 15);
    t.evict_to(11);
    assert_eq!(t.match_prefix(b"common-AAAA").len_for(1), 11);
    assert_eq!(t.match_prefix(b"common-BBBB").len_for(1), 7);
    assert_eq!(t.tenant_size(1), 11);
    t.check_invariants();
    t.evict_to(0);
    assert_eq!(t.tenant_size(1), 0);
    assert_eq!(t.match_prefix(b"common").best(), None);
    t.check_invariants();
}

#[test]
fn eviction_only_touches_oversized_tenants() {
    let t = Tree::new();
    t.insert(b"shared prefix one", 1);
    t.insert(b"shared prefix two", 2);
    t.insert(b"shared prefix three", 2);
    t.evict_to(17);
    assert_eq!(t.tenant_size(1), 17);
    assert!(t.tenant_size(2) <= 17);
    assert_eq!(t.match_prefix(b"shared prefix one").len_for(1), 17);
    t.check_invariants();
}

#[test]
fn remove_tenant_keeps_shared_nodes() {
    let t = Tree::new();
    t.insert(b"shared-x", 1);
    t.insert(b"shared-y", 2);
    t.remove_tenant(1);
    assert_eq!(t.tenant_size(1), 0);
    assert_eq!(t.match_prefix(b"shared-x").len_for(1), 0);
    assert_eq!(t.match_prefix(b"shared-y").len_for(2), 8);
    t.check_invariants();
}

#[test]
fn deep_chains_are_evicted_and_dropped_without_recursion() {
    // On a small stack, a recursive teardown of a 4 000-deep chain would
    // overflow; everything here must be iterative.
    let worker = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let t = Tree::new();
            let text = vec![b'a'; 4_000];
            // Every prefix length, longest first: one node per byte.
            for n in (1..=text.len()).rev() {
                t.insert(&text[..n], 1);
            }
            assert_eq!(t.match_prefix(&text).len_for(1), text.len());
            t.evict_to(1_000);
            assert_eq!(t.tenant_size(1), 1_000);
            assert_eq!(t.match_prefix(&text).len_for(1), 1_000);
            t.insert(&text, 2);
            t.remove_tenant(1);
            assert_eq!(t.match_prefix(&text).len_for(1), 0);
            assert_eq!(t.match_prefix(&text).len_for(2), text.len());
        })
        .unwrap();
    worker.join().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Insert(String, TenantId),
    Match(String),
    Remove(TenantId),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => ("[ab]{0,8}", 0u32..4).prop_map(|(s, t)| Op::Insert(s, t)),
        3 => "[ab]{0,8}".prop_map(Op::Match),
        1 => (0u32..4).prop_map(Op::Remove),
    ]
}

fn naive_common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

proptest! {
    /// The word-at-a-time comparison agrees with a byte-at-a-time one,
    /// wherever the first difference falls (inside a word, at its edge,
    /// in the tail) and whichever side is shorter.
    #[test]
    fn common_prefix_is_bytewise(
        shared in proptest::collection::vec(any::<u8>(), 0..40),
        a in proptest::collection::vec(any::<u8>(), 0..20),
        b in proptest::collection::vec(any::<u8>(), 0..20),
    ) {
        let x = [shared.clone(), a].concat();
        let y = [shared, b].concat();
        prop_assert_eq!(common_prefix(&x, &y), naive_common_prefix(&x, &y));
        prop_assert_eq!(common_prefix(&y, &x), naive_common_prefix(&x, &y));
    }

    /// Against a naive model: a tenant's match is its longest common
    /// prefix with any string it was given.
    #[test]
    fn matches_naive_model(ops in proptest::collection::vec(op(), 1..60)) {
        let tree = Tree::new();
        let mut model: HashMap<TenantId, Vec<String>> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(s, t) => {
                    tree.insert(s.as_bytes(), t);
                    model.entry(t).or_default().push(s);
                }
                Op::Remove(t) => {
                    tree.remove_tenant(t);
                    model.remove(&t);
                }
                Op::Match(q) => {
                    let m = tree.match_prefix(q.as_bytes());
                    for t in 0..4 {
                        let want = model.get(&t).map_or(0, |v| v.iter()
                            .map(|s| naive_common_prefix(s.as_bytes(), q.as_bytes()))
                            .max()
                            .unwrap_or(0));
                        prop_assert_eq!(m.len_for(t), want, "tenant {} query {:?}", t, q);
                    }
                }
            }
        }
        tree.check_invariants();
    }
}

#[test]
fn concurrent_inserts_matches_and_evictions_keep_invariants() {
    use rand::{Rng, SeedableRng};
    let tree = Arc::new(Tree::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let evictor = {
        let (tree, stop) = (tree.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                tree.evict_to(200);
                n += 1;
                if n % 50 == 0 {
                    tree.remove_tenant(3);
                }
            }
        })
    };
    let writers: Vec<_> = (0..4u64)
        .map(|seed| {
            let tree = tree.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                for _ in 0..3000 {
                    let len = rng.random_range(0..40);
                    let s: Vec<u8> = (0..len).map(|_| b"abc"[rng.random_range(0..3)]).collect();
                    let t = rng.random_range(0..4);
                    if rng.random_bool(0.6) {
                        tree.insert(&s, t);
                    } else {
                        let m = tree.match_prefix(&s);
                        assert!(m.iter().all(|(_, l)| l <= s.len()));
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    evictor.join().unwrap();
    tree.check_invariants();
    // With eviction stopped, what is inserted now is held in full.
    let probes: Vec<&[u8]> = vec![b"abcabc", b"cab", b"aaaaaaaaaaab"];
    for (i, p) in probes.iter().enumerate() {
        tree.insert(p, i as u32);
    }
    for (i, p) in probes.iter().enumerate() {
        assert_eq!(tree.match_prefix(p).len_for(i as u32), p.len());
    }
    tree.check_invariants();
}
