//! Static plans from a DTR run: run a trace once under a heuristic, keep the
//! schedule it executed (which storages each allocation evicted, and so
//! which recomputations followed) and give every allocation a fixed offset
//! from an offline packer, or keep the offsets (and the moves) of a run
//! that placed blocks as it went. Following the plan needs no policy, and
//! its arena cannot fragment.

use std::path::Path;

use serde::{Deserialize, Serialize};
use slotmap::{Key, KeyData};

use super::fit::Fit;
use super::run::{Outcome, RunSpec, Workload};
use crate::config::{Budget, RestoreMode};
use crate::error::{Error, Result};
use crate::graph::TensorId;
use crate::memory::packing::{self, Lifetime};
use crate::memory::MemoryModel;
use crate::trace::replay::ReplayStatus;
use crate::{BlockMove, Reservation};

/// One request for memory, as a plan file keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PlannedReservation {
    /// The tensors evicted to make room, by the recorded run's ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evict: Vec<u64>,
    /// The blocks then moved to open a hole (a compacting arena's run), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<PlannedMove>,
    /// Whether it then ran out of memory (an op that then got room by relaxing
    /// locks asks again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub out_of_memory: bool,
    /// Whether it reserved an op's outputs before the op's inputs were
    /// restored again (an arena's run, after fragmentation left the op no
    /// room).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outputs_first: bool,
}

/// A block moved, as a plan file keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    /// The storage in it, by the recorded run's id of its root tensor.
    pub tensor: u64,
    /// The allocation it is (an index into [`Plan::lifetimes`]).
    pub allocation: usize,
    /// The offset it moves to.
    pub to: u64,
}

/// Where a sweep's run places its memory: a memory model, placing blocks
/// as it goes (or counting bytes), or a static plan made at the budget and
/// followed. Written as the memory model is, or `plan` (256-byte blocks)
/// or `plan:ALIGNMENT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Placement {
    /// The run itself, in this memory model.
    Dynamic(MemoryModel),
    /// A plan ([`Plan::make`]) in an arena of `alignment`-byte blocks,
    /// followed ([`Plan::run`]).
    Plan {
        /// Block alignment in bytes (a power of two).
        alignment: u64,
    },
}

impl From<MemoryModel> for Placement {
    fn from(memory: MemoryModel) -> Placement {
        Placement::Dynamic(memory)
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Placement::Dynamic(memory) => memory.fmt(f),
            Placement::Plan { alignment: 256 } => f.write_str("plan"),
            Placement::Plan { alignment } => write!(f, "plan:{alignment}"),
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Placement, String> {
        let alignment = match text.split_once(':') {
            None if text == "plan" => Some(256),
            Some(("plan", alignment)) => Some(
                alignment
                    .parse::<u64>()
                    .ok()
                    .filter(|a| a.is_power_of_two())
                    .ok_or_else(|| format!("plan alignment `{alignment}` is not a power of two"))?,
            ),
            _ => None,
        };
        match alignment {
            Some(alignment) => Ok(Placement::Plan { alignment }),
            None => text
                .parse()
                .map(Placement::Dynamic)
                .map_err(|e: String| e.replace("or arena-compact,", "arena-compact or plan,")),
        }
    }
}

impl From<Placement> for String {
    fn from(placement: Placement) -> String {
        placement.to_string()
    }
}

impl TryFrom<String> for Placement {
    type Error = String;

