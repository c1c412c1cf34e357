//! `h_LRU`: evict the storage accessed longest ago.

use super::Heuristic;
use crate::graph::{Graph, StorageId};

pub struct Lru;

impl Heuristic for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn about(&self) -> &'static str {
        "evict the storage accessed longest ago (h_LRU)"
    }

    fn score(&mut self, storage: StorageId, graph: &Graph) -> f64 {
        graph.storages[storage].last_access as f64
    }
}
