//! `dtr sweep`, `dtr plot` and `dtr merge`: grids of replays and their results.

use std::path::PathBuf;
use std::process::ExitCode;

use dtr::experiments::Placement;
use dtr::policy::Sampling;
use dtr::RestoreMode;

use super::guards::GuardArgs;
use super::restore::{SwapArgs, RESTORE_HELP};

use super::{check_output_dir, jobs_or_cores, progress};

/// What a sweep or a merge writes into its `--out` directory (besides plots).
const RESULT_FILES: [&str; 3] = ["results.csv", "results.json", dtr::experiments::PARTIAL];

/// The arguments of `dtr sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Budget ratios, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        allow_negative_numbers = true,
        default_value = "1,0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2,0.1"
    )]
    ratios: Vec<f64>,
    /// Heuristics, comma-separated, or `all`; `static-sqrt` adds static
    /// √N checkpointing (Chen et al.) as a baseline.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dtr,dtr-eq,dtr-local,msps,lru,size,static-sqrt"
    )]
    heuristics: Vec<String>,
    /// Memory models, comma-separated: `counter`, or an arena: `arena` (best fit), `arena-ff` (first fit), `arena-split` (best fit, small blocks apart at the top) or `arena-compact` (best fit, moving blocks where fragmentation hides room); or `plan`, a static plan made at the budget (as `dtr plan` makes it) and followed, over the budget an `oom`. Arenas and plans optionally `:ALIGNMENT` (default 256).
    #[arg(long, value_delimiter = ',', default_value = "counter")]
    memory: Vec<Placement>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    sampling: Vec<Sampling>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "drop", help = RESTORE_HELP)]
    restore: Vec<RestoreMode>,
    #[command(flatten)]
    swap: SwapArgs,
    /// Run seeds 0..N (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    #[arg(long, default_value_t = 2.0)]
    thrash_limit: f64,
    #[command(flatten)]
    guards: GuardArgs,
    /// Worker threads (default: all cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Run only shard K of N (1-based), e.g. 3/8; join shards with `dtr merge`.
    #[arg(long)]
    shard: Option<String>,
    /// Continue an interrupted sweep in `--out`: the runs it saved (in
    /// results.partial.jsonl) are kept, only the others run.
    #[arg(long)]
    resume: bool,
    /// The directory for results.csv, results.json and the plots. Runs are
    /// saved there as they finish, so an interrupted sweep keeps them.
    #[arg(long)]
    out: PathBuf,
}

pub fn sweep(args: SweepArgs) -> dtr::Result<ExitCode> {
    let SweepArgs {
        traces,
        ratios,
        heuristics,
        memory,
        sampling,
        restore,
        swap,
        seeds,
        thrash_limit,
        guards,
        jobs,
        shard,
        resume,
        out,
    } = args;
    let heuristics = if heuristics.iter().any(|h| h == "all") {
        dtr::policy::POLICIES
            .iter()
            // The slow reference of `dtr` adds nothing; revolve is chains' alone.
            .filter(|p| p.name != "dtr-walk" && p.usable != dtr::policy::Usable::Chains)
            .map(|p| p.name)
            .map(String::from)
            .collect()
    } else {
        heuristics
    };
    // A value named twice in a grid is one run, not two rows alike.
    let spec = dtr::experiments::SweepSpec {
        traces,
        heuristics: distinct(heuristics),
        memories: distinct(memory),
        samplings: distinct(sampling),
        restores: distinct(restore),
        swap: swap.config(),
        move_bandwidth: swap.move_bandwidth(),
        seeds,
        ratios: distinct(ratios),
        thrash_limit,
        keep_needed_history: guards.keep_needed_history,
        remat_memory_guard: guards.remat_guard,
        pin_resident_first: guards.pin_resident_first,
    };
    let shard = shard
        .as_deref()
        .map(dtr::experiments::Shard::parse)
        .transpose()?;
    let jobs = jobs_or_cores(jobs);
    spec.validate()?;
    let inputs: Vec<&std::path::Path> = spec.traces.iter().map(PathBuf::as_path).collect();
    // The charts are named after the traces as the rows will name them.
    let traces: Vec<String> = spec
        .traces
        .iter()
        .map(|t| t.display().to_string())
        .collect();
    let charts = dtr::experiments::plot::chart_files(&traces);
    let mut names: Vec<&str> = RESULT_FILES.to_vec();
    names.extend(charts.iter().map(String::as_str));
    check_output_dir("--out", &out, &inputs, &names)?;
    dtr::experiments::prepare_out(&out)?;
    let saved = dtr::experiments::read_partial(&out)?;
    if !saved.is_empty() && !resume {
        return Err(dtr::Error::file(
            &out.join(dtr::experiments::PARTIAL),
            format!(
                "an interrupted sweep saved {} runs here; continue it with --resume, \
                 or remove the file to start over",
                saved.len()
            ),
        ));
    }
    if !saved.is_empty() {
        eprintln!("resuming: {} runs already done", saved.len());
    }
    let partial = dtr::experiments::PartialWriter::create(&out, &saved)?;
    let rows = spec.run_resuming(shard, jobs, &progress("sweep"), saved, &|row| {
        partial.append(row)
    })?;
    dtr::experiments::write_results(&out, &rows)?;
    partial.remove()?;
    // The results are safe: print them before drawing, so a failed plot
    // loses only itself.
    print!("{}", dtr::experiments::summary(&rows));
    eprintln!(
        "wrote {} and {}",
        out.join("results.csv").display(),
        out.join("results.json").display()
    );
    dtr::experiments::plot::plot_all(&rows, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `dtr plot`.
#[derive(clap::Args)]
pub struct PlotArgs {
    results: PathBuf,
    #[arg(long)]
    out: PathBuf,
}

pub fn plot(args: PlotArgs) -> dtr::Result<ExitCode> {
    let PlotArgs { results, out } = args;
    let rows = dtr::experiments::read_results(&results)?;
    let results_file = if results.is_dir() {
        results.join("results.json")
    } else {
        results.clone()
    };
    let names = dtr::experiments::plot::file_names(&rows);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    check_output_dir("--out", &out, &[&results_file], &names)?;
    for path in dtr::experiments::plot::plot_all(&rows, &out)? {
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The arguments of `dtr merge`.
#[derive(clap::Args)]
pub struct MergeArgs {
    #[arg(required = true)]
    shards: Vec<PathBuf>,
    #[arg(long)]
    out: PathBuf,
}

pub fn merge(args: MergeArgs) -> dtr::Result<ExitCode> {
    let MergeArgs { shards, out } = args;
    let rows = dtr::experiments::merge(&shards)?;
    let inputs: Vec<PathBuf> = shards
        .iter()
        .map(|s| {
            if s.is_dir() {
                s.join("results.json")
            } else {
                s.clone()
            }
        })
        .collect();
    let inputs: Vec<&std::path::Path> = inputs.iter().map(PathBuf::as_path).collect();
    check_output_dir("--out", &out, &inputs, &RESULT_FILES)?;
    dtr::experiments::write_results(&out, &rows)?;
    print!("{}", dtr::experiments::summary(&rows));
    dtr::experiments::plot::plot_all(&rows, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// `values` without repeats, in the order first given.
fn distinct<T: PartialEq>(values: Vec<T>) -> Vec<T> {
    let mut kept: Vec<T> = Vec::with_capacity(values.len());
    for value in values {
        if !kept.contains(&value) {
            kept.push(value);
        }
    }
    kept
}
