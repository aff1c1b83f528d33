//! TEMPORARY stand-in; replaced by the concurrent radix tree.
use std::collections::HashMap;
use parking_lot::Mutex;
pub type TenantId = u32;
#[derive(Default)]
pub struct Tree { m: Mutex<HashMap<TenantId, Vec<Vec<u8>>>> }
pub struct PrefixMatch(Vec<(TenantId, usize)>);
impl PrefixMatch {
    pub fn len_for(&self, t: TenantId) -> usize { self.0.iter().find(|x| x.0 == t).map_or(0, |x| x.1) }
}
impl Tree {
    pub fn new() -> Self { Self::default() }
    pub fn insert(&self, text: &[u8], t: TenantId) { self.m.lock().entry(t).or_default().push(text.to_vec()); }
    pub fn match_prefix(&self, text: &[u8]) -> PrefixMatch {
        PrefixMatch(self.m.lock().iter().map(|(t, v)| (*t, v.iter().map(|s| s.iter().zip(text).take_while(|(a,b)| a==b).count()).max().unwrap_or(0))).filter(|x| x.1 > 0).collect())
    }
    pub fn tenant_size(&self, t: TenantId) -> usize { self.m.lock().get(&t).map_or(0, |v| v.iter().map(|s| s.len()).sum()) }
    pub fn evict_to(&self, _m: usize) {}
    pub fn remove_tenant(&self, t: TenantId) { self.m.lock().remove(&t); }
}
