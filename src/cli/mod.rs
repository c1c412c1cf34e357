//! The subcommands of the `dtr` command line, one module each, and what
//! they share: trace formats, byte sizes, worker threads and progress.

pub mod chains;
pub mod fit;
pub mod gen;
pub mod guards;
pub mod heuristics;
pub mod info;
pub mod plan;
pub mod replay;
pub mod restore;
pub mod sweep;

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use dtr::trace::{self, TraceFormat};

/// A trace's format: detected, ours, or the DTR authors' simulator log.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Auto,
    Dtr,
    Simrd,
}

/// Parses `1234`, `64MiB`, `1.5GB`, … into bytes. A plain number in
/// another notation (`1e30`, `-5`) is named as the number it is, not as a
/// number with an unknown unit.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let plain = text.trim();
    if plain.starts_with(['-', '+']) || plain.contains(['e', 'E']) {
        if let Ok(number) = plain.parse::<f64>() {
            return if number.is_finite() && number >= 0.0 && number < u64::MAX as f64 {
                if number.fract() == 0.0 {
                    Ok(number as u64)
                } else {
                    Err(format!("`{text}` is not a whole number of bytes"))
                }
            } else if number < 0.0 {
                Err(format!(
                    "`{text}` is negative; a budget is a size, like 512MiB"
                ))
            } else {
                Err(format!(
                    "`{text}` bytes is out of range: at most {} (16 EiB)",
                    u64::MAX
                ))
            };
        }
    }
    dtr::parse_bytes(text).map_err(|error| error.to_string())
}

/// The canonical form of an existing path, or of a new one's directory
/// joined with its name (the file need not exist yet).
fn canonical(path: &Path) -> Option<PathBuf> {
    if let Ok(path) = path.canonicalize() {
        return Some(path);
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(parent.canonicalize().ok()?.join(path.file_name()?))
}

/// Whether two paths name the same file (by canonical path, or as hard
/// links of one file).
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            if a.dev() == b.dev() && a.ino() == b.ino() {
                return true;
            }
        }
    }
    matches!((canonical(a), canonical(b)), (Some(a), Some(b)) if a == b)
}

/// Checks an output file before any work: it is not one of the `inputs`,
/// and its extension (lower-cased) is one of `extensions`, which it
/// returns. `flag` names the option in messages.
pub fn check_output(
    flag: &str,
    path: &Path,
    inputs: &[&Path],
    extensions: &[&'static str],
) -> dtr::Result<&'static str> {
    if let Some(input) = inputs.iter().find(|input| same_file(path, input)) {
        return Err(dtr::Error::file(
            path,
            format!(
                "{flag} names the input {}; it would be overwritten",
                input.display()
            ),
        ));
    }
    // Outputs are written at the end of a run: a directory that is not
    // there is reported before it, not after.
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(dtr::Error::file(
                path,
                format!("{flag}: the directory {} does not exist", dir.display()),
            ));
        }
    }
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let known = extensions
        .iter()
        .find(|&&e| extension.as_deref() == Some(e))
        .copied();
    known.ok_or_else(|| {
        dtr::Error::file(
            path,
            format!(
                "{flag} must end in {}",
                extensions
                    .iter()
                    .map(|e| format!(".{e}"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        )
    })
}

/// Checks an output directory before any work: no input lies in it under
/// one of the `names` the command writes there.
pub fn check_output_dir(
    flag: &str,
    dir: &Path,
    inputs: &[&Path],
    names: &[&str],
) -> dtr::Result<()> {
    for name in names {
        let path = dir.join(name);
        if let Some(input) = inputs.iter().find(|input| same_file(&path, input)) {
            return Err(dtr::Error::file(
                &path,
                format!(
                    "{flag} would overwrite the input {} with its {name}",
                    input.display()
                ),
            ));
        }
    }
    Ok(())
}

/// A byte count for people: `1.5 GiB` (exact bytes stay in JSON and CSV).
pub fn human(bytes: u64) -> String {
    bytesize::ByteSize::b(bytes).display().iec().to_string()
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
