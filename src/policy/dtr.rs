//! `h_DTR = (c0(s) + Σ_{u ∈ e*(s)} c0(u)) / (m(s) · stale(s))`: the full
//! evicted neighbourhood `e*(s)`, towards descendants and towards ancestors.
//!
//! [`Dtr`] caches each storage's two region costs and, when the graph
//! changes at a storage `v`, forgets only the caches that can see `v`: those
//! of the storages from which `v` is reachable through evicted storages
//! (found by one walk outward from `v`). A score is then O(1) except after
//! a change nearby, instead of a graph walk per candidate per eviction.
//!
//! Changes are settled lazily, before the next scoring pass, by one walk
//! from all of them per direction: a storage on an affected path that
//! changed meanwhile is a source of that walk too, so it still reaches
//! every affected cache. A walk needs the edges the change was seen
//! through, so a storage whose edges are about to be removed (freed,
//! detached) leaves its neighbours as sources: every cache that could see
//! it sees one of them (one rematerialised and then freed before the next
//! pass would otherwise leave the caches that counted it while it was
//! evicted stale). A backward pass frees its history a storage at a time,
//! each inside the same large evicted region: walking the region per
//! freed storage made a recurrent network's replay quadratic. When
//! changes outnumber a quarter of the cache (the eager evictions between
//! two eviction rounds), clearing it is cheaper.
//! [`DtrWalk`] walks every time; it is the reference the cache is tested
//! against, decision for decision.
//!
//! An eviction only adds to the regions that can see it, so a cache it
//! touches keeps its old cost as a floor ([`Region::AtLeast`]) rather than
//! nothing: on large evicted regions (a recurrent network's backward pass,
//! thousands of released storages kept as history) many candidates then
//! lose on their floor without walking the region again. A
//! rematerialisation, or an edge removed, may shrink a region, but only by
//! what lies in the changed storage's own region in the same direction:
//! the cache keeps its old cost less that as a floor.

use slotmap::SecondaryMap;

use super::region::{Direction, RegionWalker};
use super::PolicyView;
use super::{cost_density, Heuristic, PoolOrder};
use crate::graph::{Graph, Residency, StorageId};

#[derive(Default)]
pub struct Dtr {
    walker: RegionWalker,
    /// Cached region costs.
    cached: SecondaryMap<StorageId, Cached>,
    scratch: Vec<StorageId>,
    /// Evicted or rematerialised since the last scoring pass, each once.
    unsettled: Vec<StorageId>,
    /// The storages of `unsettled` whose walk is still owed (a storage
    /// whose edges change leaves it for `removals`).
    owed: SecondaryMap<StorageId, ()>,
    /// Where regions may have lost cost since the last pass, through
    /// storages whose edges changed.
    removals: Removals,
    /// Exact descendant regions cached so far: each one's stamp.
    walks: u64,
}

/// A storage's cached regions.
#[derive(Clone, Copy, Default)]
struct Cached {
    /// `[descendants, ancestors]`.
    regions: [Option<Region>; 2],
    /// Which walk found the descendant region, while it is exact: it is the
    /// same set of storages as long as the stamp stays (see
    /// [`Dtr::descendants_walked`]).
    descendants_walk: u64,
}

/// The sources of the walks that lower the floors of the caches a removal
/// may have shrunk: the storages whose edges changed (where they remain)
/// and, per walk direction, the neighbours they had before.
#[derive(Default)]
struct Removals {
    changed: Vec<StorageId>,
    /// Indexed by [`slot`] of the walk's direction.
    neighbours: [Vec<StorageId>; 2],
    /// The summed `c0` of `changed` when noted (some are gone by the pass).
    cost: u64,
}

impl Removals {
    fn len(&self) -> usize {
        self.changed.len() + self.neighbours[0].len() + self.neighbours[1].len()
    }

    fn clear(&mut self) {
        self.changed.clear();
        self.neighbours.iter_mut().for_each(Vec::clear);
        self.cost = 0;
    }
}

/// What is known of a region's cost since its last change.
#[derive(Clone, Copy)]
enum Region {
    /// Its cost.
    Exact(u64),
    /// At least this: a walk stopped once its storage could no longer win.
    AtLeast(u64),
}

impl Region {
    /// A lower bound of its cost.
    fn floor(self) -> u64 {
        match self {
            Region::Exact(cost) | Region::AtLeast(cost) => cost,
        }
    }

    /// What is known of it once it may have grown.
    fn demoted(self) -> Region {
        Region::AtLeast(self.floor())
    }
}

