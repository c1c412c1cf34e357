//! Coop (OneFlow, NeurIPS 2023): in an address-ordered arena, evict the
//! contiguous window of least total cost that covers the request, so every
//! byte freed serves the allocation and no scattered holes are left.
//!
//! Pieces are taken in address order. A free piece costs 0; an evictable
//! storage costs its `h_DTR_eq` numerator over its staleness (the
//! recompute cost the paper's heuristics weigh, per unit of recency); a
//! piece that cannot be evicted (pinned, locked, a put, reserved for the
//! running op) ends any window. Because costs are non-negative, the best
//! window ending at a piece is the shortest one that still covers the
//! request, so two pointers find the best window in one pass. Without an
//! arena (counter memory) Coop falls back to `dtr-eq`.

use std::collections::VecDeque;

use super::dtr::Dtr;
use super::dtr_eq::DtrEq;
use super::{CandidatePool, CandidateSearch, Heuristic, PolicyView, Victims};
use crate::graph::{Graph, StorageId};
use crate::memory::{Arena, Piece};
use smallvec::SmallVec;

/// A heuristic that can price recomputing around a storage.
pub trait NeighbourhoodCost: Heuristic {
    fn neighbourhood_cost(&mut self, storage: StorageId, graph: &Graph) -> u64;
}

impl NeighbourhoodCost for DtrEq {
    fn neighbourhood_cost(&mut self, storage: StorageId, graph: &Graph) -> u64 {
        DtrEq::neighbourhood_cost(self, storage, graph)
    }
}

impl NeighbourhoodCost for Dtr {
    fn neighbourhood_cost(&mut self, storage: StorageId, graph: &Graph) -> u64 {
        Dtr::neighbourhood_cost(self, storage, graph)
    }
}

#[derive(Default)]
pub struct Coop<C> {
    /// Prices pieces, keeps its own bookkeeping, and scores the fallback.
    eq: C,
}

impl<C: NeighbourhoodCost> Coop<C> {
    fn piece_cost(&mut self, storage: StorageId, graph: &Graph) -> f64 {
        let staleness = graph.staleness(storage);
        if staleness == 0 {
            f64::INFINITY
        } else {
            self.eq.neighbourhood_cost(storage, graph) as f64 / staleness as f64
        }
    }
}

impl<C: NeighbourhoodCost> Heuristic for Coop<C> {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        self.eq.score(storage, view)
    }

    fn choose(
        &mut self,
        pool: &CandidatePool,
        view: &PolicyView<'_>,
        request: u64,
        search: &mut CandidateSearch,
    ) -> Victims {
        let Some(arena) = view.memory.arena() else {
            return self.eq.choose(pool, view, request, search);
        };
        self.eq.before_scoring(view.graph);
        let graph = view.graph;
        cheapest_window(arena, pool, request, |storage| {
            self.piece_cost(storage, graph)
        })
        // No window can ever hold the request: free what the scores say.
        .unwrap_or_else(|| self.eq.choose(pool, view, request, search))
    }

    fn on_evict(&mut self, storage: StorageId, graph: &Graph) {
        self.eq.on_evict(storage, graph);
    }

    fn on_rematerialize(&mut self, storage: StorageId, graph: &Graph) {
        self.eq.on_rematerialize(storage, graph);
    }

    fn on_free(&mut self, storage: StorageId, graph: &Graph) {
        self.eq.on_free(storage, graph);
    }

    fn on_graph_change(&mut self, storage: StorageId, graph: &Graph) {
        self.eq.on_graph_change(storage, graph);
    }
}

/// The contiguous window of arena pieces, in address order, that covers
/// `request` bytes at the least total cost and holds at least one victim:
/// free pieces cost 0, candidates in `pool` what `price` says, and any
/// other piece ends every window through it. `None` when no window can
/// hold the request.
pub(crate) fn cheapest_window(
    arena: &Arena,
    pool: &CandidatePool,
    request: u64,
    mut price: impl FnMut(StorageId) -> f64,
) -> Option<Victims> {
    // The window: pieces (size, cost, evictable storage) in address order.
    let mut window: VecDeque<(u64, f64, Option<StorageId>)> = VecDeque::new();
    let (mut size, mut cost) = (0u64, 0.0f64);
    let mut best: Option<(f64, SmallVec<[StorageId; 4]>)> = None;
    for piece in arena.pieces() {
        let entry = match piece {
            Piece::Free { size, .. } => (size, 0.0, None),
            Piece::Used {
                size,
                owner: Some(storage),
                ..
            } if pool.contains(storage) => (size, price(storage), Some(storage)),
            Piece::Used { .. } => {
                window.clear();
                (size, cost) = (0, 0.0);
                continue;
            }
        };
        window.push_back(entry);
        size += entry.0;
        cost += entry.1;
        // Drop pieces from the left while the rest still covers the request.
        while let Some(&(first, first_cost, _)) = window.front() {
            if size - first < request {
                break;
            }
            window.pop_front();
            size -= first;
            cost -= first_cost;
        }
        let holds_a_victim = window.iter().any(|(_, _, s)| s.is_some());
        if size >= request && holds_a_victim && best.as_ref().is_none_or(|(b, _)| cost < *b) {
            best = Some((cost, window.iter().filter_map(|&(_, _, s)| s).collect()));
        }
    }
    best.map(|(cost, storages)| Victims {
        storages,
        score: Some(cost),
    })
}
