//! Evicted regions: the evicted storages reachable from a storage through
//! evicted storages only, towards its descendants or its ancestors. Their
//! summed cost is what recomputing around the storage would add.

use slotmap::SecondaryMap;

use crate::graph::{Graph, Residency, StorageId};

/// Which way a region grows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Through the outputs of the ops that read the storage's tensors.
    Descendants,
    /// Through the inputs of the ops that made them.
    Ancestors,
}

/// Walks regions with reusable scratch space (a generation-stamped visited set).
#[derive(Default)]
pub struct RegionWalker {
    visited: SecondaryMap<StorageId, u32>,
    generation: u32,
    stack: Vec<StorageId>,
}

impl RegionWalker {
    /// Summed `c0` of the evicted region around `base` in `direction`.
    pub fn cost(&mut self, graph: &Graph, base: StorageId, direction: Direction) -> u64 {
        match self.cost_unless(graph, base, direction, |_| false) {
            Ok(total) | Err(total) => total,
        }
    }

    /// [`RegionWalker::cost`], or `Err(cost so far)` as soon as
    /// `beyond(cost so far)` says the rest of the walk cannot matter (the
    /// costs only add up).
    pub fn cost_unless(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
        mut beyond: impl FnMut(u64) -> bool,
    ) -> Result<u64, u64> {
        let mut total = 0u64;
        let mut stopped = false;
        self.walk(graph, base, direction, |storage, resident| {
            if !resident {
                total = total.saturating_add(graph.storages[storage].cost);
                stopped = beyond(total);
            }
            !stopped
        });
        if stopped {
            Err(total)
        } else {
            Ok(total)
        }
    }

    /// The soonest the program reads a storage of the evicted region
    /// around `base` in `direction` (see [`Graph::until_next_read`]), or
    /// `Err(soonest so far)` as soon as `beyond(soonest so far)` says the
    /// rest of the walk cannot matter (the soonest only comes sooner).
    pub fn soonest_read_unless(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
        mut beyond: impl FnMut(u64) -> bool,
    ) -> Result<Option<u64>, u64> {
        let mut soonest: Option<u64> = None;
        let mut stopped = false;
        self.walk(graph, base, direction, |storage, resident| {
            if let (false, Some(until)) = (resident, graph.until_next_read(storage)) {
                let sooner = soonest.map_or(until, |soonest| soonest.min(until));
                soonest = Some(sooner);
                stopped = beyond(sooner);
            }
            !stopped
        });
        match soonest {
            Some(soonest) if stopped => Err(soonest),
            soonest => Ok(soonest),
        }
    }

    /// The summed `c0` of the evicted region around `base` in `direction`
    /// and the soonest the program reads one of its storages (see
    /// [`RegionWalker::soonest_read_unless`]), in one walk.
    pub fn cost_and_soonest_read(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
    ) -> (u64, Option<u64>) {
        let mut total = 0u64;
        let mut soonest: Option<u64> = None;
        self.walk(graph, base, direction, |storage, resident| {
            if !resident {
                total = total.saturating_add(graph.storages[storage].cost);
                if let Some(until) = graph.until_next_read(storage) {
                    soonest = Some(soonest.map_or(until, |soonest| soonest.min(until)));
                }
            }
            true
        });
        (total, soonest)
    }

    /// Every storage the region walks from `bases` and `seeds` touch, once:
    /// the bases, whatever their residency, the seeds still in the graph
    /// and computed, the evicted storages of the regions around them, and
    /// the resident ones bordering those (see [`RegionWalker::walk_from`]).
    /// Returns the summed `c0` of the evicted ones.
    pub fn reach(
        &mut self,
        graph: &Graph,
        bases: &[StorageId],
        seeds: &[StorageId],
        direction: Direction,
        found: &mut Vec<StorageId>,
    ) -> u64 {
        let mut evicted_cost = 0u64;
        self.walk_from(graph, bases, seeds, direction, |storage, resident| {
            found.push(storage);
            if !resident {
                evicted_cost = evicted_cost.saturating_add(graph.storages[storage].cost);
            }
            true
        });
        evicted_cost
    }

    /// Visits each storage adjacent to `base` or to an evicted storage
    /// visited before, once, with whether it is resident; expands through
    /// evicted ones only, and stops when `visit` says so (returns false).
    /// Pending outputs (not computed yet) are invisible.
    #[inline(always)]
    fn walk(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
        mut visit: impl FnMut(StorageId, bool) -> bool,
    ) {
        self.start([base]);
        self.expand(graph, direction, true, &mut visit);
    }

