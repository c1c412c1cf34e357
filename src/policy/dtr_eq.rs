//! `h_DTR_eq = (c0(s) + Σ cost of the distinct classes of s's evicted
//! neighbours) / (m(s) · stale(s))`, with classes kept by union-find.

use smallvec::SmallVec;

use super::eqclass::EqClasses;
use super::{cost_density, Heuristic};
use crate::graph::{Graph, StorageId};

#[derive(Default)]
pub struct DtrEq {
    classes: EqClasses,
}

impl Heuristic for DtrEq {
    fn name(&self) -> &'static str {
        "dtr-eq"
    }

    fn about(&self) -> &'static str {
        "(own cost + cost of adjacent evicted classes, union-find) / (size * staleness) (h_DTR_eq)"
    }

    fn score(&mut self, storage: StorageId, graph: &Graph) -> f64 {
        let mut roots: SmallVec<[u32; 8]> = SmallVec::new();
        let mut cost = graph.storages[storage].cost;
        for neighbour in graph.evicted_neighbours(storage) {
            if let Some(root) = self.classes.class_of(neighbour) {
                if !roots.contains(&root) {
                    roots.push(root);
                    cost += self.classes.class_cost(root);
                }
            }
        }
        cost_density(cost, storage, graph)
    }

    fn on_evict(&mut self, storage: StorageId, graph: &Graph) {
        self.classes.insert(storage, graph.storages[storage].cost);
        for neighbour in graph.evicted_neighbours(storage) {
            self.classes.union(storage, neighbour);
        }
    }

    fn on_rematerialize(&mut self, storage: StorageId, _graph: &Graph) {
        self.classes.remove(storage);
    }

    fn on_free(&mut self, storage: StorageId, _graph: &Graph) {
        self.classes.remove(storage);
    }
}
