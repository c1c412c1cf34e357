//! One configured replay of a trace on the simulator: the single path that
//! `dtr replay`, sweeps, chains, `dtr fit` and the benchmarks run through,
//! with every option validated in one place.
//!
//! `RunSpec` (what to run) + `Workload` (a loaded trace and its unbounded
//! baseline) → `Outcome` (what happened) → [`super::Row`] (one line of a
//! sweep's results).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::checkpoint::CheckpointPlan;
use crate::config::{Budget, Config, RestoreMode, SwapConfig};
use crate::error::{Error, Result};
use crate::interp::Interpreter;
use crate::memory::{ArenaReport, MemoryModel};
use crate::policy::{heuristic_by_name, Sampling, GUARDED_BY_DEFAULT};
use crate::trace::replay::{baseline, replay_observed, Baseline, Kernels, ReplayReport};
use crate::trace::{self, Trace, TraceFormat};
use crate::SimulatorBackend;

/// The name under which static √N checkpointing runs beside the heuristics.
pub const STATIC_CHECKPOINTING: &str = "static-sqrt";

/// What decides evictions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Policy {
    /// An eviction heuristic of [`crate::policy::heuristic_names`], under the budget.
    Heuristic(String),
    /// Static √N checkpointing (Chen et al. 2016): a plan made before the
    /// run, which needs no budget; the peak it reaches is its result.
    StaticSqrt,
}

impl Policy {
    /// The heuristic's name, or [`STATIC_CHECKPOINTING`].
    pub fn name(&self) -> &str {
        match self {
            Policy::Heuristic(name) => name,
            Policy::StaticSqrt => STATIC_CHECKPOINTING,
        }
    }

    /// Whether the run is decided by a budget (else by a static plan).
    pub fn takes_budget(&self) -> bool {
        matches!(self, Policy::Heuristic(_))
    }

    /// Whether its replays guard against rematerialisation cascades
    /// unless told otherwise (see [`GUARDED_BY_DEFAULT`]).
    pub fn guarded_by_default(&self) -> bool {
        GUARDED_BY_DEFAULT.contains(&self.name())
    }
}

impl From<String> for Policy {
    fn from(name: String) -> Policy {
        if name == STATIC_CHECKPOINTING {
            Policy::StaticSqrt
        } else {
            Policy::Heuristic(name)
        }
    }
}

impl From<&str> for Policy {
    fn from(name: &str) -> Policy {
        Policy::from(name.to_string())
    }
}

impl From<Policy> for String {
    fn from(policy: Policy) -> String {
        policy.name().to_string()
    }
}

/// A trace ready to run: loaded once, its unbounded baseline computed once.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The program to replay.
    pub trace: Trace,
    /// The format it was read in (simulator logs follow their authors' conventions).
    pub format: TraceFormat,
    /// The trace without DTR: its peak and compute, what budgets and overheads are relative to.
    pub baseline: Baseline,
}

impl Workload {
    /// A loaded trace, with its baseline computed now.
    pub fn new(trace: Trace, format: TraceFormat) -> Workload {
        let baseline = baseline(&trace);
        Workload {
            trace,
            format,
            baseline,
        }
    }

    /// Reads a trace (format detected when `None`).
    pub fn load(path: &Path, format: Option<TraceFormat>) -> Result<Workload> {
        let (trace, format) = trace::load(path, format)?;
        Ok(Workload::new(trace, format))
    }
}

