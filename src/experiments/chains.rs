//! The DTR paper's Theorem 3.1 as an experiment: on a uniform chain of N
//! layers (forward and backward, unit sizes and costs) under a budget of
//! ⌈2√N⌉ activations, DTR's overhead stays O(1) as N grows. Beside each
//! heuristic: the Revolve optimum for the same memory, and static √N
//! checkpointing (which needs no budget; its peak is reported).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::generate::{generate, Workload, UNIT};
use super::run::{self, Policy, RunSpec};
use super::{parallel_map, revolve, STATIC_CHECKPOINTING};
use crate::config::Budget;
use crate::error::{Error, Result};
use crate::trace::replay::ReplayStatus;
use crate::trace::TraceFormat;

/// The Revolve optimum's name in the results.
pub const REVOLVE: &str = "revolve";

/// Activations a chain of `length` layers may keep: ⌈2√N⌉.
pub fn budget_units(length: usize) -> u64 {
    (2.0 * (length as f64).sqrt()).ceil() as u64
}

/// One point of the experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainRow {
    /// Layers in the chain (N).
    pub length: usize,
    /// Budget in activations (⌈2√N⌉).
    pub budget_units: u64,
    /// A heuristic, `revolve` or `static-sqrt`.
    pub policy: String,
    /// Whether the run completed (Revolve: whether the budget holds its checkpoints).
    pub status: ReplayStatus,
    /// Compute over the unbounded run's (2N + 1 unit ops).
    pub overhead: f64,
    /// Peak memory in activations.
    pub peak_units: f64,
    /// Ops rerun (Revolve: the extra forward steps).
    pub rematerializations: u64,
    /// Wall-clock time of the replay, in seconds (0 for Revolve, which is computed).
    pub wall_seconds: f64,
}

/// Runs every heuristic, Revolve and static checkpointing on chains of
/// each length, on `jobs` threads; rows in (length, policy) order.
pub fn run(
    lengths: &[usize],
    heuristics: &[String],
    jobs: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<ChainRow>> {
    for name in heuristics {
        RunSpec {
            policy: Policy::from(name.as_str()),
            ..RunSpec::default()
        }
        .validate()?;
    }
    let policies: Vec<&str> = heuristics
        .iter()
        .map(String::as_str)
        .chain([REVOLVE, STATIC_CHECKPOINTING])
        .collect();
    let cells: Vec<(usize, &str)> = lengths
        .iter()
        .flat_map(|&length| policies.iter().map(move |&policy| (length, policy)))
        .collect();
    parallel_map(&cells, jobs, progress, |&(length, policy)| {
        run_one(length, policy)
    })
    .into_iter()
    .collect()
}

fn run_one(length: usize, policy: &str) -> Result<ChainRow> {
    let units = budget_units(length);
    let baseline_compute = 2 * length as u64 + 1;
    let row =
        |status: ReplayStatus, compute: u64, peak_bytes: u64, remats: u64, wall: f64| ChainRow {
            length,
            budget_units: units,
            policy: policy.to_string(),
            status,
            overhead: compute as f64 / baseline_compute as f64,
            peak_units: peak_bytes as f64 / UNIT as f64,
            rematerializations: remats,
            wall_seconds: wall,
        };
    if policy == REVOLVE {
        // Of the budget, two activations are the backward pass's gradients
        // (in and out); the rest are Revolve's checkpoint slots.
        let extra = revolve::extra_steps(length as u64, units.saturating_sub(2));
        return Ok(match extra {
            Some(extra) => row(
                ReplayStatus::Ok,
                baseline_compute + extra,
                units * UNIT,
                extra,
                0.0,
            ),
            None => row(
                ReplayStatus::OutOfMemory,
                baseline_compute,
                units * UNIT,
                0,
                0.0,
            ),
        });
    }
    let trace = generate(Workload::Chain { length }, &format!("chain-{length}"))?;
    let spec = RunSpec {
        policy: Policy::from(policy),
        budget: Budget::Bytes(units * UNIT),
        // 10× the unbounded compute recomputed at most.
        thrash_limit: 11.0,
        ..RunSpec::default()
    };
    let report = spec
        .run(&run::Workload::new(trace, TraceFormat::Native))?
        .report;
    Ok(row(
        report.status,
        report.stats.compute,
        report.peak_bytes,
        report.stats.rematerializations,
        report.wall_seconds,
    ))
}

/// The rows as CSV, header first.
pub fn to_csv(rows: &[ChainRow]) -> String {
    let mut out = String::from(
        "length,budget_units,policy,status,overhead,peak_units,rematerializations,wall_seconds\n",
    );
    for r in rows {
        out += &format!(
            "{},{},{},{},{},{},{},{}\n",
            r.length,
            r.budget_units,
            r.policy,
            r.status,
            r.overhead,
            r.peak_units,
            r.rematerializations,
            r.wall_seconds
        );
    }
    out
}

/// The rows as a markdown table.
pub fn table(rows: &[ChainRow]) -> String {
    let mut out = String::from(
        "| N | budget (activations) | policy | status | overhead | peak (activations) |\n\
         |---:|---:|---|---|---:|---:|\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {} | {} | {:.3} | {:.0} |\n",
            r.length, r.budget_units, r.policy, r.status, r.overhead, r.peak_units
        );
    }
    out
}

/// Writes `chains.csv` and, with the `plot` feature, `chains.svg` into
/// `dir` (created if needed).
pub fn write_results(dir: &Path, rows: &[ChainRow]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
    super::write_atomic(&dir.join("chains.csv"), to_csv(rows).as_bytes())?;
    #[cfg(feature = "plot")]
    super::plot::chains_chart(rows, &dir.join("chains.svg"))?;
    Ok(())
}