fn slot(direction: Direction) -> usize {
    match direction {
        Direction::Descendants => 0,
        Direction::Ancestors => 1,
    }
}

impl Dtr {
    /// Records a change of residency at `storage`, to be settled before the
    /// next scoring pass (or before its edges change).
    fn unsettle(&mut self, storage: StorageId) {
        if self.owed.insert(storage, ()).is_none() {
            self.unsettled.push(storage);
        }
    }

    fn region_cost(&mut self, graph: &Graph, storage: StorageId, direction: Direction) -> u64 {
        if let Some(Region::Exact(cost)) = self.cached_region(storage, direction) {
            return cost;
        }
        let cost = self.walker.cost(graph, storage, direction);
        self.cache(storage, direction, Region::Exact(cost));
        cost
    }

    fn cached_region(&self, storage: StorageId, direction: Direction) -> Option<Region> {
        self.cached
            .get(storage)
            .and_then(|c| c.regions[slot(direction)])
    }

    /// A stamp naming the walk that found `storage`'s descendant region,
    /// while that region is known exactly (nothing it holds or borders has
    /// changed since); `None` otherwise. Other facts about the same region
    /// may be kept under the stamp, valid while it is returned.
    pub fn descendants_walked(&self, storage: StorageId) -> Option<u64> {
        let cached = self.cached.get(storage)?;
        match cached.regions[slot(Direction::Descendants)] {
            Some(Region::Exact(_)) => Some(cached.descendants_walk),
            _ => None,
        }
    }

    /// Takes `cost`, found by a walk of `storage`'s descendant region just
    /// now, as that region's cost (settle first, as for scoring), and
    /// returns its stamp (see [`Dtr::descendants_walked`]).
    pub fn walked_descendants(&mut self, storage: StorageId, cost: u64) -> u64 {
        if let Some(stamp) = self.descendants_walked(storage) {
            return stamp;
        }
        self.cache(storage, Direction::Descendants, Region::Exact(cost));
        self.walks
    }

    fn cache(&mut self, storage: StorageId, direction: Direction, region: Region) {
        let entry = (self.cached.entry(storage))
            .expect("live storage")
            .or_default();
        entry.regions[slot(direction)] = Some(region);
        if let (Direction::Descendants, Region::Exact(_)) = (direction, region) {
            self.walks += 1;
            entry.descendants_walk = self.walks;
        }
    }

    /// After evictions (`grown`): every cached region that a storage of
    /// `grown` is in or borders keeps its cost as a floor, since it can
    /// only have grown. Walking towards ancestors reaches the storages
    /// whose descendant regions can see a change, and the other way round.
    fn demote_around(&mut self, graph: &Graph, grown: &[StorageId]) {
        for (walk, demote) in [
            (Direction::Ancestors, Direction::Descendants),
            (Direction::Descendants, Direction::Ancestors),
        ] {
            self.scratch.clear();
            (self.walker).reach(graph, grown, &[], walk, &mut self.scratch);
            for &storage in &self.scratch {
                if let Some(entry) = self.cached.get_mut(storage) {
                    let region = &mut entry.regions[slot(demote)];
                    *region = region.map(Region::demoted);
                }
            }
        }
    }

    /// After rematerialisations and removals (`shrunk`, the storages that
    /// left regions, and `neighbours`, those next to storages removed,
    /// whose summed `c0` was `removed_cost`): every cached region that can
    /// see one of them may have shrunk. What it lost lies in their own
    /// regions in its direction (a storage no longer reached was reached
    /// through one of them), so its old cost less theirs stays a floor:
    /// in a long evicted chain that is nearly the new cost, and searches
    /// keep pruning by it instead of walking the chain again.
    fn shrink_around(
        &mut self,
        graph: &Graph,
        shrunk: &[StorageId],
        neighbours: &[Vec<StorageId>; 2],
        removed_cost: u64,
    ) {
        let own: u64 = shrunk
            .iter()
            .filter_map(|&storage| graph.storages.get(storage))
            .map(|info| info.cost)
            .fold(removed_cost, u64::saturating_add);
        let mut lost = [0u64; 2];
        let mut reached: [Vec<StorageId>; 2] = Default::default();
        for walk in [Direction::Ancestors, Direction::Descendants] {
            let found = &mut reached[slot(walk)];
            let neighbours = &neighbours[slot(walk)];
            lost[slot(walk)] = (self.walker).reach(graph, shrunk, neighbours, walk, found);
        }
        // The walk towards ancestors finds the descendant regions that can
        // see a change; what they lost is in the regions towards
        // descendants, and the other way round.
        for (walk, lose) in [
            (Direction::Ancestors, Direction::Descendants),
            (Direction::Descendants, Direction::Ancestors),
        ] {
            let lost = own.saturating_add(lost[slot(lose)]);
            for &storage in &reached[slot(walk)] {
                if let Some(entry) = self.cached.get_mut(storage) {
                    let region = &mut entry.regions[slot(lose)];
                    *region =
                        region.map(|region| Region::AtLeast(region.floor().saturating_sub(lost)));
                }
            }
        }
    }