    fn try_from(text: String) -> std::result::Result<Placement, String> {
        text.parse()
    }
}

/// The plan file's format version: 2 added moves (a version 1 plan is a
/// version 2 plan without them), 3 whether released history was kept (a
/// version 2 plan's run did not keep it).
const PLAN_VERSION: u32 = 3;

/// A schedule and its placement, as `dtr plan` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The file format's version (1).
    pub version: u32,
    /// The trace it was made from (a plan only fits the program it was made on).
    pub trace: String,
    /// The trace's number of events, checked when the plan is followed.
    pub trace_events: usize,
    /// The heuristic whose run it records.
    pub heuristic: String,
    /// Whether the run kept released history that an evicted live tensor
    /// needed ([`crate::Config::keep_needed_history`]): what a release
    /// evicts at once, which following the plan must repeat.
    #[serde(default)]
    pub keep_needed_history: bool,
    /// The budget the plan was asked for (the recorded run may have had
    /// less: see [`Plan::make`]).
    pub budget_bytes: u64,
    /// The most bytes the recorded run held at once.
    pub peak_bytes: u64,
    /// Its compute over the unbounded run's.
    pub overhead: f64,
    /// The arena the planned offsets need, in bytes.
    pub arena_bytes: u64,
    /// The offsets' and sizes' alignment, in bytes (a power of two).
    pub alignment: u64,
    /// Each request for memory of the run, in order: the tensors (by the
    /// run's ids) it evicted, the blocks it moved, and whether it then ran
    /// out of memory.
    pub reservations: Vec<PlannedReservation>,
    /// Every allocation's lifetime (sizes aligned), in the order they are made.
    pub lifetimes: Vec<Lifetime>,
    /// Every allocation's offset in the arena when made, in the same order
    /// (moves may take it elsewhere later).
    pub offsets: Vec<u64>,
}

impl Plan {
    /// A plan for `spec` (a heuristic under a budget, dropping) on
    /// `workload`, in an arena of `alignment`-byte blocks, that fits the
    /// budget if it can. Three candidates: the run counting bytes, its
    /// allocations packed (the packed arena needs more than the bytes the
    /// run held at once, so while it is over the budget the run is planned
    /// again under a budget smaller by that excess, and by at least 0.5%
    /// of the budget, a few times at most); and the runs placing blocks as
    /// they go in an arena of the budget, moving them (`arena-compact`) or
    /// not, whose own placement fits when they complete. Of those that fit,
    /// the one of least compute is kept; where none does, the smallest
    /// arena (see [`Plan::fits`]). Fails if no run completes.
    pub fn make(workload: &Workload, spec: &RunSpec, alignment: u64) -> Result<Plan> {
        let counted = RunSpec {
            memory: MemoryModel::Counter,
            ..spec.clone()
        };
        let first = Plan::record(workload, &counted, alignment);
        let packed = (first.as_ref().ok())
            .map(|plan| Plan::tightened(workload, &counted, alignment, plan.clone()));
        // The heuristic placing blocks as it goes, in an arena of the
        // budget: where that run completes, its own placement (and its
        // moves) is a plan that fits, even where counting bytes thrashed.
        let target = spec.budget.resolve(|| Ok(workload.baseline.peak_bytes))?;
        let placed = [
            MemoryModel::Arena { alignment },
            MemoryModel::CompactingArena { alignment },
        ]
        .into_iter()
        .filter_map(|memory| {
            let spec = RunSpec {
                budget: target.map_or(Budget::Unbounded, Budget::Bytes),
                memory,
                ..spec.clone()
            };
            Plan::record(workload, &spec, alignment).ok()
        });
        // Of the plans that fit, the least compute (a packed run may have
        // recomputed more under its tighter budget, a placed one evicted
        // for room or moved blocks); else the smallest arena.
        let best = packed.into_iter().chain(placed).min_by(|a, b| {
            (b.fits().cmp(&a.fits())).then_with(|| match a.fits() {
                true => a.overhead.total_cmp(&b.overhead),
                false => a.arena_bytes.cmp(&b.arena_bytes),
            })
        });
        best.ok_or_else(|| first.expect_err("a counted run that completed is a plan"))
    }

