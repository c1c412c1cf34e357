//! `h_DTR` looking ahead: `(c0(s) + Σ_{u ∈ e*(s)} c0(u)) / (m(s) · next(s))`,
//! where `next(s)` is the time until the program next reads one of the
//! storage's tensors instead of the time since it last did. A replay of a
//! recorded program knows that (see [`crate::graph::Foresight`]); what it
//! finds is a schedule a static plan can keep for a training step that
//! repeats. The eager and PyTorch APIs know it once the program marks
//! steps, from the step before ([`crate::Interpreter::mark_step`]); where
//! nothing tells it, it is `dtr`.
//!
//! The time until the next read is the soonest read of the storage or of
//! an evicted descendant (recomputing that one needs this storage too).
//! A storage that neither is read again costs nothing to evict.

use super::coop::cheapest_window;
use super::dtr::Dtr;
use super::region::{Direction, RegionWalker};
use super::{
    lowest_scoring, Admit, CandidatePool, CandidateSearch, Heuristic, PolicyView, Victims,
};
use slotmap::SecondaryMap;

use crate::graph::{Graph, StorageId};

#[derive(Default)]
pub struct DtrNext {
    /// The neighbourhood costs, cached as `dtr` caches them.
    dtr: Dtr,
    walker: RegionWalker,
    /// When the program next reads a storage's evicted descendant region:
    /// each found in full, with what it depends on (see [`SoonestRead`]).
    soonest: SecondaryMap<StorageId, SoonestRead>,
    /// Scores every candidate in full, as the reference that the bounded
    /// search is tested against, decision for decision.
    walks_every_score: bool,
}

/// The soonest the program reads a storage of an evicted descendant region,
/// in its own time (`None`: never). It holds while the region is the one
/// `dtr` walked under the same stamp ([`Dtr::descendants_walked`]) and no
/// evicted storage's next read has changed since: an evicted storage is
/// read only once it is back, which changes the region.
#[derive(Clone, Copy)]
struct SoonestRead {
    walked: u64,
    reads_changed: u64,
    at: Option<u64>,
}

/// `cost / (m · until)`: 0 when the storage is never read again, ∞ when
/// it is read now. It never falls as `until` shrinks or `cost` grows.
fn cost_per_byte_time(cost: f64, bytes: u64, until: Option<u64>) -> f64 {
    let Some(until) = until else {
        return 0.0;
    };
    let denominator = bytes as f64 * until as f64;
    if denominator > 0.0 {
        cost / denominator
    } else {
        f64::INFINITY
    }
}

impl DtrNext {
    /// The reference: no candidate skipped by a bound, every walk to its end.
    pub fn walking() -> Self {
        Self {
            walks_every_score: true,
            ..Self::default()
        }
    }

    /// The time until the program next reads the storage or an evicted
    /// descendant (recomputing that one needs this storage too); `None`
    /// when neither is read again.
    fn until_next_read(&mut self, storage: StorageId, graph: &Graph) -> Option<u64> {
        let at = self.region_read_at(storage, graph);
        soonest_of(graph, storage, at)
    }

    /// When the program next reads a storage of the evicted region below
    /// `storage`, in its own time. Kept while `dtr` knows the region
    /// exactly (see [`SoonestRead`]): an arena's windows price every
    /// candidate in it, again after each eviction, and walking each one's
    /// region every time was most of a plain-arena replay. The walk that
    /// finds it also gives `dtr` the region's cost.
    fn region_read_at(&mut self, storage: StorageId, graph: &Graph) -> Option<u64> {
        if self.walks_every_score {
            let walk =
                (self.walker)
                    .soonest_read_unless(graph, storage, Direction::Descendants, |_| false);
            let until = walk.unwrap_or_else(Some);
            return until.map(|until| graph.foresight.now.saturating_add(until));
        }
        if let Some(at) = self.kept_region_read_at(storage, graph) {
            return at;
        }
        let reads_changed = graph.foresight.evicted_reads_changed;
        let (cost, until) =
            (self.walker).cost_and_soonest_read(graph, storage, Direction::Descendants);
        let now = graph.foresight.now;
        let at = until.map(|until| now.saturating_add(until));
        let walked = self.dtr.walked_descendants(storage, cost);
        self.keep_region_read(storage, walked, reads_changed, until, now);
        at
    }

    /// Keeps a region's soonest read, `until` from `now`, found by a walk
    /// of the region `dtr` stamped `walked` with `reads_changed` as it is.
    /// Not a read due now: it may be one already past, whose time the walk
    /// did not give.
    fn keep_region_read(
        &mut self,
        storage: StorageId,
        walked: u64,
        reads_changed: u64,
        until: Option<u64>,
        now: u64,
    ) {
        if until != Some(0) {
            let soonest = SoonestRead {
                walked,
                reads_changed,
                at: until.map(|until| now.saturating_add(until)),
            };
            self.soonest.insert(storage, soonest);
        }
    }

    /// [`DtrNext::region_read_at`] where it is kept: `None` if not.
    fn kept_region_read_at(&self, storage: StorageId, graph: &Graph) -> Option<Option<u64>> {
        let walked = self.dtr.descendants_walked(storage)?;
        let soonest = self.soonest.get(storage)?;
        let valid = soonest.walked == walked
            && soonest.reads_changed == graph.foresight.evicted_reads_changed;
        valid.then_some(soonest.at)
    }

