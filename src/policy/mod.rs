//! Eviction policy: which storage to evict when memory runs short.
//!
//! A [`Heuristic`] scores a candidate from a read-only [`Graph`]; the lowest
//! score is evicted. Heuristics that keep their own bookkeeping (equivalence
//! classes of evicted storages, say) update it through the `on_*` hooks,
//! which the interpreter calls after each change of residency.

mod coop;
mod dtr;
mod dtr_eq;
mod dtr_local;
mod eqclass;
mod lru;
mod msps;
mod pool;
mod random;
mod region;
mod search;
mod size;

pub use pool::CandidatePool;
pub use search::{CandidateSearch, Sampling};

use slotmap::SecondaryMap;
use smallvec::{smallvec, SmallVec};

use crate::error::{Error, Result};
use crate::graph::{Graph, StorageId};
use crate::memory::{Block, Memory};

/// What a policy may look at: the graph, and where storages sit in memory.
#[derive(Clone, Copy)]
pub struct PolicyView<'a> {
    pub graph: &'a Graph,
    pub memory: &'a Memory,
    /// The block of every resident storage.
    pub blocks: &'a SecondaryMap<StorageId, Block>,
}

impl PolicyView<'_> {
    /// Free bytes beside `storage` in the arena (0 in counter mode).
    pub fn free_neighbours(&self, storage: StorageId) -> u64 {
        self.blocks
            .get(storage)
            .map_or(0, |&block| self.memory.free_neighbours(block))
    }
}

/// Victims chosen for one round of eviction.
pub type Victims = SmallVec<[StorageId; 4]>;

/// Scores eviction candidates; lower is evicted first.
pub trait Heuristic: Send {
    /// The name the CLI and configuration accept.
    fn name(&self) -> &'static str;

    /// One line on what the score is, for `dtr heuristics`.
    fn about(&self) -> &'static str;

    /// A scoring pass over the candidates is about to start (once per victim).
    fn before_scoring(&mut self, _graph: &Graph) {}

    /// The score of a resident candidate. `f64::INFINITY` means "only if
    /// nothing else". `&mut` so a heuristic may keep scratch space.
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64;

    /// What to evict to make room for an allocation of `request` bytes
    /// that does not fit. The default is the lowest-scoring candidate that
    /// `search` finds; policies that reason about address ranges override it.
    fn choose(
        &mut self,
        pool: &CandidatePool,
        view: &PolicyView<'_>,
        _request: u64,
        search: &mut CandidateSearch,
    ) -> Victims {
        self.before_scoring(view.graph);
        match search.lowest(pool, |storage| self.score(storage, view)) {
            Some(storage) => smallvec![storage],
            None => SmallVec::new(),
        }
    }

    /// `storage` was just evicted (its residency already says so).
    fn on_evict(&mut self, _storage: StorageId, _graph: &Graph) {}

    /// `storage` was evicted before and is resident again.
    fn on_rematerialize(&mut self, _storage: StorageId, _graph: &Graph) {}

    /// `storage` is about to be removed from the graph for good.
    fn on_free(&mut self, _storage: StorageId, _graph: &Graph) {}

    /// The tensors, edges or residency around `storage` change: called after
    /// additions (a new op's outputs, a first computation) and before
    /// removals (a freed tensor, a cut history). Evictions and
    /// rematerialisations have their own hooks.
    fn on_graph_change(&mut self, _storage: StorageId, _graph: &Graph) {}
}

type MakeHeuristic = fn(seed: u64) -> Box<dyn Heuristic>;

/// Every heuristic: its name and how to make it (from the run's seed).
const REGISTRY: &[(&str, MakeHeuristic)] = &[
    ("dtr", |_| Box::new(dtr::Dtr::default())),
    ("dtr-walk", |_| Box::new(dtr::DtrWalk::default())),
    ("dtr-eq", |_| Box::new(dtr_eq::DtrEq::default())),
    ("dtr-local", |_| Box::new(dtr_local::DtrLocal)),
    ("msps", |_| Box::new(msps::Msps::default())),
    ("lru", |_| Box::new(lru::Lru)),
    ("size", |_| Box::new(size::Size)),
    ("random", |seed| Box::new(random::Random::new(seed))),
    ("dte", |_| Box::new(dtr_eq::DtrEq::fragmentation_aware())),
    ("coop", |_| {
        Box::new(coop::Coop::<dtr_eq::DtrEq>::named("coop"))
    }),
    ("coop-dtr", |_| {
        Box::new(coop::Coop::<dtr::Dtr>::named("coop-dtr"))
    }),
];

/// Names accepted by [`heuristic_by_name`].
pub fn heuristic_names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|(name, _)| *name)
}

/// Makes the heuristic called `name`; `seed` drives any randomness it has.
pub fn heuristic_by_name(name: &str, seed: u64) -> Result<Box<dyn Heuristic>> {
    REGISTRY
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, make)| make(seed))
        .ok_or_else(|| Error::UnknownHeuristic {
            name: name.to_string(),
            known: heuristic_names().collect::<Vec<_>>().join(", "),
        })
}

/// `cost / (bytes · staleness)`, +∞ when the denominator is zero.
pub(crate) fn cost_density(cost: u64, storage: StorageId, graph: &Graph) -> f64 {
    let denominator = graph.storages[storage].bytes as f64 * graph.staleness(storage) as f64;
    if denominator > 0.0 {
        cost as f64 / denominator
    } else {
        f64::INFINITY
    }
}
