//! The subcommands of the `dtr` command line, one module each, and what
//! they share: trace formats, byte sizes, worker threads and progress.

pub mod chains;
pub mod fit;
pub mod gen;
pub mod heuristics;
pub mod info;
pub mod plan;
pub mod replay;
pub mod restore;
pub mod sweep;

use clap::ValueEnum;
use dtr::trace::{self, TraceFormat};

/// A trace's format: detected, ours, or the DTR authors' simulator log.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Auto,
    Dtr,
    Simrd,
}

/// Parses `1234`, `64MiB`, `1.5GB`, … into bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    dtr::parse_bytes(text).map_err(|error| error.to_string())
}

pub fn trace_format(format: FormatArg) -> Option<TraceFormat> {
    match format {
        FormatArg::Auto => None,
        FormatArg::Dtr => Some(TraceFormat::Native),
        FormatArg::Simrd => Some(TraceFormat::Simrd),
    }
}

pub fn load(path: &std::path::Path, format: FormatArg) -> dtr::Result<(trace::Trace, TraceFormat)> {
    trace::load(path, trace_format(format))
}

/// Worker threads: the flag, or every core.
pub fn jobs_or_cores(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A progress bar on stderr, drawn only when stderr is a terminal: logs
/// and pipes get no carriage-return noise.
pub fn progress(what: &'static str) -> impl Fn(usize, usize) + Sync {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr())
            .with_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix}: {bar:30} {pos}/{len} runs, {elapsed} (ETA {eta})",
                )
                .expect("a valid template"),
            )
            .with_prefix(what);
    move |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        if done == total {
            bar.finish();
        }
    }
}
