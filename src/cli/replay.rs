//! `dtr replay`: one trace under one budget and policy, on the simulator.

use std::path::PathBuf;
use std::process::ExitCode;

use dtr::experiments::timeline::Timeline;
use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;
use dtr::Budget;
use serde_json::json;

use super::restore::RestoreArgs;
use super::{parse_bytes, trace_format, FormatArg};

/// The arguments of `dtr replay`.
#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    format: FormatArg,
    /// Budget as a fraction of the unbounded run's peak (floored to bytes).
    #[arg(long, conflicts_with = "budget")]
    ratio: Option<f64>,
    /// Budget in bytes; accepts KiB, MiB, GiB, KB, MB, GB suffixes.
    #[arg(long, value_parser = parse_bytes)]
    budget: Option<u64>,
    /// An eviction heuristic (see `dtr heuristics`), or `static-sqrt`
    /// for static √N checkpointing, which takes no budget.
    #[arg(long, default_value = dtr::policy::DEFAULT_HEURISTIC)]
    heuristic: String,
    /// `counter`, `arena` (256-byte aligned) or `arena:ALIGNMENT`.
    #[arg(long, default_value = "counter")]
    memory: MemoryModel,
    #[arg(long, value_enum, default_value = "all")]
    sampling: Sampling,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop once total compute would pass this multiple of the unbounded run's.
    #[arg(long, default_value_t = 2.0)]
    thrash_limit: f64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
    /// Draw memory in use over the trace's clock, with the budget,
    /// evictions, rematerialisations and (arena) fragmentation: a path
    /// ending in `.svg` gets a chart, one ending in `.csv` the samples.
    #[arg(long)]
    timeline: Option<PathBuf>,
    #[command(flatten)]
    restore: RestoreArgs,
    /// Follow a plan made by `dtr plan` instead of a heuristic: no policy,
    /// every allocation at its planned offset, checked.
    #[arg(long, conflicts_with_all = ["ratio", "budget", "timeline"])]
    plan: Option<PathBuf>,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    let Args {
        trace,
        format,
        ratio,
        budget,
        heuristic,
        memory,
        sampling,
        seed,
        thrash_limit,
        json,
        timeline,
        restore,
        plan,
    } = args;
    if let Some(plan) = plan {
        return super::plan::follow(&trace, format, &plan, json);
    }
    let spec = RunSpec {
        policy: Policy::from(heuristic.as_str()),
        budget: match (ratio, budget) {
            (Some(ratio), _) => Budget::Ratio(ratio),
            (None, Some(bytes)) => Budget::Bytes(bytes),
            (None, None) => Budget::Unbounded,
        },
        memory,
        sampling,
        seed,
        thrash_limit,
        restore: restore.restore,
        swap: restore.swap(),
    };
    spec.validate()?;
    if spec.policy.takes_budget() && spec.budget == Budget::Unbounded {
        return Err(dtr::Error::InvalidArgument(
            "give --ratio or --budget".into(),
        ));
    }
    if let Some(path) = &timeline {
        if !spec.policy.takes_budget() {
            return Err(dtr::Error::InvalidArgument(format!(
                "--timeline follows a heuristic's run; `{heuristic}` is a static plan"
            )));
        }
        timeline_is_csv(path, &trace)?;
    }
    let workload = Workload::load(&trace, trace_format(format))?;
    let mut samples = timeline.as_ref().map(|_| Timeline::new());
    let outcome = spec.run_observed(&workload, |index, dtr| {
        if let Some(samples) = samples.as_mut() {
            samples.observe(index, dtr);
        }
    })?;
    let (base, report, arena) = (&workload.baseline, &outcome.report, outcome.arena);
    let (budget, overhead) = (outcome.budget_bytes, outcome.overhead);
    if json {
        let object = json!({
            "trace": trace.display().to_string(),
            "status": report.status.as_str(),
            "heuristic": heuristic,
            "memory": spec.memory,
            "sampling": spec.sampling,
            "seed": seed,
            "budget_bytes": budget,
            "baseline_peak_bytes": base.peak_bytes,
            "baseline_compute": base.compute,
            "compute": report.stats.compute,
            "overhead": overhead,
            "remat_compute": report.stats.remat_compute,
            "peak_bytes": report.peak_bytes,
            "evictions": report.stats.evictions,
            "rematerializations": report.stats.rematerializations,
            "restore": spec.restore,
            "swap_outs": report.stats.swap_outs,
            "swap_ins": report.stats.swap_ins,
            "host_copies": report.stats.host_copies,
            "swap_stall": report.stats.swap_stall,
            "host_peak_bytes": outcome.host_peak_bytes,
            "wall_seconds": report.wall_seconds,
            "message": report.message,
            "fragmentation": arena.map(|a| a.fragmentation),
            "largest_free_bytes": arena.map(|a| a.largest_free_bytes),
            "free_blocks": arena.map(|a| a.free_blocks),
        });
        println!("{object}");
    } else {
        println!(
            "{}: {} with `{heuristic}`",
            trace.display(),
            report.status.as_str()
        );
        match budget {
            Some(budget) => println!(
                "  budget          {budget} B ({:.3} of the {} B baseline peak)",
                budget as f64 / base.peak_bytes.max(1) as f64,
                base.peak_bytes
            ),
            None => println!(
                "  budget          none (a static plan; {:.3} of the {} B baseline peak)",
                outcome.ratio, base.peak_bytes
            ),
        }
        println!("  peak            {} B", report.peak_bytes);
        println!(
            "  overhead        {overhead:.4} ({} of {} compute units recomputed)",
            report.stats.remat_compute, base.compute
        );
        println!("  evictions       {}", report.stats.evictions);
        println!("  remats          {}", report.stats.rematerializations);
        if spec.restore != dtr::RestoreMode::Drop {
            let stats = &report.stats;
            println!(
                "  swap            {} evictions to host, {} restored from host, {} stalled for the copy queue, host copies peaked at {} B",
                stats.swap_outs, stats.swap_ins, stats.swap_stall, outcome.host_peak_bytes
            );
        }
        println!("  wall time       {:.3} s", report.wall_seconds);
        if let Some(arena) = arena {
            println!(
                "  arena at end    {:.3} fragmentation, largest free block {} B of {} free blocks",
                arena.fragmentation, arena.largest_free_bytes, arena.free_blocks
            );
        }
        if let Some(message) = &report.message {
            println!("  stopped         {message}");
        }
    }
    // After the result is printed: a failed write loses only itself.
    if let (Some(path), Some(samples), Some(budget)) = (&timeline, &samples, budget) {
        write_timeline(path, samples, &trace, &heuristic, budget, base.peak_bytes)?;
    }
    // The process ends once the result is out: its memory goes back to the
    // system whole, faster than the trace's tables are freed one by one.
    std::mem::forget(workload);
    Ok(ExitCode::SUCCESS)
}

