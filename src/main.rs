//! The `dtr` command line. Trace replay and sweeps build on this.

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
    /// List the eviction heuristics and what each one scores.
    Heuristics,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Heuristics => {
            for name in dtr::policy::heuristic_names() {
                let about = dtr::policy::heuristic_by_name(name)
                    .map(|h| h.about())
                    .unwrap_or_default();
                println!("{name:<10} {about}");
            }
            ExitCode::SUCCESS
        }
    }
}
