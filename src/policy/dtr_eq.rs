//! `h_DTR_eq = (c0(s) + Σ cost of the distinct classes of s's evicted
//! neighbours) / (m(s) · stale(s))`, with classes kept by union-find.
//!
//! `dte` is the same with MegEngine's fragmentation-aware size: `m(s)` plus
//! the free bytes on either side of `s` in the arena, because evicting `s`
//! then opens a hole that large.

use smallvec::SmallVec;

use super::eqclass::EqClasses;
use super::{Heuristic, PolicyView};
use crate::graph::{Graph, StorageId};

#[derive(Default)]
pub struct DtrEq {
    classes: EqClasses,
    fragmentation_aware: bool,
}

impl DtrEq {
    /// `dte`: sizes include the adjacent free blocks.
    pub fn fragmentation_aware() -> DtrEq {
        DtrEq {
            fragmentation_aware: true,
            ..DtrEq::default()
        }
    }

    /// `c0(s)` plus the cost of the distinct classes of its evicted neighbours.
    pub fn neighbourhood_cost(&self, storage: StorageId, graph: &Graph) -> u64 {
        let mut roots: SmallVec<[u32; 8]> = SmallVec::new();
        let mut cost = graph.storages[storage].cost;
        for neighbour in graph.evicted_neighbours(storage) {
            if let Some(root) = self.classes.class_of(neighbour) {
                if !roots.contains(&root) {
                    roots.push(root);
                    cost = cost.saturating_add(self.classes.class_cost(root));
                }
            }
        }
        cost
    }
}

impl Heuristic for DtrEq {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        let mut size = graph.storages[storage].bytes;
        if self.fragmentation_aware {
            size = size.saturating_add(view.free_neighbours(storage));
        }
        let denominator = size as f64 * graph.staleness(storage) as f64;
        if denominator > 0.0 {
            self.neighbourhood_cost(storage, graph) as f64 / denominator
        } else {
            f64::INFINITY
        }
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
