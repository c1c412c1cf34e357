//! Interpreter configuration: a plain value with defaults and a builder.

use crate::memory::MemoryModel;
use crate::policy::Sampling;

/// How the interpreter manages memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The memory budget in bytes; `None` runs unbounded.
    pub budget_bytes: Option<u64>,
    /// A budget as this fraction (0, 1] of the backend's device memory,
    /// resolved to bytes when the interpreter starts; exclusive with
    /// `budget_bytes`.
    pub device_memory_fraction: Option<f64>,
    /// The eviction heuristic, by registry name (see [`crate::policy::heuristic_names`]).
    pub heuristic: String,
    /// Evict a storage as soon as no user handle refers to it, keeping its
    /// history for recomputation (the DTR authors' "eager eviction").
    pub eager_eviction: bool,
    /// Keep a log of evictions and rematerialisations (see [`crate::Event`]).
    pub record_events: bool,
    /// Never free a tensor's history, even when nothing can need it again:
    /// released tensors stay as evicted graph nodes and released puts stay
    /// resident. This is the DTR authors' simulator's convention, which
    /// replays of their logs follow to reproduce their numbers.
    pub retain_history: bool,
    /// Stop with [`crate::Error::Thrash`] once rematerialisation has cost more
    /// than this (the authors stop at 1× the unbounded run's compute).
    pub remat_limit: Option<u64>,
    /// Counting bytes, or placing them in an arena of exactly the budget.
    pub memory: MemoryModel,
    /// Which candidates the victim search scores.
    pub sampling: Sampling,
    /// Seeds every random choice (sampling, `random`); same seed, same run.
    pub seed: u64,
    /// When an op cannot get room during a deep rematerialisation, let the
    /// heuristic also evict inputs that the pending rematerialisations below
    /// it hold locked, instead of failing. Each storage is surrendered at
    /// most once per rematerialisation, so it always terminates. The DTR
    /// authors' simulator does not do this; replays of their logs turn it
    /// off to reproduce their numbers.
    pub lock_relaxation: bool,
    /// Evict only as a last resort a storage whose rematerialisation could
    /// not fit: one of the ops that recomputing it would run needs more
    /// recomputable bytes at once (inputs and outputs) than the budget
    /// leaves beside the most memory constants (puts, detached tensors) have
    /// held. Such a storage, once evicted, can only come back if the
    /// constants shrink; typically a tensor held for later whose inputs were
    /// large and are gone (a tied weight's first gradient, waiting for the
    /// second). Off by default: the DTR authors' runtime does not do this,
    /// and replays of their logs must reproduce their numbers. The `dtr`
    /// Python package turns it on.
    pub remat_memory_guard: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            budget_bytes: None,
            device_memory_fraction: None,
            heuristic: "dtr-eq".into(),
            eager_eviction: true,
            record_events: false,
            retain_history: false,
            remat_limit: None,
            memory: MemoryModel::Counter,
            sampling: Sampling::All,
            seed: 0,
            lock_relaxation: true,
            remat_memory_guard: false,
        }
    }
}

impl Config {
    pub fn with_budget_bytes(mut self, budget_bytes: u64) -> Config {
        self.budget_bytes = Some(budget_bytes);
        self
    }

    /// A budget of `fraction` of the device's memory (see
    /// [`crate::Backend::device_memory_bytes`]).
    pub fn with_device_memory_fraction(mut self, fraction: f64) -> Config {
        self.device_memory_fraction = Some(fraction);
        self
    }

    pub fn unbounded(mut self) -> Config {
        self.budget_bytes = None;
        self
    }

    pub fn with_heuristic(mut self, name: impl Into<String>) -> Config {
        self.heuristic = name.into();
        self
    }

    pub fn with_eager_eviction(mut self, eager: bool) -> Config {
        self.eager_eviction = eager;
        self
    }

    pub fn with_retained_history(mut self, retain: bool) -> Config {
        self.retain_history = retain;
        self
    }

    pub fn with_remat_limit(mut self, limit: u64) -> Config {
        self.remat_limit = Some(limit);
        self
    }

    pub fn with_memory(mut self, memory: MemoryModel) -> Config {
        self.memory = memory;
        self
    }

    pub fn with_sampling(mut self, sampling: Sampling) -> Config {
        self.sampling = sampling;
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Config {
        self.seed = seed;
        self
    }

    /// The DTR authors' simulator's conventions, to reproduce its numbers:
    /// history is retained and pending rematerialisations keep their locks.
    pub fn with_simulator_conventions(self, follow: bool) -> Config {
        self.with_retained_history(follow)
            .with_lock_relaxation(!follow)
    }

    pub fn with_lock_relaxation(mut self, relax: bool) -> Config {
        self.lock_relaxation = relax;
        self
    }

    pub fn with_remat_memory_guard(mut self, guard: bool) -> Config {
        self.remat_memory_guard = guard;
        self
    }

    pub fn with_events(mut self, record: bool) -> Config {
        self.record_events = record;
        self
    }
}
