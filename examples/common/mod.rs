//! What every training example shares: the flags, running the model once
//! unbounded (to measure its peak) and once under a fraction of that peak,
//! and the report (per-step losses, memory, evictions, overhead; or JSON).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, ValueEnum};
use dtr::eager::Session;
use dtr::{Backend, Config, CpuBackend, WgpuBackend, WgpuOptions};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Cpu,
    Wgpu,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Where the ops run.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendArg,
    /// Budget as a fraction of the unbounded run's peak memory.
    #[arg(long, default_value_t = 0.5)]
    pub budget_ratio: f64,
    /// Eviction heuristic (see `dtr heuristics`).
    #[arg(long, alias = "heuristic", default_value = "dtr-eq")]
    pub policy: String,
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the unbounded run's program as a dtr trace to this file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Threads of the CPU backend's kernels (default: all cores). Results
    /// are bitwise the same for any count.
    #[arg(long)]
    pub threads: Option<usize>,
    /// How evicted tensors come back: `drop` recomputes them; `swap` and
    /// `hybrid` may copy them (parameters and optimiser state included) to
    /// host memory and back, at 16 GB/s on the copy queue's clock.
    #[arg(long, value_enum, default_value = "drop")]
    pub restore: dtr::RestoreMode,
    /// How memory is counted under the budget: `counter` (bytes), `arena`
    /// (offsets in one address space, so fragmentation counts; the
    /// backends' buffers stay their own, the arena is a model) or
    /// `arena-compact` (the arena, moving blocks to open holes).
    #[arg(long, default_value = "counter")]
    pub memory: dtr::memory::MemoryModel,
}

/// A model and its data, trained for some steps in a session; its flags
/// are the example's command line.
pub trait Model: clap::Parser {
    fn name(&self) -> &'static str;
    /// The shared flags.
    fn run_args(&self) -> &RunArgs;
    /// Checks the model's own flags.
    fn validate(&self) -> Result<(), String>;
    /// Trains from a fixed seed and returns each step's loss, calling
    /// `laps.lap()` at the end of each step.
    fn train<B: Backend>(
        &self,
        session: &Session<B>,
        steps: usize,
        seed: u64,
        laps: &mut Laps,
    ) -> dtr::Result<Vec<f32>>;
}

/// Wall time of each training step.
pub struct Laps {
    last: Instant,
    seconds: Vec<f64>,
}

impl Laps {
    fn start() -> Laps {
        Laps {
            last: Instant::now(),
            seconds: Vec::new(),
        }
    }

    /// Ends a step.
    pub fn lap(&mut self) {
        let now = Instant::now();
        self.seconds.push((now - self.last).as_secs_f64());
        self.last = now;
    }
}

/// What one training run measured.
struct Run {
    losses: Vec<f32>,
    peak_bytes: u64,
    stats: dtr::Stats,
    seconds: f64,
    step_seconds: Vec<f64>,
}

