//! Eviction policy: which storage to evict when memory runs short.
//!
//! A [`Heuristic`] scores a candidate from a read-only [`Graph`]; the lowest
//! score is evicted. Heuristics that keep their own bookkeeping (equivalence
//! classes of evicted storages, say) update it through the `on_*` hooks,
//! which the interpreter calls after each change of residency.

mod dtr;
mod dtr_eq;
mod dtr_local;
mod eqclass;
mod lru;
mod msps;
mod pool;
mod region;
mod size;

pub use pool::CandidatePool;

use crate::error::{Error, Result};
use crate::graph::{Graph, StorageId};

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
    fn score(&mut self, storage: StorageId, graph: &Graph) -> f64;

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

type MakeHeuristic = fn() -> Box<dyn Heuristic>;

/// Every heuristic: its name and how to make it.
const REGISTRY: &[(&str, MakeHeuristic)] = &[
    ("dtr", || Box::new(dtr::Dtr::default())),
    ("dtr-walk", || Box::new(dtr::DtrWalk::default())),
    ("dtr-eq", || Box::new(dtr_eq::DtrEq::default())),
    ("dtr-local", || Box::new(dtr_local::DtrLocal)),
    ("lru", || Box::new(lru::Lru)),
    ("msps", || Box::new(msps::Msps::default())),
    ("size", || Box::new(size::Size)),
];

/// Names accepted by [`heuristic_by_name`].
pub fn heuristic_names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|(name, _)| *name)
}

/// Makes the heuristic called `name`.
pub fn heuristic_by_name(name: &str) -> Result<Box<dyn Heuristic>> {
    REGISTRY
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, make)| make())
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

/// The victim among `pool`: the lowest score, the last one on ties, and the
/// first score of 0 ends the scan (nothing can be lower).
pub fn choose_victim(
    heuristic: &mut dyn Heuristic,
    pool: &CandidatePool,
    graph: &Graph,
) -> Option<StorageId> {
    heuristic.before_scoring(graph);
    let mut best: Option<(f64, StorageId)> = None;
    for storage in pool.iter() {
        let score = heuristic.score(storage, graph);
        if best.is_none_or(|(b, _)| score <= b) {
            best = Some((score, storage));
            if score <= 0.0 {
                break;
            }
        }
    }
    best.map(|(_, storage)| storage)
}
