//! `h_DTR_local = c0(s) / (m(s) · stale(s))`: the storage's own cost only.

use super::PolicyView;
use super::{cost_density, Heuristic, PoolOrder};
use crate::graph::StorageId;

pub struct DtrLocal;

impl Heuristic for DtrLocal {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        cost_density(graph.storages[storage].cost, storage, graph)
    }

    /// Its score is the cost density itself.
    fn at_least_cost_density(&self) -> bool {
        true
    }

    fn pool_order(&self) -> Option<PoolOrder> {
        Some(PoolOrder::CostDensity)
    }
}
