//! `dtr replay`: one trace under one budget and policy, on the simulator.

use std::path::PathBuf;
use std::process::ExitCode;

use dtr::experiments::timeline::{ChromeTrace, Timeline};
use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;
use dtr::{Budget, Interpreter, SimulatorBackend};
use serde_json::json;

use super::guards::GuardArgs;
use super::restore::{SwapArgs, RESTORE_HELP};
use super::{check_output, human, parse_bytes, trace_format, FormatArg};
use dtr::RestoreMode;

/// The arguments of `dtr replay`.
#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    format: FormatArg,
    /// Budget as a fraction of the unbounded run's peak (floored to bytes).
    #[arg(long, conflicts_with = "budget", allow_negative_numbers = true)]
    ratio: Option<f64>,
    /// Budget in bytes; accepts KiB, MiB, GiB, KB, MB, GB suffixes.
    #[arg(long, value_parser = parse_bytes, allow_negative_numbers = true)]
    budget: Option<u64>,
    /// An eviction heuristic (see `dtr heuristics`), or `static-sqrt`
    /// for static √N checkpointing, which takes no budget. By default
    /// `dtr-next`, h_DTR looking ahead, since a replay knows the program's
    /// future; `dtr` is what DTR does at run time, with no foresight.
    #[arg(long, default_value = dtr::policy::REPLAY_HEURISTIC)]
    heuristic: String,
    /// `counter`, or an arena: `arena` (best fit), `arena-ff` (first fit), `arena-split` (best fit, small blocks apart at the top) or `arena-compact` (best fit, moving blocks where fragmentation hides room), each optionally `:ALIGNMENT` (default 256).
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
    /// ending in `.svg` gets a chart (and a PNG of it beside, same stem),
    /// one ending in `.csv` the samples.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// Write the run in the Chrome trace event format (a `.json` file
    /// that opens in https://ui.perfetto.dev and chrome://tracing): ops as
    /// slices on a clock of compute units, rematerialisations as slices of
    /// their own, memory as counters, evictions as instants with the
    /// victim's size.
    #[arg(long)]
    timeline_out: Option<PathBuf>,
    /// When the run stops (out of memory, thrashing), do not search for the
    /// smallest budget that would complete.
    #[arg(long)]
    no_suggest: bool,
    #[arg(long, value_enum, default_value = "drop", help = RESTORE_HELP)]
    restore: RestoreMode,
    #[command(flatten)]
    swap: SwapArgs,
    #[command(flatten)]
    guards: GuardArgs,
    /// Follow a plan made by `dtr plan` instead of a heuristic: no policy,
    /// every allocation at its planned offset, checked.
    /// The plan fixes the budget, the victims and the memory: the options
    /// that choose those are refused beside it, not ignored.
    #[arg(long, conflicts_with_all = [
        "ratio", "budget", "timeline", "timeline_out", "heuristic", "memory", "sampling",
        "seed", "thrash_limit", "restore",
    ])]
    plan: Option<PathBuf>,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    if let Some(plan) = &args.plan {
        return super::plan::follow(&args.trace, args.format, plan, args.json);
    }
    let spec = run_spec(&args)?;
    check_outputs(&args, &spec)?;
    let trace = &args.trace;
    let workload = Workload::load(trace, trace_format(args.format))?;
    let mut samples = args.timeline.as_ref().map(|_| Timeline::new());
    let mut chrome = args.timeline_out.as_ref().map(|_| ChromeTrace::new());
    let record_events = chrome.is_some();
    let observe = |index, dtr: &Interpreter<SimulatorBackend>| {
        if let Some(samples) = samples.as_mut() {
            samples.observe(index, dtr);
        }
        if let Some(chrome) = chrome.as_mut() {
            let events = &workload.trace;
            chrome.observe(index, &events.events[index], events.lines[index], dtr);
        }
    };
    // The interpreter is kept, to be forgotten with the workload below.
    let (outcome, interpreter) = spec.run_with(&workload, record_events, |_| Ok(()), observe)?;
    // For a run that stopped: the smallest budget that completes, by the
    // bisection of `dtr fit`.
    let suggestion = match report_stopped(&outcome) {
        true if spec.policy.takes_budget() && !args.no_suggest => Some(
            dtr::experiments::fit::smallest_ratio(&workload, &spec, 0.01)?,
        ),
        _ => None,
    };
    // And whether swapping would complete at this very budget: near a full
    // budget most of memory is parameters, optimiser state and gradients,
    // which only a copy to host memory can free.
    let by_swap = match report_stopped(&outcome) {
        true if suggestion.is_some() && spec.restore == RestoreMode::Drop => {
            let hybrid = RunSpec {
                restore: RestoreMode::Hybrid,
                ..spec.clone()
            };
            completes(&hybrid, &workload)?
        }
        _ => None,
    };
    // And, in an arena, whether moving blocks would: fragmentation can
    // hide room that the free bytes hold.
    let by_moving = match (report_stopped(&outcome), spec.memory) {
        (
            true,
            MemoryModel::Arena { alignment }
            | MemoryModel::FirstFitArena { alignment }
            | MemoryModel::SplitArena { alignment },
        ) if suggestion.is_some() => {
            let compacting = RunSpec {
                memory: MemoryModel::CompactingArena { alignment },
                ..spec.clone()
            };
            completes(&compacting, &workload)?
        }
        _ => None,
    };
    // And whether keeping small blocks apart would: they scatter over a
    // best-fit or first-fit arena and split the stretches large blocks need.
    let by_splitting = match (report_stopped(&outcome), spec.memory) {
        (true, MemoryModel::Arena { alignment } | MemoryModel::FirstFitArena { alignment })
            if suggestion.is_some() =>
        {
            let split = RunSpec {
                memory: MemoryModel::SplitArena { alignment },
                ..spec.clone()
            };
            completes(&split, &workload)?
        }
        _ => None,
    };
    let finished = Finished {
        args: &args,
        spec: &spec,
        workload: &workload,
        outcome: &outcome,
        suggestion: suggestion.as_ref(),
        by_swap: by_swap.as_ref(),
        by_moving: by_moving.as_ref(),
        by_splitting: by_splitting.as_ref(),
    };
    if args.json {
        println!("{}", finished.to_json());
    } else {
        finished.print();
    }
    // After the result is printed: a failed write loses only itself, and
    // one failed output does not keep the other from being written.
    let mut failed = None;
    let budget = outcome.budget_bytes;
    if let (Some(path), Some(samples), Some(budget)) = (&args.timeline, &samples, budget) {
        if let Err(error) = write_timeline(path, samples, &workload, trace, &args.heuristic, budget)
        {
            failed = Some(error);
        }
    }
    if let (Some(path), Some(chrome)) = (&args.timeline_out, &chrome) {
        let about = json!({
            "trace": trace.display().to_string(),
            "heuristic": args.heuristic,
            "memory": spec.memory,
            "budget_bytes": budget,
            "status": outcome.report.status.as_str(),
            "clock": "1 µs = 1 cost unit of the trace",
        });
        let written = dtr::experiments::write_atomic(path, chrome.to_json(about).as_bytes());
        if let Err(error) = written {
            failed.get_or_insert(error);
        }
    }
    if let Some(error) = failed {
        return Err(error);
    }
    // The process ends once the result is out: its memory goes back to the
    // system whole, faster than the trace's and the interpreter's tables
    // are freed one by one.
    std::mem::forget(workload);
    std::mem::forget(interpreter);
    Ok(ExitCode::SUCCESS)
}

