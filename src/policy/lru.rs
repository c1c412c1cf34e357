//! `h_LRU`: evict the storage accessed longest ago.

use super::PolicyView;
use super::{Heuristic, PoolOrder};
use crate::graph::StorageId;

pub struct Lru;

impl Heuristic for Lru {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        graph.storages[storage].last_access as f64
    }

    /// The score is the pool entry's last access.
    fn pool_order(&self) -> Option<PoolOrder> {
        Some(PoolOrder::LastAccess)
    }
}