    /// The smallest arena of `plan` (a counted run's) and of runs under
    /// budgets smaller by its excess over the target, and by at least 0.5%
    /// of it (a slightly smaller budget often makes the same run and
    /// packing), a few times at most.
    fn tightened(workload: &Workload, counted: &RunSpec, alignment: u64, plan: Plan) -> Plan {
        const ATTEMPTS: usize = 8;
        let target = plan.budget_bytes;
        let mut budget = target;
        let mut best = plan;
        for _ in 1..ATTEMPTS {
            if best.arena_bytes <= target {
                break;
            }
            let scaled = (budget as f64 * target as f64 / best.arena_bytes as f64).floor() as u64;
            budget = scaled.min(budget.saturating_sub(target / 200));
            let tighter = RunSpec {
                budget: Budget::Bytes(budget),
                ..counted.clone()
            };
            let Ok(plan) = Plan::record(workload, &tighter, alignment) else {
                break; // too tight to complete
            };
            if plan.arena_bytes < best.arena_bytes {
                best = plan;
            }
        }
        Plan {
            budget_bytes: target,
            ..best
        }
    }

    /// Makes a plan for `spec` and follows it, as one run of a sweep: the
    /// followed run's outcome, at the budget asked for. A plan over the
    /// budget is out of memory (with the followed run's figures); where no
    /// run completes, the outcome of the run counting bytes.
    pub fn run(workload: &Workload, spec: &RunSpec, alignment: u64) -> Result<Outcome> {
        let Ok(plan) = Plan::make(workload, spec, alignment) else {
            let counted = RunSpec {
                memory: MemoryModel::Counter,
                ..spec.clone()
            };
            return counted.run(workload);
        };
        let mut outcome = plan.follow(workload)?;
        outcome.budget_bytes = Some(plan.budget_bytes);
        outcome.ratio = match spec.budget {
            Budget::Ratio(ratio) => ratio,
            _ => plan.budget_bytes as f64 / workload.baseline.peak_bytes.max(1) as f64,
        };
        if !plan.fits() {
            outcome.report.status = ReplayStatus::OutOfMemory;
            outcome.report.message = Some(format!(
                "the plan needs an arena of {} B, over the budget of {} B",
                plan.arena_bytes, plan.budget_bytes
            ));
        }
        Ok(outcome)
    }

    /// Evictions the plan makes (besides eager ones).
    pub fn evictions(&self) -> usize {
        self.reservations.iter().map(|r| r.evict.len()).sum()
    }

    /// Blocks the plan moves.
    pub fn moves(&self) -> usize {
        self.reservations.iter().map(|r| r.moves.len()).sum()
    }

    /// Where the allocations are over their lives: a lifetime and an
    /// offset for each stretch of an allocation between its moves (one per
    /// allocation where nothing moves). A move made for the `j`-th
    /// reservation that got room happens at step `2j + 1`, with the frees
    /// before it (see the storage table's allocation log).
    pub fn placements(&self) -> std::result::Result<(Vec<Lifetime>, Vec<u64>), String> {
        if self.offsets.len() != self.lifetimes.len() {
            return Err(format!(
                "{} offsets for {} allocations",
                self.offsets.len(),
                self.lifetimes.len()
            ));
        }
        // Each allocation's stretch under way: its start and offset.
        let mut current: Vec<(u64, u64)> = (self.lifetimes.iter().zip(&self.offsets))
            .map(|(l, &offset)| (l.start, offset))
            .collect();
        let (mut stretches, mut offsets) = (Vec::new(), Vec::new());
        let mut step = 1u64;
        for (k, reservation) in self.reservations.iter().enumerate() {
            if reservation.out_of_memory {
                if !reservation.moves.is_empty() {
                    return Err(format!(
                        "reservation {k} ran out of memory but moved blocks"
                    ));
                }
                continue;
            }
            for m in &reservation.moves {
                let Some(lifetime) = self.lifetimes.get(m.allocation) else {
                    return Err(format!(
                        "reservation {k} moves allocation {}, of {}",
                        m.allocation,
                        self.lifetimes.len()
                    ));
                };
                if !(lifetime.start < step && step < lifetime.end) {
                    return Err(format!(
                        "reservation {k} moves allocation {}, which is not alive then",
                        m.allocation
                    ));
                }
                let (start, offset) = current[m.allocation];
                if start < step {
                    stretches.push(Lifetime {
                        end: step,
                        start,
                        ..*lifetime
                    });
                    offsets.push(offset);
                }
                current[m.allocation] = (step, m.to);
            }
            step += 2;
        }
        for (lifetime, (start, offset)) in self.lifetimes.iter().zip(current) {
            stretches.push(Lifetime { start, ..*lifetime });
            offsets.push(offset);
        }
        Ok((stretches, offsets))
    }