/// How to run one replay.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// A heuristic under the budget, or static checkpointing.
    pub policy: Policy,
    /// A ratio is of the unbounded run's peak. Ignored by static plans.
    pub budget: Budget,
    /// Counter or arena memory.
    pub memory: MemoryModel,
    /// How the heuristic samples eviction candidates.
    pub sampling: Sampling,
    /// Seeds the heuristic's and the sampling's randomness.
    pub seed: u64,
    /// Stop as thrashing once total compute would pass this multiple of
    /// the unbounded run's (at least 1; infinite for never).
    pub thrash_limit: f64,
    /// How evicted storages come back.
    pub restore: RestoreMode,
    /// The copy queue, for restore modes that swap.
    pub swap: SwapConfig,
    /// See [`Config::move_bandwidth`] (for `arena-compact` memory).
    pub move_bandwidth: f64,
    /// See [`Config::keep_needed_history`]: keep released history that an
    /// evicted live tensor needs resident instead of evicting it at once.
    /// `None`: on for the heuristics in [`GUARDED_BY_DEFAULT`].
    pub keep_needed_history: Option<bool>,
    /// See [`Config::remat_memory_guard`]: evict last what could not be
    /// rematerialised within the budget. `None`: on for the heuristics in
    /// [`GUARDED_BY_DEFAULT`].
    pub remat_memory_guard: Option<bool>,
    /// See [`Config::pin_resident_first`]: pin a run of pins resident
    /// tensors first. `None`: on for the heuristics in [`GUARDED_BY_DEFAULT`].
    pub pin_resident_first: Option<bool>,
}

