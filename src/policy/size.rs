//! `h_size`: evict the largest storage first.

use super::PolicyView;
use super::{Heuristic, PoolOrder};
use crate::graph::StorageId;

pub struct Size;

impl Heuristic for Size {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        match graph.storages[storage].bytes {
            0 => f64::INFINITY,
            bytes => 1.0 / bytes as f64,
        }
    }

    /// `1 / held(s)`, as `held ≥ m`.
    fn pool_order(&self) -> Option<PoolOrder> {
        Some(PoolOrder::InverseSize)
    }
}
