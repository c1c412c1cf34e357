//! The runtime's own cost: time per op through the interpreter and through
//! the eager `Tensor` API on the data-free simulator (no kernels, no
//! eviction), an eager training step with and without a budget, and a deep
//! model's step on the simulator evicting by the policy or by the last
//! step's plan.
//!
//! `cargo bench --bench eager` (any divan flag after `--`, such as a name
//! filter).

use std::sync::OnceLock;

use divan::Bencher;
use dtr::eager::{nn, optim, Session, Tensor};
use dtr::{Config, CpuBackend, Interpreter, Op, ScalarOp, SimulatorBackend, TensorId};

fn main() {
    divan::main();
}

/// Tensors held throughout, eviction candidates all: the cost per op must
/// not grow with their number.
const LIVE: [usize; 2] = [0, 1_000_000];

fn add_one() -> Op {
    Op::Scalar {
        op: ScalarOp::Add,
        value: 1.0,
    }
}

/// An interpreter on the simulator holding `live` tensors (a put and a
/// chain from it), and a put of its own for the benched ops to read.
fn interpreter(eager_eviction: bool, live: usize) -> (Interpreter<SimulatorBackend>, TensorId) {
    let config = Config::default().with_eager_eviction(eager_eviction);
    let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
    let x = dtr.put(&[0.0; 16], &[16]).unwrap();
    let mut last = None;
    for _ in 0..live {
        last = Some(match last {
            None => dtr.put(&[0.0; 16], &[16]).unwrap(),
            Some(previous) => dtr.apply1(add_one(), &[previous]).unwrap(),
        });
    }
    assert_eq!(dtr.tracked_tensors(), live + 1);
    (dtr, x)
}

/// `apply_op` + `del` of a small elementwise op reading one put: each
/// result is freed at once.
#[divan::bench(args = LIVE)]
fn interpreter_op_freed_at_once(bencher: Bencher, live: usize) {
    let (mut dtr, x) = interpreter(true, live);
    bencher.bench_local(|| {
        let y = dtr.apply1(add_one(), &[x]).unwrap();
        dtr.del(y).unwrap();
    });
}

/// `apply_op` + `del` along a chain: each dropped tensor stays as history
/// of the live one (the graph grows by a node per op); with
/// `eager_eviction` each `del` also evicts.
fn chain(bencher: Bencher, eager_eviction: bool, live: usize) {
    let (mut dtr, x) = interpreter(eager_eviction, live);
    let mut previous = dtr.apply1(add_one(), &[x]).unwrap();
    bencher.bench_local(|| {
        let next = dtr.apply1(add_one(), &[previous]).unwrap();
        dtr.del(previous).unwrap();
        previous = next;
    });
}

#[divan::bench(args = LIVE)]
fn interpreter_op_chain_kept_as_history(bencher: Bencher, live: usize) {
    chain(bencher, false, live);
}

#[divan::bench(args = LIVE)]
fn interpreter_op_chain_with_eager_eviction(bencher: Bencher, live: usize) {
    chain(bencher, true, live);
}

/// An eager `Tensor` op (handle bookkeeping and drop included), with or
/// without recording autograd.
#[divan::bench(args = [false, true])]
fn eager_tensor_op(bencher: Bencher, recording_autograd: bool) {
    let session = Session::new(SimulatorBackend::new(), Config::default()).unwrap();
    let x = session.param(&[0.0; 16], &[16]).unwrap().value();
    let mut t: Tensor<SimulatorBackend> = x.add_scalar(1.0).unwrap();
    let run = || bencher.bench_local(|| t = t.add_scalar(1.0).unwrap());
    if recording_autograd {
        run();
    } else {
        session.no_grad(run);
    }
}

const BATCH: usize = 512;
const WIDTH: usize = 128;
const DEPTH: usize = 12;

/// An MLP (12 × Linear(128), batch 512, SGD) on the CPU backend.
struct Mlp {
    session: Session<CpuBackend>,
    x: Tensor<CpuBackend>,
    y: Tensor<CpuBackend>,
    layers: Vec<nn::Linear<CpuBackend>>,
}

