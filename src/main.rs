//! The `dtr` command line: replay traces under a budget, inspect them, list
//! the heuristics. Its flags and JSON output are stable: scripts call it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use dtr::experiments::timeline::Timeline;
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;
use dtr::trace::replay::{baseline, replay, replay_observed, Baseline, Kernels, ReplayReport};
use dtr::trace::{self, TraceFormat};
use dtr::{Config, Interpreter, SimulatorBackend};
use serde_json::json;

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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    Auto,
    Dtr,
    Simrd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    Chain,
    Resnet,
    Unet,
    Random,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MemoryArg {
    Counter,
    Arena,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SamplingArg {
    All,
    Sqrt,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace under a memory budget on the data-free simulator.
    Replay {
        trace: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        format: FormatArg,
        /// Budget as a fraction of the unbounded run's peak (floored to bytes).
        #[arg(long, conflicts_with = "budget", required_unless_present = "budget")]
        ratio: Option<f64>,
        /// Budget in bytes; accepts KiB, MiB, GiB, KB, MB, GB suffixes.
        #[arg(long, value_parser = parse_bytes)]
        budget: Option<u64>,
        #[arg(long, default_value = "dtr")]
        heuristic: String,
        #[arg(long, value_enum, default_value = "counter")]
        memory: MemoryArg,
        #[arg(long, value_enum, default_value = "all")]
        sampling: SamplingArg,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Stop once total compute would pass this multiple of the unbounded run's.
        #[arg(long, default_value_t = 2.0)]
        thrash_limit: f64,
        /// Print one JSON object instead of a summary.
        #[arg(long)]
        json: bool,
        /// Draw memory in use over the trace's clock, with the budget,
        /// evictions, rematerialisations and (arena) fragmentation: a path
        /// ending in `.svg` gets a chart, one ending in `.csv` the samples.
        #[arg(long)]
        timeline: Option<PathBuf>,
    },
    /// Describe a trace: ops, tensors, constants, baseline peak and compute.
    Info {
        trace: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        format: FormatArg,
        #[arg(long)]
        json: bool,
    },
    /// Replay a grid of traces × heuristics × memory models × sampling ×
    /// seeds × ratios in parallel; write results.csv and results.json.
    Sweep {
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
        #[arg(long, value_enum, value_delimiter = ',', default_value = "counter")]
        memory: Vec<MemoryArg>,
        #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
        sampling: Vec<SamplingArg>,
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
    },
    /// The paper's Theorem 3.1: uniform chains of each length under ⌈2√N⌉
    /// activations, with the Revolve optimum and static √N checkpointing
    /// beside each heuristic; writes chains.csv and chains.svg.
    Chains {
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
    },
    /// Write a synthetic workload (forward + backward) as a dtr trace.
    Gen {
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
    },
    /// Draw a sweep's results (its results.json, or the directory holding it) as SVG.
    Plot {
        results: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Join the outputs of `dtr sweep --shard` runs.
    Merge {
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
    },
    /// List the eviction heuristics and what each one scores.
    Heuristics,
}

/// Parses `1234`, `64MiB`, `1.5GB`, … into bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit `{other}` (use B, KB, MB, GB, KiB, MiB or GiB)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("`{text}` is not a byte count"));
    }
    Ok((value * scale as f64).floor() as u64)
}

fn load(path: &std::path::Path, format: FormatArg) -> dtr::Result<(trace::Trace, TraceFormat)> {
    let format = match format {
        FormatArg::Auto => None,
        FormatArg::Dtr => Some(TraceFormat::Native),
        FormatArg::Simrd => Some(TraceFormat::Simrd),
    };
    trace::load(path, format)
}

struct ReplayArgs {
    ratio: Option<f64>,
    budget: Option<u64>,
    heuristic: String,
    thrash_limit: f64,
    memory: MemoryModel,
    sampling: Sampling,
    seed: u64,
}

