//! `h_DTR_eq = (c0(s) + Σ cost of the distinct classes of s's evicted
//! neighbours) / (m(s) · stale(s))`, with classes kept by union-find.
//!
//! `dte` is the same with MegEngine's fragmentation-aware size: `m(s)` plus
//! the free bytes on either side of `s` in the arena, because evicting `s`
//! then opens a hole that large.

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use super::eqclass::EqClasses;
use super::{Heuristic, PolicyView, PoolOrder};
use crate::graph::{Graph, StorageId};

/// The class nodes of one storage's distinct evicted neighbours, under a
/// generation of [`EqClasses`].
#[derive(Default)]
struct Neighbours {
    generation: u64,
    nodes: SmallVec<[u32; 4]>,
}

/// The cached [`Neighbours`] of the storages scored since their last
/// change. The lists sit in a slab of as many entries as are cached at
/// once; a storage's table slot holds only its entry's index (8 B per
/// storage ever made, where the lists themselves would take 40 B).
#[derive(Default)]
struct NeighbourCache {
    entry_of: SecondaryMap<StorageId, u32>,
    entries: Vec<Neighbours>,
    /// Entries no storage uses, for the next insertions.
    vacant: Vec<u32>,
}

impl NeighbourCache {
    fn get(&self, storage: StorageId) -> Option<&Neighbours> {
        let &entry = self.entry_of.get(storage)?;
        Some(&self.entries[entry as usize])
    }

    /// Caches `neighbours` for `storage`, in place of any it had.
    fn insert(&mut self, storage: StorageId, neighbours: Neighbours) -> &Neighbours {
        let entry = match self.entry_of.get(storage) {
            Some(&entry) => entry,
            None => {
                let entry = self.vacant.pop().unwrap_or_else(|| {
                    self.entries.push(Neighbours::default());
                    (self.entries.len() - 1) as u32
                });
                self.entry_of.insert(storage, entry);
                entry
            }
        };
        let slot = &mut self.entries[entry as usize];
        *slot = neighbours;
        slot
    }

    fn remove(&mut self, storage: StorageId) {
        if let Some(entry) = self.entry_of.remove(storage) {
            // Drops a spilled list now rather than at the entry's next use.
            self.entries[entry as usize].nodes = SmallVec::new();
            self.vacant.push(entry);
        }
    }

    fn is_empty(&self) -> bool {
        self.entry_of.is_empty()
    }
}

/// The score's only graph walk, finding the evicted neighbours, is cached
/// per storage: a storage's list is forgotten when it or a neighbour is
/// evicted, rematerialised or changes edges (each hook forgets the lists
/// of the storage and of everything adjacent to it), and all lists when
/// the classes are renamed. Class costs are read afresh at every score, so
/// scores are exactly those of the walk.
#[derive(Default)]
pub struct DtrEq {
    classes: EqClasses,
    fragmentation_aware: bool,
    neighbours: NeighbourCache,
    /// Walk the graph at every score (the reference the cache is tested against).
    uncached: bool,
}

impl DtrEq {
    /// `dtr-eq-walk`: no cache, a graph walk per score.
    pub fn walking() -> DtrEq {
        DtrEq {
            uncached: true,
            ..DtrEq::default()
        }
    }

    /// `dte`: sizes include the adjacent free blocks.
    pub fn fragmentation_aware() -> DtrEq {
        DtrEq {
            fragmentation_aware: true,
            ..DtrEq::default()
        }
    }

    /// `c0(s)` plus the cost of the distinct classes of its evicted neighbours.
    pub fn neighbourhood_cost(&mut self, storage: StorageId, graph: &Graph) -> u64 {
        let generation = self.classes.generation();
        let fresh = matches!(self.neighbours.get(storage), Some(n) if n.generation == generation);
        let walked;
        let nodes = if fresh && !self.uncached {
            &self.neighbours.get(storage).expect("fresh").nodes
        } else {
            let mut nodes = SmallVec::new();
            for neighbour in graph.evicted_neighbours(storage) {
                if let Some(node) = self.classes.node_of(neighbour) {
                    nodes.push(node);
                }
            }
            if self.uncached {
                walked = nodes;
                &walked
            } else {
                let cached = Neighbours { generation, nodes };
                &self.neighbours.insert(storage, cached).nodes
            }
        };
        let mut roots: SmallVec<[u32; 8]> = SmallVec::new();
        let mut cost = graph.storages[storage].cost;
        for &node in nodes {
            let root = self.classes.root(node);
            if !roots.contains(&root) {
                roots.push(root);
                cost = cost.saturating_add(self.classes.class_cost(root));
            }
        }
        cost
    }

    /// Forgets the cached neighbours of `storage` and of every storage adjacent to it.
    fn forget_around(&mut self, storage: StorageId, graph: &Graph) {
        if self.neighbours.is_empty() {
            return;
        }
        self.neighbours.remove(storage);
        let neighbours = &mut self.neighbours;
        graph.for_each_neighbour(storage, |s| {
            neighbours.remove(s);
        });
    }
}

impl DtrEq {
    /// `m(s) · stale(s)`, `m(s)` with the adjacent free bytes for `dte`.
    fn denominator(&self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let graph = view.graph;
        let mut size = graph.storages[storage].bytes;
        if self.fragmentation_aware {
            size = size.saturating_add(view.free_neighbours(storage));
        }
        size as f64 * graph.staleness(storage) as f64
    }
}

impl Heuristic for DtrEq {
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let denominator = self.denominator(storage, view);
        if denominator > 0.0 {
            self.neighbourhood_cost(storage, view.graph) as f64 / denominator
        } else {
            f64::INFINITY
        }
    }

    /// `c0(s) / (m(s) · stale(s))`: the neighbourhood only adds cost, and
    /// rounding is monotone, so the score is never lower.
    fn lower_bound(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64 {
        let denominator = self.denominator(storage, view);
        if denominator > 0.0 {
            view.graph.storages[storage].cost as f64 / denominator
        } else {
            f64::INFINITY
        }
    }

    /// Not for `dte`, whose sizes with the free bytes beside make scores lower.
    fn at_least_cost_density(&self) -> bool {
        !self.fragmentation_aware
    }

    /// As [`Heuristic::at_least_cost_density`]; not for the walking
    /// reference either, which checks the ordered search against the scan.
    fn pool_order(&self) -> Option<PoolOrder> {
        (!self.fragmentation_aware && !self.uncached).then_some(PoolOrder::CostDensity)
    }

    fn on_evict(&mut self, storage: StorageId, graph: &Graph) {
        self.forget_around(storage, graph);
        self.classes.insert(storage, graph.storages[storage].cost);
        for neighbour in graph.evicted_neighbours(storage) {
            self.classes.union(storage, neighbour);
        }
    }

    fn on_rematerialize(&mut self, storage: StorageId, graph: &Graph) {
        self.forget_around(storage, graph);
        self.classes.remove(storage);
    }

    fn on_free(&mut self, storage: StorageId, _graph: &Graph) {
        // Its edges are gone; `on_graph_change` forgot around it before.
        self.neighbours.remove(storage);
        self.classes.remove(storage);
    }

    fn on_graph_change(&mut self, storage: StorageId, graph: &Graph) {
        self.forget_around(storage, graph);
    }
}