    /// The neighbourhood's cost over the time until the next read: what
    /// evicting the storage costs per unit of time it may stay away.
    fn cost_per_time(&mut self, storage: StorageId, graph: &Graph) -> f64 {
        let Some(until) = self.until_next_read(storage, graph) else {
            return 0.0;
        };
        let cost = self.dtr.neighbourhood_cost(storage, graph) as f64;
        if until > 0 {
            cost / until as f64
        } else {
            f64::INFINITY
        }
    }
}

/// The time until the program reads `storage` itself or, at `region_at`,
/// its evicted region, whichever is sooner.
fn soonest_of(graph: &Graph, storage: StorageId, region_at: Option<u64>) -> Option<u64> {
    let own = graph.until_next_read(storage);
    let region = region_at.map(|at| at.saturating_sub(graph.foresight.now));
    own.into_iter().chain(region).min()
}

impl Heuristic for DtrNext {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        if !graph.foresight.known {
            return self.dtr.score(storage, view);
        }
        let Some(until) = self.until_next_read(storage, graph) else {
            return 0.0;
        };
        let cost = self.dtr.neighbourhood_cost(storage, graph) as f64;
        cost_per_byte_time(cost, graph.storages[storage].bytes, Some(until))
    }

    /// The score where it is at most `best` (the search has already
    /// ruled out candidates by [`Heuristic::lower_bound`]). The walk for
    /// the soonest read stops once a read so soon turns up that even the
    /// known cost floor puts the score above `best`; the walks for the
    /// cost then stop once the cost does. On long evicted regions (a
    /// recurrent network's backward pass) most candidates stop early.
    fn score_within(&mut self, storage: StorageId, view: &PolicyView<'_>, best: f64) -> f64 {
        let graph = view.graph;
        if !graph.foresight.known {
            return self.dtr.score_within(storage, view, best);
        }
        if self.walks_every_score {
            return self.score(storage, view);
        }
        let bytes = graph.storages[storage].bytes;
        let own = graph.until_next_read(storage);
        let floor = self.dtr.neighbourhood_cost_floor(storage, graph) as f64;
        let above = |until: u64| {
            let until = own.map_or(until, |own| own.min(until));
            cost_per_byte_time(floor, bytes, Some(until)) > best
        };
        let (through, walked) = match self.kept_region_read_at(storage, graph) {
            Some(at) => (at.map(|at| at.saturating_sub(graph.foresight.now)), false),
            None => {
                let walk = (self.walker).soonest_read_unless(
                    graph,
                    storage,
                    Direction::Descendants,
                    above,
                );
                let Ok(through) = walk else {
                    return f64::INFINITY;
                };
                (through, true)
            }
        };
        let until = own.into_iter().chain(through).min();
        let score = match until {
            None => 0.0, // never read again: nothing to walk for
            Some(_) => {
                let above = |cost: u64| cost_per_byte_time(cost as f64, bytes, until) > best;
                match self.dtr.neighbourhood_cost_unless(storage, graph, above) {
                    Some(cost) => cost_per_byte_time(cost as f64, bytes, until),
                    None => f64::INFINITY,
                }
            }
        };
        // A walk to its end is kept once `dtr` knows the region exactly,
        // as it may now that it has its cost.
        if let (true, Some(stamp)) = (walked, self.dtr.descendants_walked(storage)) {
            let reads_changed = graph.foresight.evicted_reads_changed;
            self.keep_region_read(storage, stamp, reads_changed, through, graph.foresight.now);
        }
        score
    }

    /// The cost known without walking over the time to the storage's own
    /// next read: the soonest read around it is no later, and the cost no
    /// less.
    fn lower_bound(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        if !graph.foresight.known {
            return self.dtr.lower_bound(storage, view);
        }
        if self.walks_every_score {
            return f64::NEG_INFINITY;
        }
        let Some(own) = graph.until_next_read(storage) else {
            return 0.0; // perhaps never read again: a score of 0
        };
        let cost = self.dtr.neighbourhood_cost_floor(storage, graph) as f64;
        cost_per_byte_time(cost, graph.storages[storage].bytes, Some(own))
    }

    /// In an arena whose free bytes would hold the request but no free
    /// block does, the cheapest contiguous window (Coop's, priced by
    /// [`DtrNext::cost_per_time`]): evicting one candidate at a time would
    /// scatter holes. Otherwise, and without foresight, the lowest score.
    /// An arena that moves blocks gathers scattered bytes itself, better
    /// than windows do (measured on the authors' logs).
    fn choose(
        &mut self,
        pool: &CandidatePool,
        view: &PolicyView<'_>,
        request: u64,
        search: &mut CandidateSearch,
        admit: Admit<'_>,
    ) -> Victims {
        let graph = view.graph;
        let windows = graph.foresight.known && !view.memory.moves_blocks();
        if let Some(arena) = view.memory.arena().filter(|_| windows) {
            let free = arena
                .capacity()
                .saturating_sub(view.memory.counter().in_use_bytes());
            if free >= request {
                self.before_scoring(graph);
                let window = cheapest_window(arena, pool, request, |storage| {
                    self.cost_per_time(storage, graph)
                });
                if let Some(victims) = window {
                    return victims;
                }
            }
        }
        lowest_scoring(self, pool, view, search, admit)
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
