//! What a run did: counters and an optional event log.

use crate::graph::TensorId;

/// Counters of one interpreter's work so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops the user applied (each once).
    pub ops: u64,
    /// Cost of the ops the user applied, each counted once: the unbounded run's compute.
    pub baseline_compute: u64,
    /// Cost of every op run, rematerialisations included.
    pub compute: u64,
    /// Cost of rematerialisations alone.
    pub remat_compute: u64,
    /// Op re-executions made to bring evicted tensors back.
    pub rematerializations: u64,
    /// Storages evicted, eager evictions included.
    pub evictions: u64,
    /// Storages evicted because the user dropped their last handle.
    pub eager_evictions: u64,
    /// Ops that got room only by evicting inputs locked by pending
    /// rematerialisations (see [`crate::Config::lock_relaxation`]; under
    /// `hybrid` also parking, which sends those inputs to host memory).
    pub lock_relaxations: u64,
    /// Ops that fragmentation in an arena left without room, tried again
    /// with their outputs' blocks reserved before their inputs were
    /// restored.
    pub outputs_reserved_first: u64,
    /// Evictions after which the storage has a host copy (swap).
    pub swap_outs: u64,
    /// Storages brought back from their host copy instead of recomputed,
    /// when needed (prefetches not counted).
    pub swap_ins: u64,
    /// Storages copied back from host memory ahead of need.
    pub prefetches: u64,
    /// Copies written to host memory, by write-back or on demand.
    pub host_copies: u64,
    /// Time compute waited for the copy queue (cost units).
    pub swap_stall: u64,
    /// Times a compacting arena moved blocks to make room.
    pub compactions: u64,
    /// Bytes those moves copied.
    pub moved_bytes: u64,
    /// Time those moves took on the compute stream (cost units).
    pub move_cost: u64,
    /// Steps the program marked ([`crate::Interpreter::mark_step`]).
    pub steps: u64,
    /// Steps that made the previous step's evictions, by its plan, to the
    /// end: no policy ran but to repair requests the plan left short.
    pub planned_steps: u64,
    /// Requests of planned steps whose room the plan left short (the
    /// memory state differed from the recorded step's), made up by the
    /// policy.
    pub plan_repairs: u64,
}

impl Stats {
    /// The time the run took over the unbounded run's compute (1.0
    /// without rematerialisation, swap or moves).
    pub fn overhead(&self) -> f64 {
        if self.baseline_compute == 0 {
            1.0
        } else {
            self.elapsed() as f64 / self.baseline_compute as f64
        }
    }

    /// What the budget has cost beyond the unbounded run: recomputation,
    /// waiting for swap transfers, and moving blocks.
    pub fn budget_cost(&self) -> u64 {
        self.remat_compute
            .saturating_add(self.swap_stall)
            .saturating_add(self.move_cost)
    }

    /// Compute, swap stalls and moves: the time the run took, in cost units.
    pub fn elapsed(&self) -> u64 {
        self.compute
            .saturating_add(self.swap_stall)
            .saturating_add(self.move_cost)
    }
}

/// One eviction or rematerialisation, when [`crate::Config::record_events`] is on.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A storage, named by its root tensor, was evicted: by the policy, with
    /// the victim's score when the policy has one, or (`eager`) because
    /// its handles were dropped.
    Evict {
        /// The storage's root tensor.
        tensor: TensorId,
        /// Bytes freed.
        bytes: u64,
        /// Evicted because its handles were dropped, not to make room.
        eager: bool,
        /// The victim's score, when a policy with scores chose it.
        score: Option<f64>,
    },
    /// An op was run again to recompute `tensor` (the first output it restored).
    Rematerialize {
        /// The first evicted output the op restored.
        tensor: TensorId,
        /// The op's name.
        op: String,
    },
}