    /// One walk from many places: it expands from each base still in the
    /// graph, whatever its residency, and visits each seed as if a step
    /// had reached it (a seed is where a region used to reach through a
    /// storage since removed). Unlike [`RegionWalker::walk`], it visits the
    /// bases too.
    fn walk_from(
        &mut self,
        graph: &Graph,
        bases: &[StorageId],
        seeds: &[StorageId],
        direction: Direction,
        mut visit: impl FnMut(StorageId, bool) -> bool,
    ) {
        self.start(
            bases
                .iter()
                .copied()
                .filter(|&base| graph.storages.contains_key(base)),
        );
        for &base in &self.stack {
            visit(base, graph.storages[base].residency == Residency::Resident);
        }
        let generation = self.generation;
        let mut going = true;
        for &seed in seeds {
            if graph.storages.contains_key(seed) {
                self.step(graph, seed, generation, &mut going, &mut visit);
            }
        }
        self.expand(graph, direction, going, &mut visit);
    }

    /// Begins a walk at `bases`: queued for expansion, each once, and not
    /// visited.
    fn start(&mut self, bases: impl IntoIterator<Item = StorageId>) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.visited.clear();
            self.generation = 1;
        }
        self.stack.clear();
        for base in bases {
            if self.visited.insert(base, self.generation) != Some(self.generation) {
                self.stack.push(base);
            }
        }
    }

    /// Visits `next` unless seen in this walk or pending, and queues it for
    /// expansion when evicted.
    #[inline(always)]
    fn step(
        &mut self,
        graph: &Graph,
        next: StorageId,
        generation: u32,
        going: &mut bool,
        visit: &mut impl FnMut(StorageId, bool) -> bool,
    ) {
        if !*going || self.visited.get(next) == Some(&generation) {
            return;
        }
        self.visited.insert(next, generation);
        let residency = graph.storages[next].residency;
        if residency == Residency::Pending {
            return;
        }
        let resident = residency == Residency::Resident;
        *going = visit(next, resident);
        if !resident {
            self.stack.push(next);
        }
    }

    /// Expands the queued storages through their neighbours in
    /// `direction`, until none is left or `visit` says stop.
    #[inline(always)]
    fn expand(
        &mut self,
        graph: &Graph,
        direction: Direction,
        mut going: bool,
        visit: &mut impl FnMut(StorageId, bool) -> bool,
    ) {
        let generation = self.generation;
        if !going {
            self.stack.clear();
        }
        while let Some(storage) = self.stack.pop() {
            self.step_around(graph, storage, direction, generation, &mut going, visit);
            if !going {
                self.stack.clear();
            }
        }
    }

    /// [`RegionWalker::step`]s to each storage one step from `storage` in
    /// `direction`.
    #[inline(always)]
    fn step_around(
        &mut self,
        graph: &Graph,
        storage: StorageId,
        direction: Direction,
        generation: u32,
        going: &mut bool,
        visit: &mut impl FnMut(StorageId, bool) -> bool,
    ) {
        for &tensor in &graph.storages[storage].tensors {
            let info = &graph.tensors[tensor];
            match direction {
                Direction::Ancestors => {
                    if let Some(node) = info.producer {
                        for &input in graph.nodes[node].inputs() {
                            let next = graph.tensors[input].storage;
                            self.step(graph, next, generation, going, visit);
                        }
                    }
                }
                Direction::Descendants => {
                    for node in info.consumers.iter(&graph.nodes) {
                        for output in graph.nodes[node].live_outputs() {
                            let next = graph.tensors[output].storage;
                            self.step(graph, next, generation, going, visit);
                        }
                    }
                }
            }
        }
    }

    /// Adds to `found` the storages one step from `storage` in `direction`,
    /// each once (pending ones, which no region reaches, left out).
    pub fn neighbours(
        &mut self,
        graph: &Graph,
        storage: StorageId,
        direction: Direction,
        found: &mut Vec<StorageId>,
    ) {
        self.start([storage]);
        let generation = self.generation;
        let mut visit = |next, _| {
            found.push(next);
            true
        };
        self.step_around(graph, storage, direction, generation, &mut true, &mut visit);
        self.stack.clear();
    }
}
