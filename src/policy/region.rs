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
    /// around `base` in `direction` (see [`Graph::until_next_read`]).
    pub fn soonest_read(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
    ) -> Option<u64> {
        let mut soonest: Option<u64> = None;
        self.walk(graph, base, direction, |storage, resident| {
            if !resident {
                if let Some(until) = graph.until_next_read(storage) {
                    soonest = Some(soonest.map_or(until, |s| s.min(until)));
                }
            }
            true
        });
        soonest
    }

    /// Every storage the region walk from `base` touches: `base`, the
    /// evicted storages of its region, and the resident ones bordering it.
    pub fn reach(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
        found: &mut Vec<StorageId>,
    ) {
        found.push(base);
        self.walk(graph, base, direction, |storage, _| {
            found.push(storage);
            true
        });
    }

    /// Visits each storage adjacent to `base` or to an evicted storage
    /// visited before, once, with whether it is resident; expands through
    /// evicted ones only, and stops when `visit` says so (returns false).
    /// Pending outputs (not computed yet) are invisible.
    fn walk(
        &mut self,
        graph: &Graph,
        base: StorageId,
        direction: Direction,
        mut visit: impl FnMut(StorageId, bool) -> bool,
    ) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.visited.clear();
            self.generation = 1;
        }
        let generation = self.generation;
        self.stack.clear();
        self.stack.push(base);
        self.visited.insert(base, generation);
        let mut going = true;
        while let Some(storage) = self.stack.pop() {
            for &tensor in &graph.storages[storage].tensors {
                let info = &graph.tensors[tensor];
                let mut step = |next: StorageId| {
                    if !going || self.visited.get(next) == Some(&generation) {
                        return;
                    }
                    self.visited.insert(next, generation);
                    let residency = graph.storages[next].residency;
                    if residency == Residency::Pending {
                        return;
                    }
                    let resident = residency == Residency::Resident;
                    going = visit(next, resident);
                    if !resident {
                        self.stack.push(next);
                    }
                };
                match direction {
                    Direction::Ancestors => {
                        if let Some(node) = info.producer {
                            for &input in graph.nodes[node].inputs() {
                                step(graph.tensors[input].storage);
                            }
                        }
                    }
                    Direction::Descendants => {
                        for node in info.consumers.iter(&graph.nodes) {
                            for output in graph.nodes[node].live_outputs() {
                                step(graph.tensors[output].storage);
                            }
                        }
                    }
                }
            }
            if !going {
                self.stack.clear();
            }
        }
    }
}
