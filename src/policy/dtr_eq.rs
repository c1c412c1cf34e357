//! `h_DTR_eq = (c0(s) + Σ cost of the distinct classes of s's evicted
//! neighbours) / (m(s) · stale(s))`, with classes kept by union-find.
//!
//! `dte` is the same with MegEngine's fragmentation-aware size: `m(s)` plus
//! the free bytes on either side of `s` in the arena, because evicting `s`
//! then opens a hole that large.

use std::collections::HashMap;

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use super::eqclass::EqClasses;
use super::{Bounds, CandidatePool, Heuristic, PolicyView, PoolOrder};
use crate::graph::{Graph, StorageId};

/// The class nodes of one storage's distinct evicted neighbours, under a
/// generation of [`EqClasses`].
#[derive(Default)]
struct Neighbours {
    generation: u64,
    nodes: SmallVec<[u32; 4]>,
    /// Whether the storage watches the classes of these nodes (see
    /// [`EqClasses::watch`]).
    watching: bool,
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

    fn get_mut(&mut self, storage: StorageId) -> Option<&mut Neighbours> {
        let &entry = self.entry_of.get(storage)?;
        Some(&mut self.entries[entry as usize])
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

/// The summed cost of the distinct classes of `nodes`, and their roots.
fn roots_cost(classes: &EqClasses, nodes: &[u32]) -> (u64, SmallVec<[u32; 8]>) {
    let mut roots: SmallVec<[u32; 8]> = SmallVec::new();
    let mut cost = 0u64;
    for &node in nodes {
        let root = classes.root(node);
        if !roots.contains(&root) {
            roots.push(root);
            cost = cost.saturating_add(classes.class_cost(root));
        }
    }
    (cost, roots)
}

/// The changes to the pool's key extras (see [`Bounds`]) that `dtr-eq`
/// owes the pool, oldest first: a scored candidate's extra raised to the
/// cost its classes add, and set back to 0 wherever that cost can fall.
#[derive(Default)]
struct BoundLog {
    /// Whether the pool keeps extras (as of the last search): else nothing
    /// is logged, and the pool has none to lower.
    on: bool,
    changes: Vec<(StorageId, u64)>,
    /// Set when more resets piled up than the pool has members: clearing
    /// every extra is then cheaper than applying them.
    overflowed: bool,
    /// How many changes may pile up.
    room: usize,
}

impl BoundLog {
    /// Logs `extra` as the cost the classes of `storage` add now. Nothing to
    /// raise for 0: a pool extra above it has a reset logged after it.
    fn raise(&mut self, storage: StorageId, extra: u64) {
        if self.on && extra > 0 {
            self.changes.push((storage, extra));
        }
    }

    fn reset(&mut self, storage: StorageId) {
        if self.on {
            if self.changes.len() >= self.room {
                self.changes.clear();
                self.overflowed = true;
            }
            self.changes.push((storage, 0));
        }
    }
}

/// The score's only graph walk, finding the evicted neighbours, is cached
/// per storage: a storage's list is forgotten when it or a neighbour is
/// evicted, rematerialised or changes edges (each hook forgets the lists
/// of the storage and of everything adjacent to it), and all lists when
/// the classes are renamed. Class costs are read afresh at every score, so
/// scores are exactly those of the walk.
///
/// When the pool keys candidates by `(c0 + extra) / held`, a score sets the
/// candidate's extra to the cost its classes add, so that an ordered
/// search's bound is the score until that cost can fall: when a neighbour
/// leaves the evicted (rematerialised, freed), edges change, or a class's
/// cost falls (the watchers of [`EqClasses`]). Evictions only add cost.
#[derive(Default)]
pub struct DtrEq {
    classes: EqClasses,
    fragmentation_aware: bool,
    neighbours: NeighbourCache,
    /// Walk the graph at every score (the reference the cache is tested against).
    uncached: bool,
    bounds: BoundLog,
    /// Scratch: storages whose class cost fell.
    lowered: Vec<StorageId>,
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
        let cost = graph.storages[storage].cost;
        cost.saturating_add(self.classes_cost(storage, graph, false))
    }

    /// The cost of the distinct classes of the evicted neighbours of
    /// `storage`; with `watch`, it watches them unless it already does.
    fn classes_cost(&mut self, storage: StorageId, graph: &Graph, watch: bool) -> u64 {
        let generation = self.classes.generation();
        let fresh = matches!(self.neighbours.get(storage), Some(n) if n.generation == generation);
        let walked;
        let nodes = if fresh && !self.uncached {
            &self.neighbours.get(storage).expect("fresh").nodes
        } else {
            let nodes = self.walk(storage, graph);
            if self.uncached {
                walked = nodes;
                &walked
            } else {
                let cached = Neighbours {
                    generation,
                    nodes,
                    watching: false,
                };
                &self.neighbours.insert(storage, cached).nodes
            }
        };
        let (cost, roots) = roots_cost(&self.classes, nodes);
        if let Some(cached) = self.neighbours.get_mut(storage).filter(|_| watch) {
            if !std::mem::replace(&mut cached.watching, true) {
                for root in roots {
                    self.classes.watch(root, storage);
                }
            }
        }
        cost
    }

    /// The class nodes of the evicted neighbours of `storage`.
    fn walk(&self, storage: StorageId, graph: &Graph) -> SmallVec<[u32; 4]> {
        let neighbours = graph.evicted_neighbours(storage).into_iter();
        neighbours
            .filter_map(|neighbour| self.classes.node_of(neighbour))
            .collect()
    }

    /// Forgets the cached neighbours of `storage` and of every storage
    /// adjacent to it; with `lowered`, their added costs may have fallen.
    fn forget_around(&mut self, storage: StorageId, graph: &Graph, lowered: bool) {
        let lowered = lowered && self.bounds.on;
        if self.neighbours.is_empty() && !lowered {
            return;
        }
        self.neighbours.remove(storage);
        if lowered {
            self.bounds.reset(storage);
        }
        let (neighbours, bounds) = (&mut self.neighbours, &mut self.bounds);
        graph.for_each_neighbour(storage, |s| {
            neighbours.remove(s);
            if lowered {
                bounds.reset(s);
            }
        });
    }

    /// Takes `storage` out of its class; the storages watching the class
    /// lose their extras if its cost fell.
    fn leave_class(&mut self, storage: StorageId) {
        self.classes.remove(storage, &mut self.lowered);
        for watcher in self.lowered.drain(..) {
            if let Some(cached) = self.neighbours.get_mut(watcher) {
                cached.watching = false;
            }
            self.bounds.reset(watcher);
        }
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
            let graph = view.graph;
            let extra = self.classes_cost(storage, graph, self.bounds.on);
            self.bounds.raise(storage, extra);
            graph.storages[storage].cost.saturating_add(extra) as f64 / denominator
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

    /// Applies the logged changes (all extras cleared first if they
    /// overflowed), and logs from now on only while the pool keeps extras.
    fn update_bounds(&mut self, mut bounds: Bounds<'_>, graph: &Graph) {
        let log = &mut self.bounds;
        if std::mem::take(&mut log.overflowed) {
            bounds.clear();
        }
        for (storage, extra) in log.changes.drain(..) {
            if let Some(info) = graph.storages.get(storage) {
                bounds.set(storage, extra, info.bytes);
            }
        }
        log.on = bounds.kept();
        log.room = bounds.members().max(1024);
    }

    /// Every member's extra, once the logged changes are applied, is at
    /// most the cost its classes add now (found by walking the graph).
    fn check_bounds(&self, pool: &CandidatePool, graph: &Graph) -> Result<(), String> {
        let log = &self.bounds;
        let pending: HashMap<StorageId, u64> = log.changes.iter().copied().collect();
        for candidate in pool.iter() {
            let storage = candidate.storage;
            let extra = match pending.get(&storage) {
                Some(&extra) => extra,
                None if log.overflowed => 0,
                None => pool.extra(storage),
            };
            let (added, _) = roots_cost(&self.classes, &self.walk(storage, graph));
            if extra > added {
                return Err(format!(
                    "{storage:?} is keyed with an extra cost of {extra} where its classes add {added}"
                ));
            }
        }
        Ok(())
    }

    fn on_evict(&mut self, storage: StorageId, graph: &Graph) {
        // Its neighbours gain an evicted neighbour: their extras hold.
        self.forget_around(storage, graph, false);
        self.classes.insert(storage, graph.storages[storage].cost);
        for neighbour in graph.evicted_neighbours(storage) {
            self.classes.union(storage, neighbour);
        }
    }

    fn on_rematerialize(&mut self, storage: StorageId, graph: &Graph) {
        self.forget_around(storage, graph, true);
        self.leave_class(storage);
    }

    fn on_free(&mut self, storage: StorageId, _graph: &Graph) {
        // Its edges are gone; `on_graph_change` forgot around it before.
        self.neighbours.remove(storage);
        self.leave_class(storage);
    }

    fn on_graph_change(&mut self, storage: StorageId, graph: &Graph) {
        self.forget_around(storage, graph, true);
    }
}
