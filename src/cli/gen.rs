//! `dtr gen`: synthetic workloads written as traces.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;

/// What `dtr gen` writes.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    Chain,
    Resnet,
    Unet,
    Random,
}

/// The arguments of `dtr gen`.
#[derive(clap::Args)]
pub struct Args {
    #[arg(value_enum)]
    workload: WorkloadArg,
    /// Layers of a chain or ResNet-like workload.
    #[arg(long, default_value_t = 100)]
    length: usize,
    /// Layers per residual connection (resnet).
    #[arg(long, default_value_t = 2)]
    skip: usize,
    /// Levels of the U-Net-like workload.
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// Ops of the random DAG.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    let Args {
        workload,
        length,
        skip,
        depth,
        nodes,
        seed,
        out,
    } = args;
    use dtr::experiments::generate::{generate, Workload};
    let workload = match workload {
        WorkloadArg::Chain => Workload::Chain { length },
        WorkloadArg::Resnet => Workload::Resnet { length, skip },
        WorkloadArg::Unet => Workload::Unet { depth },
        WorkloadArg::Random => Workload::Random { nodes, seed },
    };
    let trace = generate(workload, &out.display().to_string())?;
    std::fs::write(&out, dtr::trace::native::to_string(&trace))
        .map_err(|e| dtr::Error::file(&out, e))?;
    eprintln!("wrote {} ({} events)", out.display(), trace.events.len());
    Ok(ExitCode::SUCCESS)
}
