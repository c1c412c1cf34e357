//! `h_LRU`: evict the storage accessed longest ago.

use super::Heuristic;
use super::PolicyView;
use crate::graph::StorageId;

pub struct Lru;

impl Heuristic for Lru {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        graph.storages[storage].last_access as f64
    }
}