/// Whether a timeline at `path` is CSV (else SVG); checked before the
/// replay: another extension, or the input trace itself, is refused.
fn timeline_is_csv(path: &std::path::Path, trace: &std::path::Path) -> dtr::Result<bool> {
    let same = |a: &std::path::Path, b: &std::path::Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if same(path, trace) {
        return Err(dtr::Error::file(
            path,
            "--timeline names the input trace; it would be overwritten",
        ));
    }
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("csv") => Ok(true),
        Some("svg") => Ok(false),
        _ => Err(dtr::Error::file(
            path,
            "--timeline must end in .svg (a chart) or .csv (the samples)",
        )),
    }
}

/// Writes a replay's timeline: CSV samples or an SVG chart.
fn write_timeline(
    path: &std::path::Path,
    timeline: &Timeline,
    trace: &std::path::Path,
    heuristic: &str,
    budget: u64,
    baseline_peak: u64,
) -> dtr::Result<()> {
    if timeline_is_csv(path, trace)? {
        std::fs::write(path, timeline.to_csv()).map_err(|e| dtr::Error::file(path, e))
    } else {
        let title = format!(
            "{}: `{heuristic}` at {:.2} of the unbounded peak",
            dtr::experiments::plot::short_name(&trace.display().to_string()),
            budget as f64 / baseline_peak.max(1) as f64
        );
        dtr::experiments::plot::timeline_chart(timeline, &title, path)
    }
}
