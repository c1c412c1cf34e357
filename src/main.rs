//! The `dtr` command line: replay traces under a budget, inspect them, list
//! the heuristics. Its flags and JSON output are stable: scripts call it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use dtr::experiments::timeline::Timeline;
use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;
use dtr::trace::replay::baseline;
use dtr::trace::{self, TraceFormat};
use dtr::Budget;
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

#[derive(Subcommand)]
enum Command {
    /// Replay a trace under a memory budget on the data-free simulator.
    Replay {
        trace: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        format: FormatArg,
        /// Budget as a fraction of the unbounded run's peak (floored to bytes).
        #[arg(long, conflicts_with = "budget")]
        ratio: Option<f64>,
        /// Budget in bytes; accepts KiB, MiB, GiB, KB, MB, GB suffixes.
        #[arg(long, value_parser = parse_bytes)]
        budget: Option<u64>,
        /// An eviction heuristic (see `dtr heuristics`), or `static-sqrt`
        /// for static √N checkpointing, which takes no budget.
        #[arg(long, default_value = dtr::policy::DEFAULT_HEURISTIC)]
        heuristic: String,
        /// `counter`, `arena` (256-byte aligned) or `arena:ALIGNMENT`.
        #[arg(long, default_value = "counter")]
        memory: MemoryModel,
        #[arg(long, value_enum, default_value = "all")]
        sampling: Sampling,
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
    /// The smallest budget each trace runs in, per heuristic and memory
    /// model: bisection over the ratio of the unbounded peak.
    Fit {
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "auto")]
        format: FormatArg,
        /// Heuristics, comma-separated (see `dtr heuristics`).
        #[arg(long, value_delimiter = ',', default_value = dtr::policy::DEFAULT_HEURISTIC)]
        heuristics: Vec<String>,
        /// Memory models, comma-separated: `counter`, `arena`, `arena:ALIGNMENT`.
        #[arg(long, value_delimiter = ',', default_value = "counter")]
        memory: Vec<MemoryModel>,
        #[arg(long, value_enum, default_value = "all")]
        sampling: Sampling,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// A run completes only if its compute stays within this multiple
        /// of the unbounded run's.
        #[arg(long, default_value_t = 2.0)]
        thrash_limit: f64,
        /// Stop bisecting once the bracket is narrower than this.
        #[arg(long, default_value_t = 0.01)]
        precision: f64,
        /// Worker threads (default: all cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the eviction heuristics and what each one scores.
    Heuristics,
}

/// Parses `1234`, `64MiB`, `1.5GB`, … into bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    dtr::parse_bytes(text).map_err(|error| error.to_string())
}

fn trace_format(format: FormatArg) -> Option<TraceFormat> {
    match format {
        FormatArg::Auto => None,
        FormatArg::Dtr => Some(TraceFormat::Native),
        FormatArg::Simrd => Some(TraceFormat::Simrd),
    }
}

