//! `h_DTR = (c0(s) + Σ_{u ∈ e*(s)} c0(u)) / (m(s) · stale(s))`: the full
//! evicted neighbourhood `e*(s)`, towards descendants and ancestors.

use super::region::{Direction, RegionWalker};
use super::{cost_density, Heuristic};
use crate::graph::{Graph, StorageId};

#[derive(Default)]
pub struct Dtr {
    walker: RegionWalker,
}

impl Heuristic for Dtr {
    fn name(&self) -> &'static str {
        "dtr"
    }

    fn about(&self) -> &'static str {
        "(own cost + cost of the whole evicted neighbourhood) / (size * staleness) (h_DTR)"
    }

    fn score(&mut self, storage: StorageId, graph: &Graph) -> f64 {
        let cost = graph.storages[storage].cost
            + self.walker.cost(graph, storage, Direction::Descendants)
            + self.walker.cost(graph, storage, Direction::Ancestors);
        cost_density(cost, storage, graph)
    }
}
