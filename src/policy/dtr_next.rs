//! `h_DTR` looking ahead: `(c0(s) + Σ_{u ∈ e*(s)} c0(u)) / (m(s) · next(s))`,
//! where `next(s)` is the time until the program next reads one of the
//! storage's tensors instead of the time since it last did. Only a replay
//! of a recorded program knows that (see [`crate::graph::Foresight`]);
//! what it finds is a schedule a static plan can keep for a training step
//! that repeats. Where no replay tells it (the eager and PyTorch APIs), it
//! is `dtr`.
//!
//! The time until the next read is the soonest read of the storage or of
//! an evicted descendant (recomputing that one needs this storage too).
//! A storage that neither is read again costs nothing to evict.

use super::dtr::Dtr;
use super::region::{Direction, RegionWalker};
use super::{Heuristic, PolicyView};
use crate::graph::{Graph, StorageId};

#[derive(Default)]
pub struct DtrNext {
    /// The neighbourhood costs, cached as `dtr` caches them.
    dtr: Dtr,
    walker: RegionWalker,
}

impl Heuristic for DtrNext {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        if !graph.foresight.known {
            return self.dtr.score(storage, view);
        }
        // Recomputing an evicted descendant needs this storage too.
        let own = graph.until_next_read(storage);
        let through = self
            .walker
            .soonest_read(graph, storage, Direction::Descendants);
        let Some(until) = own.into_iter().chain(through).min() else {
            return 0.0;
        };
        let cost = self.dtr.neighbourhood_cost(storage, graph) as f64;
        let denominator = graph.storages[storage].bytes as f64 * until as f64;
        if denominator > 0.0 {
            cost / denominator
        } else {
            f64::INFINITY
        }
    }

    fn looks_ahead(&self) -> bool {
        true
    }

    fn before_scoring(&mut self, graph: &Graph) {
        self.dtr.before_scoring(graph);
    }

    fn on_evict(&mut self, storage: StorageId, graph: &Graph) {
        self.dtr.on_evict(storage, graph);
    }

    fn on_rematerialize(&mut self, storage: StorageId, graph: &Graph) {
        self.dtr.on_rematerialize(storage, graph);
    }

    fn on_free(&mut self, storage: StorageId, graph: &Graph) {
        self.dtr.on_free(storage, graph);
    }

    fn on_graph_change(&mut self, storage: StorageId, graph: &Graph) {
        self.dtr.on_graph_change(storage, graph);
    }
}
