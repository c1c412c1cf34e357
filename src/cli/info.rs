//! `dtr info`: what a trace holds and what it needs unbounded.

use std::path::PathBuf;
use std::process::ExitCode;

use dtr::trace::replay::baseline;
use dtr::trace::TraceFormat;
use serde_json::json;

use super::{human, load, FormatArg};

/// The arguments of `dtr info`.
#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    format: FormatArg,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> dtr::Result<ExitCode> {
    let Args {
        trace,
        format,
        json,
    } = args;
    let (loaded, format) = load(&trace, format)?;
    let base = baseline(&loaded);
    let format = match format {
        TraceFormat::Native => "dtr",
        TraceFormat::Simrd => "simrd",
    };
    if json {
        let object = json!({
            "trace": trace.display().to_string(),
            "format": format,
            "ops": base.ops,
            "tensors": base.tensors,
            "constant_bytes": base.constant_bytes,
            "baseline_peak_bytes": base.peak_bytes,
            "baseline_compute": base.compute,
            "lower_bound_bytes": base.lower_bound_bytes,
        });
        println!("{object}");
    } else {
        println!("{} ({format} format)", trace.display());
        println!("  ops                 {}", base.ops);
        println!("  tensors             {}", base.tensors);
        println!("  constants           {}", human(base.constant_bytes));
        println!("  baseline peak       {}", human(base.peak_bytes));
        println!("  baseline compute    {}", base.compute);
        println!(
            "  lower bound budget  {} (live constants + the largest op's inputs and outputs)",
            human(base.lower_bound_bytes)
        );
    }
    Ok(ExitCode::SUCCESS)
}
