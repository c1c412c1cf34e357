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
mod dtr_next;
mod eqclass;
mod lru;
mod msps;
mod pool;
mod random;
mod region;
mod search;
mod size;
mod summary;

pub use pool::{Bounds, Candidate, CandidatePool, PoolOrder};
pub use search::{chosen_before, CandidateSearch, Sampling};
pub use summary::{BoundClock, HeldThreshold, Summaries, Summary};

use std::collections::HashMap;

use slotmap::SecondaryMap;
use smallvec::{smallvec, SmallVec};

use crate::error::{Error, Result};
use crate::graph::{Graph, StorageId};
use crate::memory::{Block, Memory};

/// What a policy may look at: the graph, and where storages sit in memory.
#[derive(Clone, Copy)]
pub struct PolicyView<'a> {
    /// Tensors, storages and their compute history.
    pub graph: &'a Graph,
    /// Bytes in use, and in arena memory where they sit.
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

/// Victims chosen for one round of eviction, with the score that chose
/// them (one candidate's, or a whole address range's).
#[derive(Debug, Clone, Default)]
pub struct Victims {
    /// What to evict, in order.
    pub storages: SmallVec<[StorageId; 4]>,
    /// The score that chose them, when the policy scores.
    pub score: Option<f64>,
    /// Whether the admission test given to [`Heuristic::choose`] passed
    /// `storages` (else the caller applies it).
    pub admitted: bool,
    /// Candidates the admission test refused that the search would have
    /// chosen before `storages`, in the order it would have chosen them:
    /// what one search per refusal would have found and held back.
    pub refused: SmallVec<[StorageId; 4]>,
}

/// A test a victim must pass (the interpreter's rematerialisation memory
/// guard): `false` holds the candidate back.
pub type Admit<'a> = Option<&'a mut dyn FnMut(StorageId) -> bool>;

/// Scores eviction candidates; lower is evicted first.
pub trait Heuristic: Send {
    /// A scoring pass over the candidates is about to start (once per victim).
    fn before_scoring(&mut self, _graph: &Graph) {}