impl Default for RunSpec {
    /// The replays' default heuristic unbounded, in counter memory, with the CLI's thrash limit of 2.
    fn default() -> RunSpec {
        RunSpec {
            policy: Policy::Heuristic(crate::policy::REPLAY_HEURISTIC.into()),
            budget: Budget::Unbounded,
            memory: MemoryModel::Counter,
            sampling: Sampling::All,
            seed: 0,
            thrash_limit: 2.0,
            restore: RestoreMode::Drop,
            swap: SwapConfig::default(),
            move_bandwidth: crate::config::MOVE_BANDWIDTH,
            keep_needed_history: None,
            remat_memory_guard: None,
            pin_resident_first: None,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The budget in bytes (`None`: unbounded, or a static plan).
    pub budget_bytes: Option<u64>,
    /// The budget over the unbounded peak; for a static plan, its peak over it.
    pub ratio: f64,
    /// Total compute and swap stalls over the unbounded run's compute.
    pub overhead: f64,
    /// The replay's status, counters and peak.
    pub report: ReplayReport,
    /// The arena at the end, in arena memory.
    pub arena: Option<ArenaReport>,
    /// The most bytes host copies held at once (swap).
    pub host_peak_bytes: u64,
}

impl RunSpec {
    /// Whether the run keeps released history that an evicted live tensor needs.
    pub fn keeps_needed_history(&self) -> bool {
        self.keep_needed_history
            .unwrap_or_else(|| self.policy.guarded_by_default())
    }

    /// Whether the run evicts last what could not be rematerialised within the budget.
    pub fn guards_remat_memory(&self) -> bool {
        self.remat_memory_guard
            .unwrap_or_else(|| self.policy.guarded_by_default())
    }

    /// Whether a run of pins pins resident tensors first.
    pub fn pins_resident_first(&self) -> bool {
        self.pin_resident_first
            .unwrap_or_else(|| self.policy.guarded_by_default())
    }

    /// Checks every option, so that a bad one is reported before any run.
    pub fn validate(&self) -> Result<()> {
        if let Policy::Heuristic(name) = &self.policy {
            heuristic_by_name(name, self.seed)?;
            if let Budget::Ratio(_) = self.budget {
                self.budget.resolve(|| Ok(0))?;
            }
        }
        if self.restore != RestoreMode::Drop {
            self.swap.validate()?;
        }
        Config::validate_move_bandwidth(self.move_bandwidth)?;
        if self.thrash_limit.is_nan() || self.thrash_limit < 1.0 {
            return Err(Error::InvalidArgument(format!(
                "the thrash limit (--thrash-limit) must be at least 1, got {}",
                self.thrash_limit
            )));
        }
        Ok(())
    }

    /// Runs the workload, calling `after_event(index, interpreter)` after
    /// each trace event of a heuristic's run (for timelines), with the
    /// interpreter's log of evictions and rematerialisations kept when
    /// `record_events` (see [`Interpreter::events`]; it changes no decision).
    pub fn run_recording(
        &self,
        workload: &Workload,
        record_events: bool,
        after_event: impl FnMut(usize, &Interpreter<SimulatorBackend>),
    ) -> Result<Outcome> {
        let (outcome, _) = self.run_with(workload, record_events, |_| Ok(()), after_event)?;
        Ok(outcome)
    }

    /// [`RunSpec::run_recording`] that lets `prepare` set up the interpreter
    /// before the first event (to record a plan, say) and hands it back.
    pub fn run_with(
        &self,
        workload: &Workload,
        record_events: bool,
        prepare: impl FnOnce(&mut Interpreter<SimulatorBackend>) -> Result<()>,
        mut after_event: impl FnMut(usize, &Interpreter<SimulatorBackend>),
    ) -> Result<(Outcome, Interpreter<SimulatorBackend>)> {
        self.validate()?;
        let base = &workload.baseline;
        let config = Config::default()
            // The authors' logs follow their simulator's conventions.
            .with_simulator_conventions(workload.format == TraceFormat::Simrd)
            .with_memory(self.memory)
            .with_sampling(self.sampling)
            .with_seed(self.seed)
            .with_restore(self.restore)
            .with_swap(self.swap)
            .with_move_bandwidth(self.move_bandwidth)
            .with_kept_needed_history(self.keeps_needed_history())
            .with_remat_memory_guard(self.guards_remat_memory())
            .with_resident_pinned_first(self.pins_resident_first())
            .with_events(record_events);
        let (budget_bytes, interpreter, report) = match &self.policy {
            Policy::StaticSqrt => {
                let plan = CheckpointPlan::new(&workload.trace)?;
                let mut interpreter =
                    Interpreter::new(SimulatorBackend::new(), config.with_events(true))?;
                prepare(&mut interpreter)?;
                let report = plan.run(&workload.trace, &mut interpreter, Kernels::Recorded)?;
                (None, interpreter, report)
            }
            Policy::Heuristic(name) => {
                let budget_bytes = self.budget.resolve(|| Ok(base.peak_bytes))?;
                let mut config = config
                    .with_budget(budget_bytes.into())
                    .with_heuristic(name.clone());
                if self.thrash_limit.is_finite() {
                    let extra = (self.thrash_limit - 1.0) * base.compute as f64;
                    config = config.with_remat_limit(extra.floor() as u64);
                }
                let mut interpreter = Interpreter::new(SimulatorBackend::new(), config)?;
                prepare(&mut interpreter)?;
                let report = replay_observed(
                    &workload.trace,
                    &mut interpreter,
                    Kernels::Recorded,
                    |index, dtr, _| {
                        after_event(index, dtr);
                        Ok(())
                    },
                )?;
                (budget_bytes, interpreter, report)
            }
        };
        let of_peak = |bytes: u64| bytes as f64 / base.peak_bytes.max(1) as f64;
        let ratio = match (&self.policy, self.budget) {
            (Policy::StaticSqrt, _) => of_peak(report.peak_bytes),
            // The ratio asked for, not the floored bytes', so rows say what was run.
            (_, Budget::Ratio(ratio)) => ratio,
            _ => budget_bytes.map_or(f64::INFINITY, of_peak),
        };
        let outcome = Outcome {
            budget_bytes,
            ratio,
            overhead: report.stats.elapsed() as f64 / base.compute.max(1) as f64,
            arena: interpreter.memory().arena,
            host_peak_bytes: interpreter.memory().host_peak_bytes,
            report,
        };
        Ok((outcome, interpreter))
    }

    /// Runs the workload.
    pub fn run(&self, workload: &Workload) -> Result<Outcome> {
        self.run_recording(workload, false, |_, _| {})
    }
}