/// The run the flags describe, validated.
fn run_spec(args: &Args) -> dtr::Result<RunSpec> {
    let spec = RunSpec {
        policy: Policy::from(args.heuristic.as_str()),
        budget: match (args.ratio, args.budget) {
            (Some(ratio), _) => Budget::Ratio(ratio),
            (None, Some(bytes)) => Budget::Bytes(bytes),
            (None, None) => Budget::Unbounded,
        },
        memory: args.memory,
        sampling: args.sampling,
        seed: args.seed,
        thrash_limit: args.thrash_limit,
        restore: args.restore,
        swap: args.swap.config(),
        move_bandwidth: args.swap.move_bandwidth(),
        keep_needed_history: args.guards.keep_needed_history,
        remat_memory_guard: args.guards.remat_guard,
        pin_resident_first: args.guards.pin_resident_first,
    };
    spec.validate()?;
    if spec.policy.takes_budget() && spec.budget == Budget::Unbounded {
        return Err(dtr::Error::InvalidArgument(
            "give --ratio or --budget".into(),
        ));
    }
    Ok(spec)
}

/// Refuses side outputs that could not be written, before the run.
fn check_outputs(args: &Args, spec: &RunSpec) -> dtr::Result<()> {
    let (timeline, timeline_out) = (&args.timeline, &args.timeline_out);
    for (flag, path) in [("--timeline", timeline), ("--timeline-out", timeline_out)] {
        if path.is_some() && !spec.policy.takes_budget() {
            return Err(dtr::Error::InvalidArgument(format!(
                "{flag} follows a heuristic's run; `{}` is a static plan",
                args.heuristic
            )));
        }
    }
    if let Some(path) = timeline {
        timeline_is_csv(path, &args.trace)?;
    }
    if let Some(path) = timeline_out {
        check_output("--timeline-out", path, &[&args.trace], &["json"])?;
        if timeline.as_ref().is_some_and(|t| super::same_file(t, path)) {
            return Err(dtr::Error::file(
                path,
                "--timeline and --timeline-out name the same file",
            ));
        }
    }
    Ok(())
}

