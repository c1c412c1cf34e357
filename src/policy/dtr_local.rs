//! `h_DTR_local = c0(s) / (m(s) · stale(s))`: the storage's own cost only.

use super::PolicyView;
use super::{cost_density, Heuristic};
use crate::graph::StorageId;

pub struct DtrLocal;

impl Heuristic for DtrLocal {
    fn name(&self) -> &'static str {
        "dtr-local"
    }

    fn about(&self) -> &'static str {
        "own recompute cost / (size * staleness) (h_DTR_local)"
    }

    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        cost_density(graph.storages[storage].cost, storage, graph)
    }
}
