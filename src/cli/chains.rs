//! `dtr chains`: the paper's Theorem 3.1 on uniform chains.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{jobs_or_cores, progress};

/// The arguments of `dtr chains`.
#[derive(clap::Args)]
pub struct Args {
    /// Chain lengths, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,316,1000,3162,10000,31623,100000"
    )]
    lengths: Vec<usize>,
    /// Heuristics, comma-separated. (`dtr` is quadratic on very long
    /// evicted chains; `dtr-eq` is the paper's heuristic for the theorem.)
    #[arg(long, value_delimiter = ',', default_value = "dtr-eq")]
    heuristics: Vec<String>,
    #[arg(long)]
    jobs: Option<usize>,
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    let Args {
        lengths,
        heuristics,
        jobs,
        out,
    } = args;
    if lengths.contains(&0) {
        return Err(dtr::Error::InvalidArgument(
            "--lengths must be positive".into(),
        ));
    }
    // Before the runs: an --out that cannot be a directory fails now.
    dtr::experiments::prepare_out(&out)?;
    let rows = dtr::experiments::chains::run(
        &lengths,
        &heuristics,
        jobs_or_cores(jobs),
        &progress("chains"),
    )?;
    // The table first: a failed write loses only the files.
    print!("{}", dtr::experiments::chains::table(&rows));
    dtr::experiments::chains::write_results(&out, &rows)?;
    eprintln!(
        "wrote {}, {} and {}",
        out.join("chains.csv").display(),
        out.join("chains.svg").display(),
        out.join("chains.png").display()
    );
    Ok(ExitCode::SUCCESS)
}