/// A finished replay, to report.
struct Finished<'a> {
    args: &'a Args,
    spec: &'a RunSpec,
    workload: &'a Workload,
    outcome: &'a dtr::experiments::Outcome,
    suggestion: Option<&'a dtr::experiments::fit::Fit>,
    /// The same run under `--restore hybrid`, when that completes where
    /// this one stopped.
    by_swap: Option<&'a dtr::experiments::Outcome>,
    /// The same run in a compacting arena, when the run stopped in an arena
    /// and that completes.
    by_moving: Option<&'a dtr::experiments::Outcome>,
    /// The same run in a split arena, when the run stopped in a best-fit or
    /// first-fit arena and that completes.
    by_splitting: Option<&'a dtr::experiments::Outcome>,
}

impl Finished<'_> {
    fn to_json(&self) -> serde_json::Value {
        let (spec, outcome, suggestion) = (self.spec, self.outcome, self.suggestion);
        let (base, report, arena) = (&self.workload.baseline, &outcome.report, outcome.arena);
        let completed = report.status == dtr::trace::replay::ReplayStatus::Ok;
        json!({
            "trace": self.args.trace.display().to_string(),
            "status": report.status.as_str(),
            "heuristic": self.args.heuristic,
            "memory": spec.memory,
            "sampling": spec.sampling,
            "seed": spec.seed,
            "budget_bytes": outcome.budget_bytes,
            "baseline_peak_bytes": base.peak_bytes,
            "baseline_compute": base.compute,
            "compute": report.stats.compute,
            // Only a completed run has an overhead; a stopped one says where it stopped.
            "overhead": completed.then_some(outcome.overhead),
            "overhead_at_stop": (!completed).then_some(outcome.overhead),
            "remat_compute": report.stats.remat_compute,
            "peak_bytes": report.peak_bytes,
            "evictions": report.stats.evictions,
            "rematerializations": report.stats.rematerializations,
            "lock_relaxations": report.stats.lock_relaxations,
            "outputs_reserved_first": report.stats.outputs_reserved_first,
            "restore": spec.restore,
            "swap_outs": report.stats.swap_outs,
            "swap_ins": report.stats.swap_ins,
            "prefetches": report.stats.prefetches,
            "host_copies": report.stats.host_copies,
            "swap_stall": report.stats.swap_stall,
            "host_peak_bytes": outcome.host_peak_bytes,
            "compactions": report.stats.compactions,
            "moved_bytes": report.stats.moved_bytes,
            "move_cost": report.stats.move_cost,
            "wall_seconds": report.wall_seconds,
            "message": report.message,
            "suggested_ratio": suggestion.and_then(|f| f.ratio),
            "suggested_budget_bytes": suggestion.and_then(|f| f.budget_bytes),
            "hybrid_overhead": self.by_swap.map(|o| o.overhead),
            "compacting_overhead": self.by_moving.map(|o| o.overhead),
            "split_overhead": self.by_splitting.map(|o| o.overhead),
            "fragmentation": arena.map(|a| a.fragmentation),
            "largest_free_bytes": arena.map(|a| a.largest_free_bytes),
            "free_blocks": arena.map(|a| a.free_blocks),
        })
    }

    fn print(&self) {
        let (spec, outcome) = (self.spec, self.outcome);
        let (base, report, arena) = (&self.workload.baseline, &outcome.report, outcome.arena);
        let heuristic = &self.args.heuristic;
        println!(
            "{}: {} with `{heuristic}`",
            self.args.trace.display(),
            report.status.as_str()
        );
        match outcome.budget_bytes {
            Some(budget) => println!(
                "  budget          {} ({:.3} of the {} baseline peak)",
                human(budget),
                budget as f64 / base.peak_bytes.max(1) as f64,
                human(base.peak_bytes)
            ),
            None => println!(
                "  budget          none (a static plan; {:.3} of the {} baseline peak)",
                outcome.ratio,
                human(base.peak_bytes)
            ),
        }
        println!("  peak            {}", human(report.peak_bytes));
        let overhead_name = if report_stopped(outcome) {
            "overhead so far"
        } else {
            "overhead"
        };
        println!(
            "  {overhead_name:<15} {:.4} ({} of {} compute units recomputed)",
            outcome.overhead, report.stats.remat_compute, base.compute
        );
        println!("  evictions       {}", report.stats.evictions);
        println!("  remats          {}", report.stats.rematerializations);
        if spec.restore != dtr::RestoreMode::Drop {
            let stats = &report.stats;
            println!(
                "  swap            {} evictions to host, {} restored from host on demand and {} ahead of need, {} stalled for the copy queue, host copies peaked at {} B",
                stats.swap_outs, stats.swap_ins, stats.prefetches, stats.swap_stall, outcome.host_peak_bytes
            );
        }
        if let dtr::memory::MemoryModel::CompactingArena { .. } = spec.memory {
            let stats = &report.stats;
            println!(
                "  moves           {} compactions moved {}, taking {} compute units",
                stats.compactions,
                human(stats.moved_bytes),
                stats.move_cost
            );
        }
        println!("  wall time       {:.3} s", report.wall_seconds);
        if let Some(arena) = arena {
            println!(
                "  arena at end    {:.3} fragmentation, largest free block {} of {} free blocks",
                arena.fragmentation,
                human(arena.largest_free_bytes),
                arena.free_blocks
            );
        }
        if let Some(message) = &report.message {
            println!("  stopped         {message}");
        }
        if let Some(fit) = self.suggestion {
            match (fit.ratio, fit.budget_bytes) {
                (Some(ratio), Some(bytes)) => println!(
                    "  to complete     give --budget {bytes} ({}) or --ratio {ratio:.3}: \
                     the smallest budget found to complete ({} replays, as `dtr fit` searches)",
                    human(bytes),
                    fit.probes
                ),
                _ => println!(
                    "  to complete     no budget up to the unbounded peak completes within \
                     --thrash-limit {}; raise the limit",
                    spec.thrash_limit
                ),
            }
        }
        if let Some(swapped) = self.by_swap {
            println!(
                "  or              --restore hybrid completes at this budget (overhead {:.4}, \
                 {} storages swapped to host memory at {} GB/s)",
                swapped.overhead,
                swapped.report.stats.swap_outs,
                spec.swap.bandwidth / 1e9
            );
        }
        if let Some(moved) = self.by_moving {
            let stats = &moved.report.stats;
            println!(
                "  or              --memory arena-compact completes at this budget (overhead {:.4}, \
                 {} compactions moving {})",
                moved.overhead,
                stats.compactions,
                human(stats.moved_bytes)
            );
        }
        if let Some(placed) = self.by_splitting {
            println!(
                "  or              --memory arena-split completes at this budget (overhead {:.4}, \
                 small blocks kept apart at the top of the arena)",
                placed.overhead
            );
        }
    }
}

