//! `dtr sweep`, `dtr plot` and `dtr merge`: grids of replays and their results.

use std::path::PathBuf;
use std::process::ExitCode;

use dtr::memory::MemoryModel;
use dtr::policy::Sampling;

use super::{jobs_or_cores, progress};

/// The arguments of `dtr sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Budget ratios, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
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
    /// Memory models, comma-separated: `counter`, `arena`, `arena:ALIGNMENT`.
    #[arg(long, value_delimiter = ',', default_value = "counter")]
    memory: Vec<MemoryModel>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    sampling: Vec<Sampling>,
    /// Run seeds 0..N.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    #[arg(long, default_value_t = 2.0)]
    thrash_limit: f64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Run only shard K of N (1-based), e.g. 3/8; join shards with `dtr merge`.
    #[arg(long)]
    shard: Option<String>,
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
        seeds,
        thrash_limit,
        jobs,
        shard,
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
    let spec = dtr::experiments::SweepSpec {
        traces,
        heuristics,
        memories: memory,
        samplings: sampling,
        seeds,
        ratios,
        thrash_limit,
    };
    let shard = shard
        .as_deref()
        .map(dtr::experiments::Shard::parse)
        .transpose()?;
    let jobs = jobs_or_cores(jobs);
    spec.validate()?;
    dtr::experiments::prepare_out(&out)?;
    let rows = spec.run(shard, jobs, &progress("sweep"))?;
    dtr::experiments::write_results(&out, &rows)?;
    dtr::experiments::plot::plot_all(&rows, &out)?;
    print!("{}", dtr::experiments::summary(&rows));
    eprintln!(
        "wrote {} and {}",
        out.join("results.csv").display(),
        out.join("results.json").display()
    );
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
    dtr::experiments::write_results(&out, &rows)?;
    dtr::experiments::plot::plot_all(&rows, &out)?;
    print!("{}", dtr::experiments::summary(&rows));
    Ok(ExitCode::SUCCESS)
}
