//! `dtr fit`: the smallest budget each trace runs in.

use std::path::PathBuf;
use std::process::ExitCode;

use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;
use dtr::RestoreMode;
use serde_json::json;

use super::guards::GuardArgs;
use super::restore::{SwapArgs, RESTORE_HELP};
use super::{human, jobs_or_cores, progress, trace_format, FormatArg};

/// The arguments of `dtr fit`.
#[derive(clap::Args)]
pub struct Args {
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    format: FormatArg,
    /// Heuristics, comma-separated (see `dtr heuristics`). By default
    /// `dtr-next`, h_DTR looking ahead, since a replay knows the program's
    /// future; `dtr` is what DTR does at run time, with no foresight.
    #[arg(long, value_delimiter = ',', default_value = dtr::policy::REPLAY_HEURISTIC)]
    heuristics: Vec<String>,
    /// Memory models, comma-separated: `counter`, or an arena: `arena` (best fit), `arena-ff` (first fit), `arena-split` (best fit, small blocks apart at the top) or `arena-compact` (best fit, moving blocks where fragmentation hides room), each optionally `:ALIGNMENT` (default 256).
    #[arg(long, value_delimiter = ',', default_value = "counter")]
    memory: Vec<MemoryModel>,
    #[arg(long, value_enum, default_value = "all")]
    sampling: Sampling,
    #[arg(long, value_enum, default_value = "drop", help = RESTORE_HELP)]
    restore: RestoreMode,
    #[command(flatten)]
    swap: SwapArgs,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A run completes only if its compute stays within this multiple
    /// of the unbounded run's.
    #[arg(long, default_value_t = 2.0)]
    thrash_limit: f64,
    #[command(flatten)]
    guards: GuardArgs,
    /// Stop bisecting once the bracket is narrower than this.
    #[arg(long, default_value_t = 0.01)]
    precision: f64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Also find the smallest ratio at which each heuristic's run gives a
    /// static plan (`dtr plan`, 256-byte blocks) within the budget.
    #[arg(long)]
    plans: bool,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    let Args {
        traces,
        format,
        heuristics,
        memory,
        sampling,
        restore,
        swap,
        seed,
        thrash_limit,
        guards,
        precision,
        jobs,
        plans,
        json,
    } = args;
    let (move_bandwidth, swap) = (swap.move_bandwidth(), swap.config());
    let specs: Vec<RunSpec> = heuristics
        .iter()
        .flat_map(|heuristic| {
            memory.iter().map(move |&memory| RunSpec {
                policy: Policy::from(heuristic.as_str()),
                memory,
                sampling,
                seed,
                thrash_limit,
                restore,
                swap,
                move_bandwidth,
                keep_needed_history: guards.keep_needed_history,
                remat_memory_guard: guards.remat_guard,
                pin_resident_first: guards.pin_resident_first,
                ..RunSpec::default()
            })
        })
        .collect();
    for spec in &specs {
        spec.validate()?;
    }
    let workloads: Vec<Workload> = traces
        .iter()
        .map(|path| Workload::load(path, trace_format(format)))
        .collect::<dtr::Result<_>>()?;
    let cells: Vec<(usize, usize)> = (0..traces.len())
        .flat_map(|t| (0..specs.len()).map(move |s| (t, s)))
        .collect();
    let fits =
        dtr::experiments::parallel_map(&cells, jobs_or_cores(jobs), &progress("fit"), |&(t, s)| {
            dtr::experiments::fit::smallest_ratio(&workloads[t], &specs[s], precision)
        })
        .into_iter()
        .collect::<dtr::Result<Vec<_>>>()?;
    let planned: Vec<(usize, usize)> = if plans {
        (0..traces.len())
            .flat_map(|t| (0..heuristics.len()).map(move |h| (t, h)))
            .collect()
    } else {
        Vec::new()
    };
    let plan_fits = dtr::experiments::parallel_map(
        &planned,
        jobs_or_cores(jobs),
        &progress("fit plans"),
        |&(t, h)| {
            let spec = RunSpec {
                memory: MemoryModel::Counter,
                ..specs[h * memory.len()].clone()
            };
            dtr::experiments::plan::Plan::smallest_ratio(&workloads[t], &spec, 256, precision)
        },
    )
    .into_iter()
    .collect::<dtr::Result<Vec<_>>>()?;
    let memory_name = |spec: &RunSpec| spec.memory.to_string();
    if json {
        let objects: Vec<serde_json::Value> = cells
            .iter()
            .zip(&fits)
            .map(|(&(t, s), fit)| {
                json!({
                    "trace": traces[t].display().to_string(),
                    "heuristic": specs[s].policy.name(),
                    "memory": memory_name(&specs[s]),
                    "ratio": fit.ratio,
                    "budget_bytes": fit.budget_bytes,
                    "overhead": fit.overhead,
                    "fails_at": fit.fails_at,
                    "probes": fit.probes,
                })
            })
            .chain(planned.iter().zip(&plan_fits).map(|(&(t, h), fit)| {
                json!({
                    "trace": traces[t].display().to_string(),
                    "heuristic": heuristics[h],
                    "memory": "plan",
                    "ratio": fit.ratio,
                    "budget_bytes": fit.budget_bytes,
                    "overhead": fit.overhead,
                    "fails_at": fit.fails_at,
                    "probes": fit.probes,
                })
            }))
            .collect();
        println!("{}", serde_json::Value::Array(objects));
    } else {
        // One table per memory model: a row per trace, a column per heuristic.
        for m in 0..memory.len() {
            let name = memory_name(&specs[m]);
            println!(
                "{name} memory: smallest ratio of the unbounded peak that completes (its budget)\n"
            );
            println!("| trace | {} |", heuristics.join(" | "));
            println!("|---|{}", "---:|".repeat(heuristics.len()));
            for (t, trace) in traces.iter().enumerate() {
                let ratios: Vec<String> = (0..heuristics.len())
                    .map(|h| {
                        let s = h * memory.len() + m;
                        let fit = &fits[t * specs.len() + s];
                        match (fit.ratio, fit.budget_bytes) {
                            (Some(r), Some(bytes)) => format!("{r:.3} ({})", human(bytes)),
                            (Some(r), None) => format!("{r:.3}"),
                            _ => "—".into(),
                        }
                    })
                    .collect();
                println!("| {} | {} |", trace.display(), ratios.join(" | "));
            }
            println!();
        }
        if plans {
            println!("static plans (arena, 256-byte blocks): smallest ratio whose plan fits\n");
            println!("| trace | {} |", heuristics.join(" | "));
            println!("|---|{}", "---:|".repeat(heuristics.len()));
            for (t, trace) in traces.iter().enumerate() {
                let ratios: Vec<String> = (0..heuristics.len())
                    .map(|h| {
                        let fit = &plan_fits[t * heuristics.len() + h];
                        fit.ratio.map_or("—".into(), |r| format!("{r:.3}"))
                    })
                    .collect();
                println!("| {} | {} |", trace.display(), ratios.join(" | "));
            }
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}