    /// Notes that `storage`'s edges change: the next pass lowers the floors
    /// of the caches around it and around the neighbours it has now.
    fn note_removal(&mut self, graph: &Graph, storage: StorageId) {
        let removals = &mut self.removals;
        removals.changed.push(storage);
        removals.cost = removals.cost.saturating_add(graph.storages[storage].cost);
        for walk in [Direction::Ancestors, Direction::Descendants] {
            let neighbours = &mut removals.neighbours[slot(walk)];
            self.walker.neighbours(graph, storage, walk, neighbours);
        }
        if removals.len() > self.cached.len() {
            // Cheaper to forget everything than to walk from all of them.
            self.cached.clear();
            self.removals.clear();
        }
    }
}

impl Dtr {
    /// `c0(s)` plus the cost of its whole evicted neighbourhood (settle
    /// pending changes with [`Heuristic::before_scoring`] first).
    pub fn neighbourhood_cost(&mut self, storage: StorageId, graph: &Graph) -> u64 {
        graph.storages[storage].cost
            + self.region_cost(graph, storage, Direction::Descendants)
            + self.region_cost(graph, storage, Direction::Ancestors)
    }

    /// [`Dtr::neighbourhood_cost`], or `None` once `above(cost so far)`
    /// (costs only add up). A region not cached yet is walked until half
    /// its cost so far is above (or to its end); a walk cut short is kept
    /// as a floor until the region changes.
    pub fn neighbourhood_cost_unless(
        &mut self,
        storage: StorageId,
        graph: &Graph,
        above: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        let mut cost = graph.storages[storage].cost;
        for direction in [Direction::Descendants, Direction::Ancestors] {
            let known = self.cached_region(storage, direction);
            if let Some(Region::Exact(region)) = known {
                cost += region;
                continue;
            }
            let floor = known.map_or(0, Region::floor);
            if above(cost.saturating_add(floor)) {
                return None;
            }
            let before = cost;
            // Walked on to twice the cost that rules the candidate out, so
            // the floor kept rules it out again in the next searches: in a
            // recurrent network's backward pass, staleness grows a little
            // between searches and a floor just past the limit let the
            // same candidates walk the same long region in every one
            // (packed `nn.LSTM` over 1,000 steps at 0.7: 19 s → 7 s).
            let walked = (self.walker).cost_unless(graph, storage, direction, |region| {
                above(before.saturating_add(region) / 2)
            });
            match walked {
                Ok(region) => {
                    self.cache(storage, direction, Region::Exact(region));
                    cost += region;
                }
                Err(partial) => {
                    self.cache(storage, direction, Region::AtLeast(partial.max(floor)));
                    return None;
                }
            }
        }
        Some(cost)
    }

    /// At most [`Dtr::neighbourhood_cost`]: `c0(s)` plus what is known of
    /// its regions, without walking them (settle first, as for that).
    pub fn neighbourhood_cost_floor(&self, storage: StorageId, graph: &Graph) -> u64 {
        let known = [Direction::Descendants, Direction::Ancestors].map(|direction| {
            self.cached_region(storage, direction)
                .map_or(0, Region::floor)
        });
        (graph.storages[storage].cost)
            .saturating_add(known[0])
            .saturating_add(known[1])
    }
}

