//! Trains a multi-layer perceptron with a hand-written backward pass, first
//! unbounded to measure its peak memory, then under a fraction of that peak.
//! DTR evicts and recomputes activations so the budgeted run fits, and the
//! losses must be bitwise identical to the unbounded run.
//!
//! ```text
//! cargo run --release --example mlp -- --budget-ratio 0.5
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use clap::ValueEnum;
use dtr::{
    Backend, BinaryOp, Config, CpuBackend, Interpreter, Op, ReduceOp, ScalarOp, TensorId, UnaryOp,
    WgpuBackend, WgpuOptions,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Parser, Debug, Clone)]
#[command(about = "Train an MLP under a memory budget with DTR")]
struct Args {
    /// Budget as a fraction of the unbounded run's peak memory.
    #[arg(long, default_value_t = 0.5)]
    budget_ratio: f64,
    /// Eviction heuristic.
    #[arg(long, default_value = "dtr-eq")]
    heuristic: String,
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    features: usize,
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Number of linear layers (hidden layers + 1).
    #[arg(long, default_value_t = 6)]
    layers: usize,
    #[arg(long, default_value_t = 10)]
    classes: usize,
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the unbounded run's program as a dtr trace to this file.
    #[arg(long)]
    record: Option<std::path::PathBuf>,
    /// Where the ops run.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendArg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Cpu,
    Wgpu,
}

/// What one training run measured.
struct Run {
    losses: Vec<f32>,
    peak_bytes: u64,
    budget_bytes: Option<u64>,
    stats: dtr::Stats,
    seconds: f64,
}

fn random_values(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0) * scale).collect()
}

/// A labelled batch: labels come from a fixed random linear teacher, so the task is learnable.
fn synthetic_batch(args: &Args, rng: &mut StdRng) -> (Vec<f32>, Vec<f32>) {
    let x = random_values(rng, args.batch * args.features, 1.0);
    let teacher = random_values(rng, args.features * args.classes, 1.0);
    let labels = (0..args.batch)
        .map(|i| {
            let score = |c: usize| {
                (0..args.features)
                    .map(|f| x[i * args.features + f] * teacher[f * args.classes + c])
                    .sum::<f32>()
            };
            (0..args.classes)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0) as f32
        })
        .collect();
    (x, labels)
}