fn run_replay(
    path: &std::path::Path,
    format: FormatArg,
    args: &ReplayArgs,
    timeline: Option<&mut Timeline>,
) -> dtr::Result<(
    Baseline,
    u64,
    ReplayReport,
    Option<dtr::memory::ArenaReport>,
)> {
    let (trace, format) = load(path, format)?;
    let base = baseline(&trace);
    let budget = match (args.ratio, args.budget) {
        (Some(ratio), _) if ratio.is_finite() && ratio > 0.0 => {
            (ratio * base.peak_bytes as f64).floor() as u64
        }
        (Some(ratio), _) => {
            return Err(dtr::Error::InvalidArgument(format!(
                "--ratio must be positive, got {ratio}"
            )))
        }
        (None, Some(bytes)) => bytes,
        (None, None) => {
            return Err(dtr::Error::InvalidArgument(
                "give --ratio or --budget".into(),
            ))
        }
    };
    if args.thrash_limit.is_nan() || args.thrash_limit < 1.0 {
        return Err(dtr::Error::InvalidArgument(format!(
            "--thrash-limit must be at least 1, got {}",
            args.thrash_limit
        )));
    }
    let config = Config::default()
        .with_budget_bytes(budget)
        .with_heuristic(args.heuristic.clone())
        // The authors' logs follow their simulator's conventions (see README).
        .with_simulator_conventions(format == TraceFormat::Simrd)
        .with_remat_limit(((args.thrash_limit - 1.0) * base.compute as f64).floor() as u64)
        .with_memory(args.memory)
        .with_sampling(args.sampling)
        .with_seed(args.seed);
    let mut interpreter = Interpreter::new(SimulatorBackend::new(), config)?;
    let report = match timeline {
        Some(timeline) => replay_observed(
            &trace,
            &mut interpreter,
            Kernels::Recorded,
            |clock, dtr, _| {
                timeline.observe(clock, dtr);
                Ok(())
            },
        )?,
        None => replay(&trace, &mut interpreter, Kernels::Recorded)?,
    };
    let arena = interpreter.memory().arena;
    // The process ends once the result is printed: its memory goes back to
    // the system whole, faster than the trace and the interpreter's tables
    // are freed block by block.
    std::mem::forget(interpreter);
    std::mem::forget(trace);
    Ok((base, budget, report, arena))
}

/// Whether a timeline at `path` is CSV (else SVG); checked before the
/// replay: another extension, or the input trace itself, is refused.
fn timeline_is_csv(path: &std::path::Path, trace: &std::path::Path) -> dtr::Result<bool> {
    let same = |a: &std::path::Path, b: &std::path::Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if same(path, trace) {
        return Err(dtr::Error::file(
            path,
            "--timeline names the input trace; it would be overwritten",
        ));
    }
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("csv") => Ok(true),
        Some("svg") => Ok(false),
        _ => Err(dtr::Error::file(
            path,
            "--timeline must end in .svg (a chart) or .csv (the samples)",
        )),
    }
}

/// Writes a replay's timeline: CSV samples or an SVG chart.
fn write_timeline(
    path: &std::path::Path,
    timeline: &Timeline,
    trace: &std::path::Path,
    heuristic: &str,
    budget: u64,
    baseline_peak: u64,
) -> dtr::Result<()> {
    if timeline_is_csv(path, trace)? {
        std::fs::write(path, timeline.to_csv()).map_err(|e| dtr::Error::file(path, e))
    } else {
        let title = format!(
            "{}: `{heuristic}` at {:.2} of the unbounded peak",
            dtr::experiments::plot::short_name(&trace.display().to_string()),
            budget as f64 / baseline_peak.max(1) as f64
        );
        dtr::experiments::plot::timeline_chart(timeline, &title, path)
    }
}