impl Mlp {
    fn new(budget: Option<u64>) -> Mlp {
        let config = Config {
            budget: budget.into(),
            ..Config::default().with_heuristic("dtr-eq")
        };
        let session = Session::new(CpuBackend::new(), config).unwrap();
        let mut rng = session.rng(0);
        let x = session
            .tensor(&vec![0.5; BATCH * WIDTH], &[BATCH, WIDTH])
            .unwrap();
        let y = session.tensor(&vec![1.0; BATCH], &[BATCH]).unwrap();
        let layers = (0..DEPTH)
            .map(|_| nn::Linear::new(&session, WIDTH, WIDTH, &mut rng).unwrap())
            .collect();
        Mlp {
            session,
            x,
            y,
            layers,
        }
    }

    fn step(&self) {
        let params: Vec<_> = self.layers.iter().flat_map(nn::Linear::params).collect();
        let mut h = self.x.clone();
        for layer in &self.layers {
            h = layer.forward(&h).unwrap().relu().unwrap();
        }
        h.cross_entropy(&self.y).unwrap().backward().unwrap();
        optim::Sgd::new(0.01).step(&params).unwrap();
    }
}

/// The MLP's unbounded peak, from two steps.
fn mlp_peak() -> u64 {
    static PEAK: OnceLock<u64> = OnceLock::new();
    *PEAK.get_or_init(|| {
        let mlp = Mlp::new(None);
        mlp.step();
        mlp.step();
        mlp.session.memory().peak_bytes
    })
}

/// One training step, unbounded (1.0) and under half the unbounded peak.
#[divan::bench(args = [1.0, 0.5], sample_count = 10, sample_size = 1)]
fn mlp_training_step(bencher: Bencher, budget_ratio: f64) {
    let budget = (budget_ratio < 1.0).then(|| (budget_ratio * mlp_peak() as f64) as u64);
    let mlp = Mlp::new(budget);
    mlp.step(); // the first step allocates the optimiser's state
    bencher.bench_local(|| mlp.step());
}

/// A deep MLP (256 × Linear(32), batch 256, SGD) on the data-free simulator,
/// where a step costs only the runtime's own work.
fn deep_mlp(budget: Option<u64>) -> (Session<SimulatorBackend>, Vec<nn::Linear<SimulatorBackend>>) {
    let config = Config {
        budget: budget.into(),
        ..Config::default()
    };
    let session = Session::new(SimulatorBackend::new(), config).unwrap();
    let mut rng = session.rng(0);
    let layers = (0..1024)
        .map(|_| nn::Linear::new(&session, 32, 32, &mut rng).unwrap())
        .collect();
    (session, layers)
}

fn deep_mlp_step(session: &Session<SimulatorBackend>, layers: &[nn::Linear<SimulatorBackend>]) {
    let params: Vec<_> = layers.iter().flat_map(nn::Linear::params).collect();
    let mut h = session.full(&[256, 32], 0.5).unwrap();
    for layer in layers {
        h = layer.forward(&h).unwrap().relu().unwrap();
    }
    let target = session.full(&[256], 1.0).unwrap();
    h.cross_entropy(&target).unwrap().backward().unwrap();
    optim::Sgd::new(0.01).step(&params).unwrap();
}

/// One step of the deep MLP at a third of its unbounded peak, evicting by
/// the exact `dtr` policy (`false`) or by the previous step's plan
/// (`true`: each step ends with `mark_step`).
#[divan::bench(args = [false, true], sample_count = 10, sample_size = 1)]
fn deep_mlp_step_evicting_by_plan(bencher: Bencher, by_plan: bool) {
    let (session, layers) = deep_mlp(None);
    deep_mlp_step(&session, &layers);
    let budget = session.memory().peak_bytes / 3;
    let (session, layers) = deep_mlp(Some(budget));
    for _ in 0..3 {
        deep_mlp_step(&session, &layers);
        if by_plan {
            session.mark_step().unwrap();
        }
    }
    let planned = session.stats().planned_steps;
    bencher.bench_local(|| {
        deep_mlp_step(&session, &layers);
        if by_plan {
            session.mark_step().unwrap();
        }
    });
    let stats = session.stats();
    assert!(stats.evictions > 0);
    assert_eq!(stats.planned_steps > planned, by_plan, "{stats:?}");
}