    /// The score of a resident candidate. `f64::INFINITY` means "only if
    /// nothing else". `&mut` so a heuristic may keep scratch space.
    fn score(&mut self, storage: StorageId, view: &PolicyView<'_>) -> f64;

    /// [`Heuristic::score`] where it is known without work (cached), else
    /// `None`.
    fn known_score(&self, _storage: StorageId, _view: &PolicyView<'_>) -> Option<f64> {
        None
    }

    /// [`Heuristic::score`] where it is at most `best`; where it is above,
    /// any value above `best` will do (a heuristic may then stop working
    /// it out), since such a candidate cannot win or tie.
    fn score_within(&mut self, storage: StorageId, view: &PolicyView<'_>, _best: f64) -> f64 {
        self.score(storage, view)
    }

    /// A value that [`Heuristic::score`] of `storage` is never below, and
    /// that is cheaper to find: candidates whose bound is already above the
    /// best score of a search are not scored. Only a true lower bound keeps
    /// the choices the same.
    fn lower_bound(&mut self, _storage: StorageId, _view: &PolicyView<'_>) -> f64 {
        f64::NEG_INFINITY
    }

    /// Whether every score is at least the candidate's own cost density
    /// `c0 / (m · stale)` (the DTR family): a search then skips, reading
    /// only the candidate pool, candidates whose density is already above
    /// the best score. Only a true bound keeps the choices the same.
    fn at_least_cost_density(&self) -> bool {
        false
    }

    /// The order of the candidate pool whose key bounds this heuristic's
    /// scores from below, if one does: an exact search (`--sampling all`)
    /// then visits candidates in that order and stops where no remaining
    /// one can beat the best (see [`CandidateSearch::lowest_ordered`]). The
    /// interpreter keeps the pool in it. Only a true bound keeps the
    /// choices the same.
    fn pool_order(&self) -> Option<PoolOrder> {
        None
    }

    /// Brings the extra costs in the pool's [`PoolOrder::CostDensity`]
    /// keys up to date, for a heuristic that maintains them (see
    /// [`Bounds`]; the default leaves them 0). The interpreter calls it
    /// before every search of the pool.
    fn update_bounds(&mut self, _bounds: Bounds<'_>, _graph: &Graph) {}

    /// Whether those extras, once the changes not yet handed over are
    /// applied, are lower bounds of what the scores add to `c0`, for
    /// invariant checks.
    fn check_bounds(
        &self,
        _pool: &CandidatePool,
        _graph: &Graph,
    ) -> std::result::Result<(), String> {
        Ok(())
    }

    /// What to evict to make room for an allocation of `request` bytes
    /// that does not fit. The default is the lowest-scoring candidate that
    /// `search` finds; policies that reason about address ranges override it.
    ///
    /// `admit`, where given, is applied to the candidates the search would
    /// choose, in its order, as a search per refusal would: the victim is
    /// the first admitted, and the refused ones before it are listed in
    /// [`Victims::refused`]. A policy may ignore it ([`Victims::admitted`]
    /// false), and the caller then tests its victims itself.
    fn choose(
        &mut self,
        pool: &CandidatePool,
        view: &PolicyView<'_>,
        _request: u64,
        search: &mut CandidateSearch,
        admit: Admit<'_>,
    ) -> Victims {
        lowest_scoring(self, pool, view, search, admit)
    }

    /// Whether it reads when the program next reads each storage
    /// ([`Graph::until_next_read`]), which a replay then tells it.
    fn looks_ahead(&self) -> bool {
        false
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

/// The lowest-scoring candidate that `search` finds, among those `admit`
/// passes: what [`Heuristic::choose`] does unless a policy overrides it.
pub(crate) fn lowest_scoring<H: Heuristic + ?Sized>(
    heuristic: &mut H,
    pool: &CandidatePool,
    view: &PolicyView<'_>,
    search: &mut CandidateSearch,
    admit: Admit<'_>,
) -> Victims {
    heuristic.before_scoring(view.graph);
    let bounded = heuristic.at_least_cost_density();
    let ordered = pool.order().is_some() && pool.order() == heuristic.pool_order();
    let clock = view.graph.clock;
    // √N draws are random: a search per refusal draws anew, so the caller
    // tests each victim and searches again.
    let admit = admit.filter(|_| search.sampling() == Sampling::All);
    let guarded = admit.is_some();
    // The guard's test walks a rematerialisation: one verdict per candidate
    // and search.
    let mut verdicts: HashMap<StorageId, bool> = HashMap::new();
    let mut admits = admit.map(|admit| {
        move |storage: StorageId| *verdicts.entry(storage).or_insert_with(|| admit(storage))
    });
    let mut admitted = |storage| admits.as_mut().is_none_or(|admits| admits(storage));
    // A scan of every candidate in pool order scores the first ones against
    // no best at all: the lowest score already known (of an admitted
    // candidate) is a limit from the start, since the lowest score is at
    // most it, so it chooses the same.
    let scans = search.sampling() == Sampling::All && !(ordered && search.next_search_is_ordered());
    let mut known = f64::INFINITY;
    if scans {
        let lowest_known = pool
            .iter()
            .filter_map(|c| Some((heuristic.known_score(c.storage, view)?, c.storage)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((score, storage)) = lowest_known {
            if admitted(storage) {
                known = score;
            }
        }
    }
    // With no score known, the first candidate in pool order would be
    // scored in full, however dear: on a long evicted region (a recurrent
    // network's backward pass) a walk of thousands of storages per search.
    // The admitted candidate of the lowest lower bound, scored in full, is
    // as good a limit and mostly a cheap one to find. The bounds found for
    // that, in pool order, are read by the scan instead of found again.
    let mut bounds = search.take_bounds();
    if scans && known == f64::INFINITY {
        let mut lowest: Option<(f64, StorageId)> = None;
        for candidate in pool.iter() {
            let bound = heuristic.lower_bound(candidate.storage, view);
            bounds.push((bound, candidate.storage));
            let lower = lowest.is_none_or(|(lowest, _)| bound.total_cmp(&lowest).is_lt());
            if bound > f64::NEG_INFINITY && lower {
                lowest = Some((bound, candidate.storage));
            }
            if bound <= 0.0 {
                break; // it may score 0, which ends a scan where it is
            }
        }
        let seed = match lowest {
            Some((_, storage)) if admitted(storage) => Some(storage),
            Some(_) => {
                // Refused by the guard: the next lowest bounds, in order.
                let rest = pool.iter().skip(bounds.len());
                bounds.extend(rest.map(|c| (heuristic.lower_bound(c.storage, view), c.storage)));
                let mut order: Vec<(f64, StorageId)> = bounds
                    .iter()
                    .copied()
                    .filter(|&(bound, _)| bound > f64::NEG_INFINITY)
                    .collect();
                order.sort_by(|a, b| a.0.total_cmp(&b.0));
                order
                    .into_iter()
                    .map(|(_, storage)| storage)
                    .find(|&storage| admitted(storage))
            }
            None => None,
        };
        if let Some(storage) = seed {
            // Scoring caches the seed's regions: the bounds stay bounds.
            known = heuristic.score(storage, view);
        }
    }
    let mut found_bounds = bounds.iter().peekable();
    // (score, pool position, storage) of each candidate refused.
    let mut refused: SmallVec<[(f64, u32, StorageId); 4]> = SmallVec::new();
    let score = |candidate: &Candidate, best: Option<f64>| {
        // A scan in pool order meets the candidates as they were found.
        let found_before = found_bounds.next_if(|&&(_, storage)| storage == candidate.storage);
        let best = match best {
            Some(best) => Some(best.min(known)),
            None => known.is_finite().then_some(known),
        };
        if let Some(best) = best {
            // The pool's bound reads no graph: most candidates stop here.
            if bounded && candidate.cost_density_bound(clock) > best {
                return None;
            }
            let bound = match found_before {
                Some(&(bound, _)) => bound,
                None => heuristic.lower_bound(candidate.storage, view),
            };
            if bound > best {
                return None;
            }
        }
        let score = match best {
            Some(best) => heuristic.score_within(candidate.storage, view, best),
            None => heuristic.score(candidate.storage, view),
        };
        // A candidate that could be chosen must pass first.
        if best.is_none_or(|best| score <= best) && !admitted(candidate.storage) {
            let position = pool.position(candidate.storage).expect("a member");
            refused.push((score, position, candidate.storage));
            return None;
        }
        Some(score)
    };
    let found = if ordered && search.sampling() == Sampling::All {
        search.lowest_exact(pool, clock, score)
    } else {
        // √N draws read the pool's summaries, and its entries only where
        // the bound could beat the best so far.
        search.lowest(pool, bounded.then_some(clock), score)
    };
    search.give_back_bounds(bounds);
    // The refused that the search would have chosen first, in its order.
    let victim = found.map(|(storage, score)| (score, pool.position(storage).expect("a member")));
    refused.retain(|&mut (score, position, _)| {
        victim.is_none_or(|victim| chosen_before((score, position), victim))
    });
    refused.sort_by(|a, b| {
        if chosen_before((a.0, a.1), (b.0, b.1)) {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Greater
        }
    });
    refused.dedup_by_key(|refusal| refusal.2);
    let refused = refused.into_iter().map(|(_, _, storage)| storage).collect();
    match found {
        Some((storage, score)) => Victims {
            storages: smallvec![storage],
            score: Some(score),
            admitted: guarded,
            refused,
        },
        None => Victims {
            admitted: guarded,
            refused,
            ..Victims::default()
        },
    }
}

type MakeHeuristic = fn(seed: u64) -> Box<dyn Heuristic>;

/// Where a policy can be named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usable {
    /// Wherever there is a budget: the interpreter, the eager and PyTorch
    /// APIs, `dtr replay`, `sweep`, `fit` and `chains`.
    Everywhere,
    /// `dtr replay`, `sweep` and `chains`: a plan made before the run,
    /// which takes no budget.
    Replays,
    /// `dtr chains` only: a closed-form optimum, not a run.
    Chains,
}

impl Usable {
    /// Where, in words, for `dtr heuristics`.
    pub fn describe(self) -> &'static str {
        match self {
            Usable::Everywhere => "everywhere",
            Usable::Replays => "replay, sweep, chains",
            Usable::Chains => "chains",
        }
    }
}

/// One policy a run can name: its name, what it does, where it can be
/// used, and (for heuristics) how to make it from the run's seed.
pub struct PolicyEntry {
    /// What runs and the CLI call it.
    pub name: &'static str,
    /// One line, for `dtr heuristics`.
    pub about: &'static str,
    /// Where it can be named.
    pub usable: Usable,
    make: Option<MakeHeuristic>,
}

impl PolicyEntry {
    const fn heuristic(name: &'static str, about: &'static str, make: MakeHeuristic) -> Self {
        PolicyEntry {
            name,
            about,
            usable: Usable::Everywhere,
            make: Some(make),
        }
    }

    /// Makes the heuristic; `seed` drives any randomness it has. Only
    /// entries that [`heuristic`] returns are heuristics.
    pub fn build(&self, seed: u64) -> Box<dyn Heuristic> {
        let make = self.make.expect("only heuristics are built");
        make(seed)
    }

    /// Whether it scores eviction candidates (else it is a static schedule).
    pub fn is_heuristic(&self) -> bool {
        self.make.is_some()
    }
}

/// Every policy, heuristics first. The one table that `dtr heuristics`,
/// the CLI, sweeps, the eager API and the Python package read.
pub const POLICIES: &[PolicyEntry] = &[
    PolicyEntry::heuristic(
        "dtr",
        "(own cost + cost of the whole evicted neighbourhood) / (size * staleness) (h_DTR)",
        |_| Box::new(dtr::Dtr::default()),
    ),
    PolicyEntry::heuristic(
        "dtr-walk",
        "h_DTR by walking the graph for every score: the slow reference for `dtr`",
        |_| Box::new(dtr::DtrWalk::default()),
    ),
    PolicyEntry::heuristic(
        "dtr-eq",
        "(own cost + cost of adjacent evicted classes, union-find) / (size * staleness) (h_DTR_eq)",
        |_| Box::new(dtr_eq::DtrEq::default()),
    ),
    PolicyEntry::heuristic(
        "dtr-next",
        "(own cost + cost of the whole evicted neighbourhood) / (size * time until the program next reads it): h_DTR looking ahead, for replays (their default); in an arena, Coop's cheapest window where free bytes are scattered",
        |_| Box::new(dtr_next::DtrNext::default()),
    ),
    PolicyEntry::heuristic(
        "dtr-local",
        "own recompute cost / (size * staleness) (h_DTR_local)",
        |_| Box::new(dtr_local::DtrLocal),
    ),
    PolicyEntry::heuristic(
        "msps",
        "(own cost + cost of evicted ancestors) / size, no staleness (h_MSPS, Capuchin)",
        |_| Box::new(msps::Msps::default()),
    ),
    PolicyEntry::heuristic(
        "lru",
        "evict the storage accessed longest ago (h_LRU)",
        |_| Box::new(lru::Lru),
    ),
    PolicyEntry::heuristic(
        "size",
        "evict the largest storage first (h_size)",
        |_| Box::new(size::Size),
    ),
    PolicyEntry::heuristic(
        "random",
        "a uniformly random candidate, from the run's seed (h_random)",
        |seed| Box::new(random::Random::new(seed)),
    ),
    PolicyEntry::heuristic(
        "dte",
        "h_DTR_eq with size + adjacent free bytes in the arena (MegEngine's fragmentation-aware DTE)",
        |_| Box::new(dtr_eq::DtrEq::fragmentation_aware()),
    ),
    PolicyEntry::heuristic(
        "coop",
        "evict the contiguous arena window of least total cost that fits the request (OneFlow's Coop)",
        |_| Box::new(coop::Coop::<dtr_eq::DtrEq>::default()),
    ),
    PolicyEntry::heuristic(
        "coop-dtr",
        "Coop with h_DTR's full evicted neighbourhood as the cost",
        |_| Box::new(coop::Coop::<dtr::Dtr>::default()),
    ),
    PolicyEntry {
        name: "static-sqrt",
        about: "static sqrt(N) checkpointing (Chen et al. 2016): keep every ~sqrt(N)th activation, recompute segments",
        usable: Usable::Replays,
        make: None,
    },
    PolicyEntry {
        name: "revolve",
        about: "the optimal schedule of a uniform chain in the same memory (Griewank's Revolve)",
        usable: Usable::Chains,
        make: None,
    },
];

/// Heuristics accepted by name but listed nowhere: slow references that
/// tests check the fast ones against, decision for decision.
const REFERENCES: &[PolicyEntry] = &[
    PolicyEntry::heuristic(
        "dtr-eq-walk",
        "h_DTR_eq by walking the graph for every score: the reference for `dtr-eq`'s cache",
        |_| Box::new(dtr_eq::DtrEq::walking()),
    ),
    PolicyEntry::heuristic(
        "dtr-next-walk",
        "dtr-next scoring every candidate in full: the reference for its bounded search",
        |_| Box::new(dtr_next::DtrNext::walking()),
    ),
];

/// The heuristic used at run time when none is named (library, eager and
/// PyTorch APIs, `dtr chains` aside): h_DTR, the paper's heuristic, exact
/// and cached. `dtr-eq` is its approximation for very large or
/// long-evicted graphs. Replays default to [`REPLAY_HEURISTIC`].
pub const DEFAULT_HEURISTIC: &str = "dtr";

/// The heuristic a replay of a recorded program uses when none is named
/// (`dtr replay`, `fit`, `plan`, [`crate::experiments::RunSpec`]):
/// `dtr-next`, h_DTR looking ahead. A recorded program's future is known,
/// so a replay may use it; in an arena it also evicts Coop's cheapest
/// window where fragmentation hides the room. What DTR does at run time,
/// with no foresight, is [`DEFAULT_HEURISTIC`] (`--heuristic dtr`).
pub const REPLAY_HEURISTIC: &str = "dtr-next";

/// Heuristics whose replays guard against rematerialisation cascades
/// unless told otherwise: they keep released history that an evicted live
/// tensor needs ([`crate::Config::keep_needed_history`]), evict last
/// what could not be rematerialised within the budget
/// ([`crate::Config::remat_memory_guard`]), and pin a run of pins resident
/// tensors first ([`crate::Config::pin_resident_first`]). `dtr-next` was
/// designed and measured with all three; the others replay the DTR authors' runtime, whose
/// numbers they reproduce, and take either when asked.
pub const GUARDED_BY_DEFAULT: &[&str] = &[REPLAY_HEURISTIC];

/// Names accepted by [`heuristic_by_name`].
pub fn heuristic_names() -> impl Iterator<Item = &'static str> {
    POLICIES.iter().filter(|p| p.is_heuristic()).map(|p| p.name)
}

/// The entry of the heuristic called `name`.
pub fn heuristic(name: &str) -> Result<&'static PolicyEntry> {
    match POLICIES.iter().chain(REFERENCES).find(|p| p.name == name) {
        Some(entry) if entry.is_heuristic() => Ok(entry),
        Some(entry) => Err(Error::InvalidArgument(format!(
            "`{name}` is not an eviction heuristic but a static schedule, usable in: {}",
            entry.usable.describe()
        ))),
        None => Err(Error::UnknownHeuristic {
            name: name.to_string(),
            known: heuristic_names().collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Makes the heuristic called `name`; `seed` drives any randomness it has.
pub fn heuristic_by_name(name: &str, seed: u64) -> Result<Box<dyn Heuristic>> {
    Ok(heuristic(name)?.build(seed))
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