    /// Checks that no two allocations alive at once overlap, moves
    /// included, and that all of them lie inside the planned arena.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !self.alignment.is_power_of_two() {
            return Err(format!(
                "its alignment must be a power of two, not {}",
                self.alignment
            ));
        }
        // The plan runs without its heuristic, but a name no dtr knows
        // would be reported as the run's.
        crate::policy::heuristic(&self.heuristic).map_err(|e| e.to_string())?;
        let (stretches, offsets) = self.placements()?;
        packing::check(&stretches, &offsets, self.arena_bytes)
    }

    /// Whether the planned arena fits the budget the plan was asked for.
    pub fn fits(&self) -> bool {
        self.arena_bytes <= self.budget_bytes
    }

    /// Runs `spec` recording its schedule, and packs its allocations.
    fn record(workload: &Workload, spec: &RunSpec, alignment: u64) -> Result<Plan> {
        if !spec.policy.takes_budget() || spec.budget == Budget::Unbounded {
            return Err(Error::InvalidArgument(
                "a plan records a heuristic's run under a budget".into(),
            ));
        }
        if spec.restore != RestoreMode::Drop {
            return Err(Error::InvalidArgument(
                "plans record runs that restore by `drop`".into(),
            ));
        }
        if !alignment.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "the alignment must be a power of two, got {alignment}"
            )));
        }
        let (outcome, dtr) = spec.run_with(workload, false, |dtr| dtr.record_plan(), |_, _| {})?;
        let report = &outcome.report;
        if report.status != ReplayStatus::Ok {
            return Err(Error::InvalidArgument(format!(
                "the run under `{}` did not complete ({}{}), so there is no plan to keep",
                spec.policy.name(),
                report.status,
                report
                    .message
                    .as_deref()
                    .map_or(String::new(), |m| format!(": {m}"))
            )));
        }
        let record = dtr.plan_record().expect("the run was recorded");
        let lifetimes: Vec<Lifetime> = record
            .lifetimes
            .into_iter()
            .map(|l| Lifetime {
                bytes: l.bytes.div_ceil(alignment) * alignment,
                ..l
            })
            .collect();
        // In arena memory with the plan's blocks, the run's own placement.
        let placed = matches!(
            spec.memory,
            MemoryModel::Arena { alignment: a } | MemoryModel::CompactingArena { alignment: a }
                if a == alignment
        );
        let (offsets, arena_bytes) = if placed {
            (record.offsets, 0)
        } else {
            packing::pack(&lifetimes, alignment)
        };
        let mut plan = Plan {
            version: PLAN_VERSION,
            trace: workload.trace.source.clone(),
            trace_events: workload.trace.events.len(),
            heuristic: spec.policy.name().to_string(),
            keep_needed_history: spec.keeps_needed_history(),
            budget_bytes: outcome.budget_bytes.unwrap_or(0),
            peak_bytes: report.peak_bytes,
            overhead: outcome.overhead,
            arena_bytes,
            alignment,
            reservations: (record.reservations.iter())
                .map(PlannedReservation::from)
                .collect(),
            lifetimes,
            offsets,
        };
        let (stretches, offsets) = plan.placements().map_err(Error::InvalidArgument)?;
        if placed {
            plan.arena_bytes = (stretches.iter().zip(&offsets))
                .map(|(l, offset)| offset + l.bytes)
                .max()
                .unwrap_or(0);
        }
        packing::check(&stretches, &offsets, plan.arena_bytes).map_err(Error::InvalidArgument)?;
        Ok(plan)
    }

    /// Runs `workload` by the plan, with no policy, in an arena of exactly
    /// the planned size with every allocation at its planned offset. Fails
    /// if the program departs from the plan.
    pub fn follow(&self, workload: &Workload) -> Result<Outcome> {
        if workload.trace.events.len() != self.trace_events {
            return Err(Error::InvalidArgument(format!(
                "the plan was made on a trace of {} events ({}), this one has {}",
                self.trace_events,
                self.trace,
                workload.trace.events.len()
            )));
        }
        let spec = RunSpec {
            budget: Budget::Bytes(self.arena_bytes),
            memory: MemoryModel::Arena {
                alignment: self.alignment,
            },
            thrash_limit: f64::INFINITY,
            keep_needed_history: Some(self.keep_needed_history),
            ..RunSpec::default()
        };
        let reservations: Vec<Reservation> =
            self.reservations.iter().map(Reservation::from).collect();
        let offsets = self.offsets.clone();
        let (outcome, dtr) = spec.run_with(
            workload,
            false,
            |dtr| dtr.follow_plan(reservations, Some(offsets)),
            |_, _| {},
        )?;
        let report = &outcome.report;
        if report.status != ReplayStatus::Ok {
            return Err(Error::InvalidArgument(format!(
                "the plan did not hold: {}",
                report.message.as_deref().unwrap_or("the run stopped")
            )));
        }
        if !dtr.plan_finished() {
            return Err(Error::InvalidArgument(
                "the program ended before the plan did".into(),
            ));
        }
        Ok(outcome)
    }

    /// The smallest ratio of the unbounded peak at which `spec` gives a
    /// plan within its budget (by bisection, as [`super::fit`]).
    pub fn smallest_ratio(
        workload: &Workload,
        spec: &RunSpec,
        alignment: u64,
        precision: f64,
    ) -> Result<Fit> {
        super::fit::bisect(precision, |ratio| {
            let spec = RunSpec {
                budget: Budget::Ratio(ratio),
                ..spec.clone()
            };
            Ok(Plan::make(workload, &spec, alignment)
                .ok()
                .filter(Plan::fits)
                .map(|plan| (Some(plan.budget_bytes), plan.overhead)))
        })
    }

    /// Reads a plan that [`Plan::write`] wrote; a plan of another version is an error.
    pub fn read(path: &Path) -> Result<Plan> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, e))?;
        let plan: Plan = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: not a plan: {e}", path.display())))?;
        if !(1..=PLAN_VERSION).contains(&plan.version) {
            return Err(Error::InvalidArgument(format!(
                "{}: plan version {} (this dtr reads versions 1 to {PLAN_VERSION})",
                path.display(),
                plan.version
            )));
        }
        plan.check().map_err(|e| {
            Error::InvalidArgument(format!("{}: not a valid plan: {e}", path.display()))
        })?;
        Ok(plan)
    }

    /// Writes the plan as JSON, whole or not at all.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text =
            serde_json::to_string(self).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        super::write_atomic(path, (text + "\n").as_bytes())
    }
}