fn train_once<B: Backend, M: Model>(
    backend: B,
    model: &M,
    args: &RunArgs,
    budget: Option<u64>,
    record: Option<&PathBuf>,
) -> dtr::Result<Run> {
    let config = Config::default()
        .with_heuristic(args.policy.clone())
        .with_budget(budget.into())
        .with_restore(args.restore)
        .with_memory(args.memory);
    let session = Session::new(backend, config)?;
    let io = |path: &PathBuf, e: std::io::Error| {
        dtr::Error::InvalidArgument(format!("--record {}: {e}", path.display()))
    };
    if let Some(path) = record {
        let file = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| io(path, e))?);
        let recorder = dtr::trace::recorder::TraceRecorder::new(file).map_err(|e| io(path, e))?;
        session.with_interpreter(|dtr| dtr.set_observer(Box::new(recorder)));
    }
    let started = Instant::now();
    let mut laps = Laps::start();
    let losses = model.train(&session, args.steps, args.seed, &mut laps)?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(path) = record {
        session
            .with_interpreter(|dtr| dtr.finish_observer())
            .map_err(|e| io(path, e))?;
    }
    Ok(Run {
        losses,
        peak_bytes: session.memory().peak_bytes,
        stats: session.stats(),
        seconds,
        step_seconds: laps.seconds,
    })
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// An example's `main`: parses the flags, trains the model unbounded, then
/// under `--budget-ratio` of that peak on the same backend, and reports.
/// Fails unless the budgeted run stayed within its budget and its losses
/// match (bitwise on the CPU, within 1e-4 relative on the GPU).
pub fn main<M: Model>() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let model = M::parse();
    let args = model.run_args();
    let checked = if args.budget_ratio > 0.0 && args.budget_ratio.is_finite() {
        model.validate()
    } else {
        Err("--budget-ratio must be a positive number".into())
    };
    if let Err(message) = checked {
        eprintln!("error: {message}");
        return ExitCode::FAILURE;
    }
    // All cores unless --threads, as `CpuBackend::new` does.
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let result = (|| {
        let once = |budget: Option<u64>, record: Option<&PathBuf>| match args.backend {
            BackendArg::Cpu => train_once(
                CpuBackend::with_threads(threads)?,
                &model,
                args,
                budget,
                record,
            ),
            BackendArg::Wgpu => train_once(
                WgpuBackend::new(&WgpuOptions::default())?,
                &model,
                args,
                budget,
                record,
            ),
        };
        let unbounded = once(None, args.record.as_ref())?;
        let budget = (unbounded.peak_bytes as f64 * args.budget_ratio) as u64;
        let budgeted = once(Some(budget), None)?;
        Ok::<_, dtr::Error>((unbounded, budget, budgeted))
    })();
    let (unbounded, budget, budgeted) = match result {
        Ok(runs) => runs,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let matches = |a: f32, b: f32| match args.backend {
        BackendArg::Cpu => a.to_bits() == b.to_bits(),
        BackendArg::Wgpu => (a - b).abs() <= 1e-4 * a.abs().max(1.0),
    };
    let identical = unbounded.losses.len() == budgeted.losses.len()
        && unbounded
            .losses
            .iter()
            .zip(&budgeted.losses)
            .all(|(&a, &b)| matches(a, b));
    let within = budgeted.peak_bytes <= budget;
    if args.json {
        let object = json!({
            "model": model.name(),
            "backend": format!("{:?}", args.backend).to_lowercase(),
            "threads": (args.backend == BackendArg::Cpu).then_some(threads),
            "steps": args.steps,
            "policy": args.policy,
            "budget_ratio": args.budget_ratio,
            "losses": budgeted.losses,
            "baseline_losses": unbounded.losses,
            "budget_bytes": budget,
            "peak_bytes": budgeted.peak_bytes,
            "baseline_peak_bytes": unbounded.peak_bytes,
            "evictions": budgeted.stats.evictions,
            "rematerializations": budgeted.stats.rematerializations,
            "lock_relaxations": budgeted.stats.lock_relaxations,
            "overhead": budgeted.stats.overhead(),
            "wall_seconds": budgeted.seconds,
            "baseline_wall_seconds": unbounded.seconds,
            "step_seconds": budgeted.step_seconds,
            "baseline_step_seconds": unbounded.step_seconds,
            "losses_match": identical,
        });
        println!("{object}");
    } else {
        let on = match args.backend {
            BackendArg::Cpu => format!("cpu ({threads} threads)"),
            BackendArg::Wgpu => "wgpu".into(),
        };
        println!(
            "{}: {} steps on {on}, policy {}",
            model.name(),
            args.steps,
            args.policy
        );
        println!(
            "step  loss (unbounded)  loss (budget {:.2})",
            args.budget_ratio
        );
        for (step, (a, b)) in unbounded.losses.iter().zip(&budgeted.losses).enumerate() {
            println!("{step:>4}  {a:>16.6}  {b:>18.6}");
        }
        println!();
        println!("unbounded peak       {}", mib(unbounded.peak_bytes));
        println!("budget               {}", mib(budget));
        println!("budgeted peak        {}", mib(budgeted.peak_bytes));
        println!(
            "evictions            {} ({} eager)",
            budgeted.stats.evictions, budgeted.stats.eager_evictions
        );
        println!("rematerializations   {}", budgeted.stats.rematerializations);
        println!("compute overhead     {:.3}x", budgeted.stats.overhead());
        println!(
            "wall time            {:.2}s vs {:.2}s unbounded ({:.2}x)",
            budgeted.seconds,
            unbounded.seconds,
            budgeted.seconds / unbounded.seconds.max(1e-9)
        );
        let how = match args.backend {
            BackendArg::Cpu => "yes (bitwise)",
            BackendArg::Wgpu => "yes (within 1e-4)",
        };
        println!(
            "losses identical     {}",
            if identical { how } else { "NO" }
        );
    }
    if identical && within {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
