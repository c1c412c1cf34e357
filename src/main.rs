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
    #[command(after_help = "Examples:
  dtr replay traces/mlp-small.jsonl --ratio 0.5
  dtr replay traces/resnet-small.jsonl --budget 200KiB --heuristic lru --json
  dtr replay traces/mlp-small.jsonl --ratio 0.4 --timeline mlp.svg --timeline-out mlp.json

A run that stops (out of memory, thrashing) is reported with where it stopped
and the smallest budget that completes. Open the --timeline-out file in
https://ui.perfetto.dev.")]
    Replay(cli::replay::Args),
    /// Describe a trace: ops, tensors, constants, baseline peak and compute.
    #[command(after_help = "Example:
  dtr info traces/transformer-small.jsonl")]
    Info(cli::info::Args),
    /// Replay a grid of traces × heuristics × memory models × sampling ×
    /// seeds × ratios in parallel; write results.csv and results.json.
    #[command(after_help = "Examples:
  dtr sweep traces/torchvision/*.jsonl --out sweep
  dtr sweep traces/mlp-small.jsonl --heuristics dtr,lru --ratios 1,0.5 --seeds 3 --out sweep
  dtr sweep traces/mlp-small.jsonl --shard 1/4 --out shard1   # then: dtr merge shard* --out all

Each run is saved in OUT/results.partial.jsonl as it finishes; after an
interruption, the same command with --resume runs only what is missing.")]
    Sweep(cli::sweep::SweepArgs),
    /// The paper's Theorem 3.1: uniform chains of each length under ⌈2√N⌉
    /// activations, with the Revolve optimum and static √N checkpointing
    /// beside each heuristic; writes chains.csv, chains.svg and chains.png.
    #[command(after_help = "Example:
  dtr chains --lengths 100,1000,10000 --heuristics dtr-eq,dtr --out chains")]
    Chains(cli::chains::Args),
    /// Write a synthetic workload (forward + backward) as a dtr trace.
    #[command(after_help = "Examples:
  dtr gen chain --length 200 --out chain.jsonl
  dtr gen unet --depth 5 --out unet.jsonl")]
    Gen(cli::gen::Args),
    /// Draw a sweep's results (its results.json, or the directory holding it) as SVG and PNG.
    #[command(after_help = "Example:
  dtr plot sweep/results.json --out plots")]
    Plot(cli::sweep::PlotArgs),
    /// Join the outputs of `dtr sweep --shard` runs.
    #[command(after_help = "Example:
  dtr merge shard1 shard2 shard3 --out all")]
    Merge(cli::sweep::MergeArgs),
    /// The smallest budget each trace runs in, per heuristic and memory
    /// model: bisection over the ratio of the unbounded peak.
    #[command(after_help = "Example:
  dtr fit traces/*.jsonl --heuristics dtr,lru --memory counter,arena")]
    Fit(cli::fit::Args),
    /// List the eviction heuristics and what each one scores.
    #[command(after_help = "Example:
  dtr heuristics")]
    Heuristics,
    /// Run a trace once under a heuristic and keep what it did as a static
    /// plan: the schedule and a fixed offset for every allocation (follow
    /// it with `dtr replay --plan`).
    Plan(cli::plan::Args),
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a reader that stops early (`dtr replay ... |
    // head`) made every later print panic with a backtrace. The default ends
    // the process quietly, as for any other command in a pipeline.
    #[cfg(unix)]
    // SAFETY: called first thing in `main`, before any other thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
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