fn load(path: &std::path::Path, format: FormatArg) -> dtr::Result<(trace::Trace, TraceFormat)> {
    trace::load(path, trace_format(format))
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

/// A progress bar on stderr, drawn only when stderr is a terminal: logs
/// and pipes get no carriage-return noise.
fn progress(what: &'static str) -> impl Fn(usize, usize) + Sync {
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
            let spec = RunSpec {
                policy: Policy::from(heuristic.as_str()),
                budget: match (ratio, budget) {
                    (Some(ratio), _) => Budget::Ratio(ratio),
                    (None, Some(bytes)) => Budget::Bytes(bytes),
                    (None, None) => Budget::Unbounded,
                },
                memory,
                sampling,
                seed,
                thrash_limit,
            };
            spec.validate()?;
            if spec.policy.takes_budget() && spec.budget == Budget::Unbounded {
                return Err(dtr::Error::InvalidArgument(
                    "give --ratio or --budget".into(),
                ));
            }
            if let Some(path) = &timeline {
                if !spec.policy.takes_budget() {
                    return Err(dtr::Error::InvalidArgument(format!(
                        "--timeline follows a heuristic's run; `{heuristic}` is a static plan"
                    )));
                }
                timeline_is_csv(path, &trace)?;
            }
            let workload = Workload::load(&trace, trace_format(format))?;
            let mut samples = timeline.as_ref().map(|_| Timeline::new());
            let outcome = spec.run_observed(&workload, |index, dtr| {
                if let Some(samples) = samples.as_mut() {
                    samples.observe(index, dtr);
                }
            })?;
            let (base, report, arena) = (&workload.baseline, &outcome.report, outcome.arena);
            let (budget, overhead) = (outcome.budget_bytes, outcome.overhead);
            if json {
                let object = json!({
                    "trace": trace.display().to_string(),
                    "status": report.status.as_str(),
                    "heuristic": heuristic,
                    "memory": spec.memory,
                    "sampling": spec.sampling,
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
                match budget {
                    Some(budget) => println!(
                        "  budget          {budget} B ({:.3} of the {} B baseline peak)",
                        budget as f64 / base.peak_bytes.max(1) as f64,
                        base.peak_bytes
                    ),
                    None => println!(
                        "  budget          none (a static plan; {:.3} of the {} B baseline peak)",
                        outcome.ratio, base.peak_bytes
                    ),
                }
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
            if let (Some(path), Some(samples), Some(budget)) = (&timeline, &samples, budget) {
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
        Command::Fit {
            traces,
            format,
            heuristics,
            memory,
            sampling,
            seed,
            thrash_limit,
            precision,
            jobs,
            json,
        } => {
            let specs: Vec<RunSpec> = heuristics
                .iter()
                .flat_map(|heuristic| {
                    memory.iter().map(move |&memory| RunSpec {
                        policy: Policy::from(heuristic.as_str()),
                        memory,
                        sampling,
                        seed,
                        thrash_limit,
                        ..RunSpec::default()
                    })
                })
                .collect();
            for spec in &specs {
                spec.validate()?;
            }
            let workloads: Vec<Workload> = traces
                .iter()
                .map(|path| Workload::load(path, trace_format(format)))
                .collect::<dtr::Result<_>>()?;
            let cells: Vec<(usize, usize)> = (0..traces.len())
                .flat_map(|t| (0..specs.len()).map(move |s| (t, s)))
                .collect();
            let fits = dtr::experiments::parallel_map(
                &cells,
                jobs_or_cores(jobs),
                &progress("fit"),
                |&(t, s)| {
                    dtr::experiments::fit::smallest_ratio(&workloads[t], &specs[s], precision)
                },
            )
            .into_iter()
            .collect::<dtr::Result<Vec<_>>>()?;
            let memory_name = |spec: &RunSpec| spec.memory.to_string();
            if json {
                let objects: Vec<serde_json::Value> = cells
                    .iter()
                    .zip(&fits)
                    .map(|(&(t, s), fit)| {
                        json!({
                            "trace": traces[t].display().to_string(),
                            "heuristic": specs[s].policy.name(),
                            "memory": memory_name(&specs[s]),
                            "ratio": fit.ratio,
                            "budget_bytes": fit.budget_bytes,
                            "overhead": fit.overhead,
                            "fails_at": fit.fails_at,
                            "probes": fit.probes,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(objects));
            } else {
                // One table per memory model: a row per trace, a column per heuristic.
                for m in 0..memory.len() {
                    let name = memory_name(&specs[m]);
                    println!(
                        "{name} memory: smallest ratio of the unbounded peak that completes\n"
                    );
                    println!("| trace | {} |", heuristics.join(" | "));
                    println!("|---|{}", "---:|".repeat(heuristics.len()));
                    for (t, trace) in traces.iter().enumerate() {
                        let ratios: Vec<String> = (0..heuristics.len())
                            .map(|h| {
                                let s = h * memory.len() + m;
                                let fit = &fits[t * specs.len() + s];
                                fit.ratio.map_or("—".into(), |r| format!("{r:.3}"))
                            })
                            .collect();
                        println!("| {} | {} |", trace.display(), ratios.join(" | "));
                    }
                    println!();
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Heuristics => {
            println!("{:<12} {:<22} what it does", "name", "usable in");
            for policy in dtr::policy::POLICIES {
                let usable = policy.usable.describe();
                println!("{:<12} {usable:<22} {}", policy.name, policy.about);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