/// Worker threads: the flag, or every core.
fn jobs_or_cores(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Progress on stderr, one update per percent, and only on a terminal:
/// logs and pipes get no carriage-return noise.
fn progress(what: &'static str) -> impl Fn(usize, usize) + Sync {
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    move |done, total| {
        let percent = |n: usize| 100 * n / total.max(1);
        if !terminal || !(done == total || percent(done) != percent(done.saturating_sub(1))) {
            return;
        }
        eprint!("\r{what}: {done}/{total} runs ({}%)", percent(done));
        if done == total {
            eprintln!();
        }
    }
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
        Command::Replay {
            trace,
            format,
            ratio,
            budget,
            heuristic,
            memory,
            sampling,
            seed,
            thrash_limit,
            json,
            timeline,
        } => {
            let args = ReplayArgs {
                ratio,
                budget,
                heuristic: heuristic.clone(),
                thrash_limit,
                memory: match memory {
                    MemoryArg::Counter => MemoryModel::Counter,
                    MemoryArg::Arena => MemoryModel::arena(),
                },
                sampling: match sampling {
                    SamplingArg::All => Sampling::All,
                    SamplingArg::Sqrt => Sampling::Sqrt,
                },
                seed,
            };
            if let Some(path) = &timeline {
                timeline_is_csv(path, &trace)?;
            }
            let mut samples = timeline.as_ref().map(|_| Timeline::new());
            let (base, budget, report, arena) =
                run_replay(&trace, format, &args, samples.as_mut())?;
            let overhead = report.stats.compute as f64 / base.compute.max(1) as f64;
            if json {
                let object = json!({
                    "trace": trace.display().to_string(),
                    "status": report.status.as_str(),
                    "heuristic": heuristic,
                    "memory": if arena.is_some() { "arena" } else { "counter" },
                    "sampling": if args.sampling == Sampling::Sqrt { "sqrt" } else { "all" },
                    "seed": seed,
                    "budget_bytes": budget,
                    "baseline_peak_bytes": base.peak_bytes,
                    "baseline_compute": base.compute,
                    "compute": report.stats.compute,
                    "overhead": overhead,
                    "remat_compute": report.stats.remat_compute,
                    "peak_bytes": report.peak_bytes,
                    "evictions": report.stats.evictions,
                    "rematerializations": report.stats.rematerializations,
                    "wall_seconds": report.wall_seconds,
                    "message": report.message,
                    "fragmentation": arena.map(|a| a.fragmentation),
                    "largest_free_bytes": arena.map(|a| a.largest_free_bytes),
                    "free_blocks": arena.map(|a| a.free_blocks),
                });
                println!("{object}");
            } else {
                println!(
                    "{}: {} with `{heuristic}`",
                    trace.display(),
                    report.status.as_str()
                );
                println!(
                    "  budget          {budget} B ({:.3} of the {} B baseline peak)",
                    budget as f64 / base.peak_bytes.max(1) as f64,
                    base.peak_bytes
                );
                println!("  peak            {} B", report.peak_bytes);
                println!(
                    "  overhead        {overhead:.4} ({} of {} compute units recomputed)",
                    report.stats.remat_compute, base.compute
                );
                println!("  evictions       {}", report.stats.evictions);
                println!("  remats          {}", report.stats.rematerializations);
                println!("  wall time       {:.3} s", report.wall_seconds);
                if let Some(arena) = arena {
                    println!(
                        "  arena at end    {:.3} fragmentation, largest free block {} B of {} free blocks",
                        arena.fragmentation, arena.largest_free_bytes, arena.free_blocks
                    );
                }
                if let Some(message) = &report.message {
                    println!("  stopped         {message}");
                }
            }
            // After the result is printed: a failed write loses only itself.
            if let (Some(path), Some(samples)) = (&timeline, &samples) {
                write_timeline(path, samples, &trace, &heuristic, budget, base.peak_bytes)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Info {
            trace,
            format,
            json,
        } => {
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
                println!("  constant bytes      {}", base.constant_bytes);
                println!("  baseline peak       {} B", base.peak_bytes);
                println!("  baseline compute    {}", base.compute);
                println!("  lower bound budget  {} B (live constants + the largest op's inputs and outputs)", base.lower_bound_bytes);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sweep {
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
        } => {
            if ratios.iter().any(|r| !r.is_finite() || *r <= 0.0) {
                return Err(dtr::Error::InvalidArgument(
                    "--ratios must be positive numbers".into(),
                ));
            }
            if thrash_limit.is_nan() || thrash_limit < 1.0 {
                return Err(dtr::Error::InvalidArgument(format!(
                    "--thrash-limit must be at least 1, got {thrash_limit}"
                )));
            }
            let heuristics = if heuristics.iter().any(|h| h == "all") {
                dtr::policy::heuristic_names()
                    .filter(|h| *h != "dtr-walk")
                    .chain([dtr::experiments::STATIC_CHECKPOINTING])
                    .map(String::from)
                    .collect()
            } else {
                heuristics
            };
            let spec = dtr::experiments::SweepSpec {
                traces,
                heuristics,
                memories: memory
                    .iter()
                    .map(|m| match m {
                        MemoryArg::Counter => MemoryModel::Counter,
                        MemoryArg::Arena => MemoryModel::arena(),
                    })
                    .collect(),
                samplings: sampling
                    .iter()
                    .map(|s| match s {
                        SamplingArg::All => Sampling::All,
                        SamplingArg::Sqrt => Sampling::Sqrt,
                    })
                    .collect(),
                seeds,
                ratios,
                thrash_limit,
            };
            let shard = shard
                .as_deref()
                .map(dtr::experiments::Shard::parse)
                .transpose()?;
            let jobs = jobs_or_cores(jobs);
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
        Command::Chains {
            lengths,
            heuristics,
            jobs,
            out,
        } => {
            if lengths.contains(&0) {
                return Err(dtr::Error::InvalidArgument(
                    "--lengths must be positive".into(),
                ));
            }
            let rows = dtr::experiments::chains::run(
                &lengths,
                &heuristics,
                jobs_or_cores(jobs),
                &progress("chains"),
            )?;
            dtr::experiments::chains::write_results(&out, &rows)?;
            print!("{}", dtr::experiments::chains::table(&rows));
            eprintln!(
                "wrote {} and {}",
                out.join("chains.csv").display(),
                out.join("chains.svg").display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Gen {
            workload,
            length,
            skip,
            depth,
            nodes,
            seed,
            out,
        } => {
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
        Command::Plot { results, out } => {
            let rows = dtr::experiments::read_results(&results)?;
            for path in dtr::experiments::plot::plot_all(&rows, &out)? {
                println!("{}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Merge { shards, out } => {
            let rows = dtr::experiments::merge(&shards)?;
            dtr::experiments::write_results(&out, &rows)?;
            dtr::experiments::plot::plot_all(&rows, &out)?;
            print!("{}", dtr::experiments::summary(&rows));
            Ok(ExitCode::SUCCESS)
        }
        Command::Heuristics => {
            for name in dtr::policy::heuristic_names() {
                let about = dtr::policy::heuristic_by_name(name, 0)
                    .map(|h| h.about())
                    .unwrap_or_default();
                println!("{name:<10} {about}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
