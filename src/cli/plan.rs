//! `dtr plan` (a static plan from one DTR run) and `dtr replay --plan`
//! (following one).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dtr::experiments::plan::Plan;
use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::Budget;
use serde_json::json;

use super::{check_output, human, parse_bytes, trace_format, FormatArg};

/// The arguments of `dtr plan`.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  dtr plan traces/transformer-small.jsonl --ratio 0.8 --out plan.json\n  \
                        dtr replay traces/transformer-small.jsonl --plan plan.json"
)]
pub struct Args {
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    format: FormatArg,
    /// Budget as a fraction of the unbounded run's peak (floored to bytes).
    #[arg(long, conflicts_with = "budget", required_unless_present = "budget")]
    ratio: Option<f64>,
    /// Budget in bytes; accepts KiB, MiB, GiB, KB, MB, GB suffixes.
    #[arg(long, value_parser = parse_bytes)]
    budget: Option<u64>,
    /// The heuristic whose run the plan records (see `dtr heuristics`). By
    /// default `dtr-next`, h_DTR looking ahead: a plan is made from the
    /// recorded program, so it knows when each tensor is read next.
    #[arg(long, default_value = dtr::policy::REPLAY_HEURISTIC)]
    heuristic: String,
    /// Alignment of the planned offsets, in bytes (a power of two).
    #[arg(long, default_value_t = 256)]
    alignment: u64,
    /// Where to write the plan (JSON).
    #[arg(long)]
    out: PathBuf,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    check_output("--out", &args.out, &[&args.trace], &["json"])?;
    let budget = match (args.ratio, args.budget) {
        (Some(ratio), _) => Budget::Ratio(ratio),
        (None, Some(bytes)) => Budget::Bytes(bytes),
        (None, None) => Budget::Unbounded,
    };
    let spec = RunSpec {
        policy: Policy::from(args.heuristic.as_str()),
        budget,
        ..RunSpec::default()
    };
    spec.validate()?;
    let workload = Workload::load(&args.trace, trace_format(args.format))?;
    let plan = Plan::make(&workload, &spec, args.alignment)?;
    // Checked before it is kept: the plan must run as planned.
    let followed = plan.follow(&workload)?;
    // The same heuristic and budget placing blocks as it goes.
    let dynamic = RunSpec {
        memory: MemoryModel::Arena {
            alignment: args.alignment,
        },
        ..spec.clone()
    }
    .run(&workload)?;
    plan.write(&args.out)?;
    let peak = workload.baseline.peak_bytes.max(1) as f64;
    if args.json {
        let object = json!({
            "trace": args.trace.display().to_string(),
            "heuristic": plan.heuristic,
            "budget_bytes": plan.budget_bytes,
            "baseline_peak_bytes": workload.baseline.peak_bytes,
            "peak_bytes": plan.peak_bytes,
            "arena_bytes": plan.arena_bytes,
            "fits": plan.fits(),
            "overhead": plan.overhead,
            "followed_overhead": followed.overhead,
            "dynamic_arena_status": dynamic.report.status,
            "dynamic_arena_overhead": dynamic.overhead,
            "allocations": plan.lifetimes.len(),
            "evictions": plan.evictions(),
            "moves": plan.moves(),
            "out": args.out.display().to_string(),
        });
        println!("{object}");
    } else {
        println!(
            "{}: planned with `{}`",
            args.trace.display(),
            plan.heuristic
        );
        let line = |what: &str, bytes: u64| {
            println!(
                "  {what:<28} {} ({:.3} of the baseline peak)",
                human(bytes),
                bytes as f64 / peak
            )
        };
        line("budget", plan.budget_bytes);
        line("peak, bytes counted", plan.peak_bytes);
        line("planned arena", plan.arena_bytes);
        if !plan.fits() {
            println!(
                "  {:<28} {:.1}% over the budget: no run found whose plan fits",
                "",
                (plan.arena_bytes as f64 / plan.budget_bytes.max(1) as f64 - 1.0) * 100.0
            );
        }
        println!(
            "  {:<28} {} (overhead {:.4})",
            "dynamic arena at the budget", dynamic.report.status, dynamic.overhead
        );
        println!(
            "  {:<28} {:.4}, the same when followed: {:.4}",
            "overhead", plan.overhead, followed.overhead
        );
        println!(
            "  {:<28} {} allocations, {} evictions, {} moves; written to {}",
            "plan",
            plan.lifetimes.len(),
            plan.evictions(),
            plan.moves(),
            args.out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtr replay TRACE --plan PLAN`: follows the plan with no policy.
pub fn follow(trace: &Path, format: FormatArg, plan: &Path, json: bool) -> dtr::Result<ExitCode> {
    let workload = Workload::load(trace, trace_format(format))?;
    let plan = Plan::read(plan)?;
    let outcome = plan.follow(&workload)?;
    let report = &outcome.report;
    if json {
        let object = json!({
            "trace": trace.display().to_string(),
            "status": report.status,
            "arena_bytes": plan.arena_bytes,
            "peak_bytes": report.peak_bytes,
            "overhead": outcome.overhead,
            "evictions": report.stats.evictions,
            "rematerializations": report.stats.rematerializations,
            "moved_bytes": report.stats.moved_bytes,
        });
        println!("{object}");
    } else {
        println!(
            "{}: {} following the plan of `{}`",
            trace.display(),
            report.status,
            plan.heuristic
        );
        println!(
            "  arena           {} planned, {} at most in use",
            human(plan.arena_bytes),
            human(report.peak_bytes)
        );
        println!("  overhead        {:.4}", outcome.overhead);
        println!(
            "  evictions       {} (remats {})",
            report.stats.evictions, report.stats.rematerializations
        );
        if report.stats.moved_bytes > 0 {
            println!(
                "  moved           {} in {} compactions",
                human(report.stats.moved_bytes),
                report.stats.compactions
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