/// `spec`'s run of `workload`, if it completes.
fn completes(
    spec: &RunSpec,
    workload: &Workload,
) -> dtr::Result<Option<dtr::experiments::Outcome>> {
    let outcome = spec.run(workload)?;
    Ok(Some(outcome).filter(|outcome| !report_stopped(outcome)))
}

/// Whether the run stopped before the trace's end.
fn report_stopped(outcome: &dtr::experiments::Outcome) -> bool {
    outcome.report.status != dtr::trace::replay::ReplayStatus::Ok
}

/// Whether a timeline at `path` is CSV (else SVG, with a PNG beside it);
/// checked before the replay: another extension, or the input trace itself
/// (as the SVG or its PNG), is refused.
fn timeline_is_csv(path: &std::path::Path, trace: &std::path::Path) -> dtr::Result<bool> {
    let csv = check_output("--timeline", path, &[trace], &["svg", "csv"])? == "csv";
    if !csv {
        // The chart's PNG goes beside the SVG: it may not be the input either.
        let png = dtr::experiments::plot::png_path(path);
        check_output("--timeline (its PNG)", &png, &[trace], &["png"])?;
    }
    Ok(csv)
}

/// Writes a replay's timeline: CSV samples or an SVG and PNG chart (with the
/// trace's phases and its peak's op).
fn write_timeline(
    path: &std::path::Path,
    timeline: &Timeline,
    workload: &Workload,
    trace: &std::path::Path,
    heuristic: &str,
    budget: u64,
) -> dtr::Result<()> {
    if timeline_is_csv(path, trace)? {
        dtr::experiments::write_atomic(path, timeline.to_csv().as_bytes())
    } else {
        let title = format!(
            "{}: `{heuristic}` at {:.2} of the unbounded peak",
            dtr::experiments::plot::short_name(&trace.display().to_string()),
            budget as f64 / workload.baseline.peak_bytes.max(1) as f64
        );
        let notes = dtr::experiments::plot::TimelineNotes {
            phases: dtr::experiments::timeline::phases(&workload.trace),
            peak: dtr::experiments::timeline::peak_note(&workload.trace, timeline),
        };
        dtr::experiments::plot::timeline_chart_noted(timeline, &title, &notes, path)
    }
}