/// A recorded reservation as a plan file keeps it: tensors by the run's
/// slot-map keys.
impl From<&Reservation> for PlannedReservation {
    fn from(reservation: &Reservation) -> PlannedReservation {
        let id = |tensor: TensorId| tensor.data().as_ffi();
        PlannedReservation {
            evict: reservation.victims.iter().map(|&t| id(t)).collect(),
            moves: (reservation.moves.iter())
                .map(|m| PlannedMove {
                    tensor: id(m.tensor),
                    allocation: m.allocation,
                    to: m.to,
                })
                .collect(),
            out_of_memory: reservation.out_of_memory,
            outputs_first: reservation.outputs_first,
        }
    }
}

/// A plan file's reservation as the interpreter follows it.
impl From<&PlannedReservation> for Reservation {
    fn from(planned: &PlannedReservation) -> Reservation {
        let tensor = |id: u64| TensorId::from(KeyData::from_ffi(id));
        Reservation {
            victims: planned.evict.iter().map(|&id| tensor(id)).collect(),
            moves: (planned.moves.iter())
                .map(|m| BlockMove {
                    tensor: tensor(m.tensor),
                    allocation: m.allocation,
                    to: m.to,
                })
                .collect(),
            out_of_memory: planned.out_of_memory,
            outputs_first: planned.outputs_first,
        }
    }
}
