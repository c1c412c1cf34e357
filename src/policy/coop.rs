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
use super::{Admit, CandidatePool, CandidateSearch, Heuristic, PolicyView, Victims};
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
        admit: Admit<'_>,
    ) -> Victims {
        let Some(arena) = view.memory.arena() else {
            return self.eq.choose(pool, view, request, search, admit);
        };
        self.eq.before_scoring(view.graph);
        let graph = view.graph;
        cheapest_window(arena, pool, request, |storage| {
            self.piece_cost(storage, graph)
        })
        // No window can ever hold the request: free what the scores say.
        .unwrap_or_else(|| self.eq.choose(pool, view, request, search, admit))
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
    let pieces = arena.pieces().map(|piece| match piece {
        Piece::Free { size, .. } => Some(WindowPiece::free(size)),
        Piece::Used {
            size,
            owner: Some(storage),
            ..
        } if pool.contains(storage) => Some(WindowPiece {
            size,
            cost: price(storage),
            victim: Some(storage),
        }),
        Piece::Used { .. } => None,
    });
    cheapest_run(pieces, request).map(|(cost, storages)| Victims {
        storages,
        score: Some(cost),
        ..Victims::default()
    })
}

/// One arena piece as a window sees it: its bytes, what evicting it costs
/// (0 when free), and its storage when it is a victim.
#[derive(Debug, Clone, Copy)]
struct WindowPiece<T> {
    size: u64,
    cost: f64,
    victim: Option<T>,
}

impl<T> WindowPiece<T> {
    fn free(size: u64) -> Self {
        WindowPiece {
            size,
            cost: 0.0,
            victim: None,
        }
    }
}

/// The cheapest run of consecutive pieces (`None`: a piece no window may
/// cross) that covers `request` and holds a victim: its cost and victims.
/// Costs are non-negative, so the best run ending at a piece is the
/// shortest that covers the request, and two pointers find it in one pass.
/// Infinite costs (a storage needed now) are counted apart rather than
/// summed: `∞ − ∞` would make every later window's cost NaN, and NaN
/// compares as no better than anything, so the first window seen after one
/// would stick, however much it cost.
fn cheapest_run<T: Copy>(
    pieces: impl Iterator<Item = Option<WindowPiece<T>>>,
    request: u64,
) -> Option<(f64, SmallVec<[T; 4]>)> {
    let mut window: VecDeque<WindowPiece<T>> = VecDeque::new();
    let (mut size, mut finite, mut infinite) = (0u64, 0.0f64, 0usize);
    let mut best: Option<(f64, SmallVec<[T; 4]>)> = None;
    for piece in pieces {
        let Some(piece) = piece else {
            window.clear();
            (size, finite, infinite) = (0, 0.0, 0);
            continue;
        };
        window.push_back(piece);
        size += piece.size;
        if piece.cost.is_finite() {
            finite += piece.cost;
        } else {
            infinite += 1;
        }
        // Drop pieces from the left while the rest still covers the request.
        while let Some(&first) = window.front() {
            if size - first.size < request {
                break;
            }
            window.pop_front();
            size -= first.size;
            if first.cost.is_finite() {
                finite -= first.cost;
            } else {
                infinite -= 1;
            }
        }
        let cost = if infinite > 0 { f64::INFINITY } else { finite };
        let holds_a_victim = window.iter().any(|piece| piece.victim.is_some());
        if size >= request && holds_a_victim && best.as_ref().is_none_or(|(b, _)| cost < *b) {
            best = Some((
                cost,
                window.iter().filter_map(|piece| piece.victim).collect(),
            ));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::{cheapest_run, WindowPiece};

    fn victim(id: u32, size: u64, cost: f64) -> Option<WindowPiece<u32>> {
        Some(WindowPiece {
            size,
            cost,
            victim: Some(id),
        })
    }

    #[test]
    fn a_window_needed_now_is_passed_over_for_a_cheaper_one_after_it() {
        // The first window holds a storage needed now (cost ∞); once it
        // slides past it, the windows are finite again, and the cheapest wins.
        let pieces = vec![
            victim(1, 10, f64::INFINITY),
            victim(2, 10, 5.0),
            victim(3, 10, 4.0),
            victim(4, 10, 1.0),
        ];
        let (cost, victims) = cheapest_run(pieces.into_iter(), 10).unwrap();
        assert_eq!((cost, victims.as_slice()), (1.0, &[4][..]));
    }

    #[test]
    fn only_windows_needed_now_cost_infinity_and_a_barrier_ends_a_window() {
        let pieces = vec![
            victim(1, 10, f64::INFINITY),
            Some(WindowPiece::free(5)),
            None,
            victim(2, 10, f64::INFINITY),
        ];
        let (cost, victims) = cheapest_run(pieces.into_iter(), 15).unwrap();
        assert!(cost.is_infinite());
        assert_eq!(victims.as_slice(), &[1]);
        let blocked = vec![victim(1, 10, 1.0), None, victim(2, 10, 1.0)];
        assert!(cheapest_run(blocked.into_iter(), 15).is_none());
    }

    #[test]
    fn free_pieces_alone_are_no_window() {
        let pieces = vec![Some(WindowPiece::<u32>::free(20)), victim(1, 10, 3.0)];
        let (cost, victims) = cheapest_run(pieces.into_iter(), 15).unwrap();
        assert_eq!((cost, victims.as_slice()), (3.0, &[1][..]));
    }
}
