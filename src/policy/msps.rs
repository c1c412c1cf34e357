//! `h_MSPS = (c0(s) + Σ evicted ancestors' c0) / m(s)` (Capuchin): the
//! memory saved per second of recomputation, without staleness.

use super::region::{Direction, RegionWalker};
use super::PolicyView;
use super::{Heuristic, PoolOrder};
use crate::graph::StorageId;

#[derive(Default)]
pub struct Msps {
    walker: RegionWalker,
}

impl Heuristic for Msps {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        let bytes = graph.storages[storage].bytes;
        if bytes == 0 {
            return f64::INFINITY;
        }
        let cost =
            graph.storages[storage].cost + self.walker.cost(graph, storage, Direction::Ancestors);
        cost as f64 / bytes as f64
    }

    /// `c0(s) / held(s)`: ancestors only add cost, and `held ≥ m`.
    fn pool_order(&self) -> Option<PoolOrder> {
        Some(PoolOrder::CostPerByte)
    }
}