impl Heuristic for Dtr {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let cost = self.neighbourhood_cost(storage, view.graph);
        cost_density(cost, storage, view.graph)
    }

    fn known_score(&self, storage: StorageId, view: &PolicyView<'_>) -> Option<f64> {
        let [Some(Region::Exact(descendants)), Some(Region::Exact(ancestors))] =
            self.cached.get(storage)?.regions
        else {
            return None;
        };
        let cost = view.graph.storages[storage].cost + descendants + ancestors;
        Some(cost_density(cost, storage, view.graph))
    }

    /// A region not cached yet is walked only as long as the score could
    /// still be at most `best`: on large evicted regions (random DAGs under
    /// tight budgets) most candidates lose long before their walk ends.
    fn score_within(&mut self, storage: StorageId, view: &PolicyView<'_>, best: f64) -> f64 {
        let graph = view.graph;
        let info = &graph.storages[storage];
        let denominator = info.bytes as f64 * graph.staleness(storage) as f64;
        if denominator <= 0.0 {
            return cost_density(info.cost, storage, graph);
        }
        // Division rounds monotonically: a partial cost already above
        // `best` means the whole one is.
        let above = |cost: u64| cost as f64 / denominator > best;
        match self.neighbourhood_cost_unless(storage, graph, above) {
            Some(cost) => cost_density(cost, storage, graph),
            None => f64::INFINITY,
        }
    }

    /// `(c0(s) + what is known of its regions) / (m(s) · stale(s))`:
    /// regions only add cost.
    fn lower_bound(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let cost = self.neighbourhood_cost_floor(storage, view.graph);
        cost_density(cost, storage, view.graph)
    }

    fn at_least_cost_density(&self) -> bool {
        true
    }

    /// Regions only add cost to the cost density.
    fn pool_order(&self) -> Option<PoolOrder> {
        Some(PoolOrder::CostDensity)
    }

    /// Settles the changes since the last pass. Every cache was written in
    /// that pass or before, and a changed storage that is evicted now was
    /// resident then or evicted as now: its change can only have grown the
    /// regions that see it.
    fn before_scoring(&mut self, graph: &Graph) {
        let evicted = |storage: StorageId| graph.storages[storage].residency == Residency::Evicted;
        let mut unsettled = std::mem::take(&mut self.unsettled);
        // Storages whose edges changed since are no longer owed.
        unsettled.retain(|&storage| self.owed.remove(storage).is_some());
        let changes = unsettled.len() + self.removals.len();
        if self.cached.is_empty() || 4 * changes >= self.cached.len() {
            // One pass over the cache beats walks from every change.
            if self.removals.len() == 0 && unsettled.iter().all(|&storage| evicted(storage)) {
                for entry in self.cached.values_mut() {
                    entry.regions = entry.regions.map(|region| region.map(Region::demoted));
                }
            } else {
                self.cached.clear();
            }
        } else {
            // Evictions first: a floor lowered by a loss after it stays true.
            let (grown, mut shrunk): (Vec<_>, Vec<_>) =
                unsettled.iter().partition(|&&storage| evicted(storage));
            self.demote_around(graph, &grown);
            shrunk.extend_from_slice(&self.removals.changed);
            let neighbours = std::mem::take(&mut self.removals.neighbours);
            self.shrink_around(graph, &shrunk, &neighbours, self.removals.cost);
            self.removals.neighbours = neighbours;
        }
        self.removals.clear();
        unsettled.clear();
        self.unsettled = unsettled;
    }

    fn on_evict(&mut self, storage: StorageId, _graph: &Graph) {
        self.unsettle(storage);
    }

    fn on_rematerialize(&mut self, storage: StorageId, _graph: &Graph) {
        self.unsettle(storage);
    }

    /// Edges or tensors change at `storage`. Walks stop at resident storages
    /// and ignore pending ones, so the change reaches other caches only if
    /// `storage` is evicted, or was evicted when they were computed (an
    /// unsettled rematerialisation); otherwise it changes only its own
    /// regions.
    fn on_graph_change(&mut self, storage: StorageId, graph: &Graph) {
        let owed = self.owed.remove(storage).is_some();
        if self.cached.is_empty() {
            return; // nothing to forget, and nothing cached before the next pass settles
        }
        match graph.storages[storage].residency {
            Residency::Evicted => self.note_removal(graph, storage),
            Residency::Resident if owed => self.note_removal(graph, storage),
            Residency::Resident => {
                self.cached.remove(storage);
            }
            Residency::Pending => {}
        }
    }
}

/// `h_DTR` by a fresh graph walk per score: slow, obviously right.
#[derive(Default)]
pub struct DtrWalk {
    walker: RegionWalker,
}

impl Heuristic for DtrWalk {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        let cost = graph.storages[storage].cost
            + self.walker.cost(graph, storage, Direction::Descendants)
            + self.walker.cost(graph, storage, Direction::Ancestors);
        cost_density(cost, storage, graph)
    }

    fn lower_bound(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        cost_density(view.graph.storages[storage].cost, storage, view.graph)
    }

    fn at_least_cost_density(&self) -> bool {
        true
    }
}
