//! The `dtr` command line: replay traces under a budget, inspect them, list
//! the heuristics. Its flags and JSON output are stable: scripts call it.
//! Each subcommand is one module of `src/cli/`.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dtr",
    version,
    about = "Dynamic Tensor Rematerialization runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace under a memory budget on the data-free simulator.
    Replay(cli::replay::Args),
    /// Describe a trace: ops, tensors, constants, baseline peak and compute.
    Info(cli::info::Args),
    /// Replay a grid of traces × heuristics × memory models × sampling ×
    /// seeds × ratios in parallel; write results.csv and results.json.
    Sweep(cli::sweep::SweepArgs),
    /// The paper's Theorem 3.1: uniform chains of each length under ⌈2√N⌉
    /// activations, with the Revolve optimum and static √N checkpointing
    /// beside each heuristic; writes chains.csv and chains.svg.
    Chains(cli::chains::Args),
    /// Write a synthetic workload (forward + backward) as a dtr trace.
    Gen(cli::gen::Args),
    /// Draw a sweep's results (its results.json, or the directory holding it) as SVG.
    Plot(cli::sweep::PlotArgs),
    /// Join the outputs of `dtr sweep --shard` runs.
    Merge(cli::sweep::MergeArgs),
    /// The smallest budget each trace runs in, per heuristic and memory
    /// model: bisection over the ratio of the unbounded peak.
    Fit(cli::fit::Args),
    /// List the eviction heuristics and what each one scores.
    Heuristics,
    /// Run a trace once under a heuristic and keep what it did as a static
    /// plan: the schedule and a fixed offset for every allocation (follow
    /// it with `dtr replay --plan`).
    Plan(cli::plan::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> dtr::Result<ExitCode> {
    match command {
        Command::Replay(args) => cli::replay::run(args),
        Command::Info(args) => cli::info::run(args),
        Command::Sweep(args) => cli::sweep::sweep(args),
        Command::Chains(args) => cli::chains::run(args),
        Command::Gen(args) => cli::gen::run(args),
        Command::Plot(args) => cli::sweep::plot(args),
        Command::Merge(args) => cli::sweep::merge(args),
        Command::Fit(args) => cli::fit::run(args),
        Command::Heuristics => cli::heuristics::run(),
        Command::Plan(args) => cli::plan::run(args),
    }
}