fn train<B: Backend>(
    backend: B,
    args: &Args,
    budget_bytes: Option<u64>,
    record: Option<&std::path::Path>,
) -> dtr::Result<Run> {
    let mut config = Config::default().with_heuristic(args.heuristic.clone());
    config.budget_bytes = budget_bytes;
    let mut dtr = Interpreter::new(backend, config)?;
    if let Some(path) = record {
        let io = |e: std::io::Error| {
            dtr::Error::InvalidArgument(format!("--record {}: {e}", path.display()))
        };
        let file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        dtr.set_observer(Box::new(
            dtr::trace::recorder::TraceRecorder::new(file).map_err(io)?,
        ));
    }
    let mut rng = StdRng::seed_from_u64(args.seed);
    let (x_data, y_data) = synthetic_batch(args, &mut rng);
    let x = dtr.put(&x_data, &[args.batch, args.features])?;
    let y = dtr.put(&y_data, &[args.batch])?;

    let widths: Vec<usize> = std::iter::once(args.features)
        .chain(std::iter::repeat_n(args.hidden, args.layers - 1))
        .chain(std::iter::once(args.classes))
        .collect();
    let mut weights = Vec::new();
    let mut biases = Vec::new();
    for l in 0..args.layers {
        let (fan_in, fan_out) = (widths[l], widths[l + 1]);
        let scale = (6.0 / fan_in as f32).sqrt(); // He-uniform: variance 2 / fan_in
        weights.push(dtr.put(
            &random_values(&mut rng, fan_in * fan_out, scale),
            &[fan_in, fan_out],
        )?);
        biases.push(dtr.put(&vec![0.0; fan_out], &[fan_out])?);
    }

    let started = Instant::now();
    let mut losses = Vec::new();
    for _ in 0..args.steps {
        // Forward: keep each layer's input (for its weight gradient) and
        // pre-activation (for the ReLU gradient); DTR decides what stays resident.
        let mut inputs: Vec<TensorId> = vec![x];
        let mut pre_activations = Vec::new();
        for l in 0..args.layers {
            let product = dtr.apply1(Op::MatMul, &[inputs[l], weights[l]])?;
            let z = dtr.apply1(Op::Binary(BinaryOp::Add), &[product, biases[l]])?;
            dtr.del(product)?;
            if l + 1 < args.layers {
                inputs.push(dtr.apply1(Op::Unary(UnaryOp::Relu), &[z])?);
            }
            pre_activations.push(z);
        }
        let logits = pre_activations[args.layers - 1];
        let loss = dtr.apply1(Op::CrossEntropy, &[logits, y])?;
        losses.push(dtr.get_value(loss)?[0]);

        // Backward, updating each layer once its gradients are known.
        let one = dtr.apply1(Op::fill(&[], 1.0), &[])?;
        let mut grad = dtr.apply_op(Op::CrossEntropyBackward, &[one, logits, y])?[0];
        dtr.del(one)?;
        dtr.del(loss)?;
        for l in (0..args.layers).rev() {
            if l + 1 < args.layers {
                let through_relu = dtr.apply1(
                    Op::UnaryBackward(UnaryOp::Relu),
                    &[grad, pre_activations[l]],
                )?;
                dtr.del(grad)?;
                grad = through_relu;
            }
            dtr.del(pre_activations[l])?;
            let input_t = dtr.apply1(Op::Transpose { dim0: 0, dim1: 1 }, &[inputs[l]])?;
            let grad_w = dtr.apply1(Op::MatMul, &[input_t, grad])?;
            dtr.del(input_t)?;
            let grad_b = dtr.apply1(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axis: 0,
                    keepdim: false,
                },
                &[grad],
            )?;
            let grad_input = if l > 0 {
                let weight_t = dtr.apply1(Op::Transpose { dim0: 0, dim1: 1 }, &[weights[l]])?;
                let g = dtr.apply1(Op::MatMul, &[grad, weight_t])?;
                dtr.del(weight_t)?;
                dtr.del(inputs[l])?;
                Some(g)
            } else {
                None
            };
            dtr.del(grad)?;
            weights[l] = sgd_update(&mut dtr, weights[l], grad_w, args.lr)?;
            biases[l] = sgd_update(&mut dtr, biases[l], grad_b, args.lr)?;
            if let Some(g) = grad_input {
                grad = g;
            }
        }
    }
    if let Some(path) = record {
        dtr.finish_observer().map_err(|e| {
            dtr::Error::InvalidArgument(format!("--record {}: {e}", path.display()))
        })?;
    }
    Ok(Run {
        losses,
        peak_bytes: dtr.memory().peak_bytes,
        budget_bytes,
        stats: dtr.stats().clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `param - lr · grad`, detached so the new parameter carries no history.
fn sgd_update(
    dtr: &mut Interpreter<impl Backend>,
    param: TensorId,
    grad: TensorId,
    lr: f32,
) -> dtr::Result<TensorId> {
    let step = dtr.apply1(
        Op::Scalar {
            op: ScalarOp::Mul,
            value: -lr,
        },
        &[grad],
    )?;
    let updated = dtr.apply1(Op::Binary(BinaryOp::Add), &[param, step])?;
    dtr.detach(updated)?;
    for t in [step, grad, param] {
        dtr.del(t)?;
    }
    Ok(updated)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    if args.layers == 0 || args.budget_ratio.is_nan() || args.budget_ratio <= 0.0 {
        eprintln!("error: --layers must be at least 1 and --budget-ratio positive");
        return ExitCode::FAILURE;
    }
    let result = (|| {
        // Both runs on the chosen backend: the comparison is bit for bit.
        let run = |budget: Option<u64>, record: Option<&std::path::Path>| match args.backend {
            BackendArg::Cpu => train(CpuBackend::new(), &args, budget, record),
            BackendArg::Wgpu => train(
                WgpuBackend::new(&WgpuOptions::default())?,
                &args,
                budget,
                record,
            ),
        };
        let unbounded = run(None, args.record.as_deref())?;
        let budget = (unbounded.peak_bytes as f64 * args.budget_ratio) as u64;
        let budgeted = run(Some(budget), None)?;
        Ok::<_, dtr::Error>((unbounded, budgeted))
    })();
    let (unbounded, budgeted) = match result {
        Ok(runs) => runs,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "step  loss (unbounded)  loss (budget {:.2})",
        args.budget_ratio
    );
    for (step, (a, b)) in unbounded.losses.iter().zip(&budgeted.losses).enumerate() {
        println!("{step:>4}  {a:>16.6}  {b:>18.6}");
    }
    let identical = unbounded
        .losses
        .iter()
        .zip(&budgeted.losses)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    println!();
    println!("backend              {:?}", args.backend);
    println!("heuristic            {}", args.heuristic);
    println!("unbounded peak       {}", mib(unbounded.peak_bytes));
    println!(
        "budget               {}",
        mib(budgeted.budget_bytes.unwrap_or(0))
    );
    println!("budgeted peak        {}", mib(budgeted.peak_bytes));
    println!(
        "evictions            {} ({} eager)",
        budgeted.stats.evictions, budgeted.stats.eager_evictions
    );
    println!("rematerializations   {}", budgeted.stats.rematerializations);
    println!("compute overhead     {:.3}x", budgeted.stats.overhead());
    println!(
        "wall time            {:.2}s vs {:.2}s unbounded",
        budgeted.seconds, unbounded.seconds
    );
    println!(
        "losses identical     {}",
        if identical { "yes (bitwise)" } else { "NO" }
    );
    if identical && budgeted.peak_bytes <= budgeted.budget_bytes.unwrap_or(u64::MAX) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
