//! The runtime's own cost: time per op through the interpreter and through
//! the eager `Tensor` API on the data-free simulator (no kernels, no
//! eviction), and an eager training step with and without a budget.
//!
//! `cargo bench --bench eager`

use std::time::Instant;

use dtr::eager::{nn, optim, Session};
use dtr::{Config, CpuBackend, Interpreter, Op, ScalarOp, SimulatorBackend};

const OPS: usize = 200_000;

/// Nanoseconds per `apply_op` + `del` of a small elementwise op, unbounded.
/// `chain`: each op consumes the previous result, so every dropped tensor
/// stays as history of the live one (the graph grows by one node per op;
/// with eager eviction each `del` also evicts). Otherwise every op reads the
/// same put and its result is freed outright. `live` more tensors (a put
/// and a chain of the op from it, eviction candidates all) are held
/// throughout, so the cost can be seen not to grow with their number.
fn interpreter_ns_per_op(chain: bool, eager_eviction: bool, live: usize) -> f64 {
    let config = Config::default().with_eager_eviction(eager_eviction);
    let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
    let x = dtr.put(&[0.0; 16], &[16]).unwrap();
    let op = Op::Scalar {
        op: ScalarOp::Add,
        value: 1.0,
    };
    // A chain of their own, so that `x` keeps its few readers.
    let mut held = Vec::with_capacity(live);
    if live > 0 {
        held.push(dtr.put(&[0.0; 16], &[16]).unwrap());
    }
    while held.len() < live {
        let last = *held.last().expect("not empty");
        held.push(dtr.apply1(op.clone(), &[last]).unwrap());
    }
    assert_eq!(dtr.tracked_tensors(), live + 1);
    let started = Instant::now();
    let mut previous = dtr.apply1(op.clone(), &[x]).unwrap();
    for _ in 1..OPS {
        let next = dtr
            .apply1(op.clone(), &[if chain { previous } else { x }])
            .unwrap();
        dtr.del(previous).unwrap();
        previous = next;
    }
    let ns = started.elapsed().as_secs_f64() * 1e9 / OPS as f64;
    drop(held);
    ns
}

/// Nanoseconds per eager op (handle bookkeeping and drop included), with
/// and without autograd recording.
fn eager_ns_per_op(grad: bool) -> f64 {
    let session = Session::new(SimulatorBackend::new(), Config::default()).unwrap();
    let x = session.param(&[0.0; 16], &[16]).unwrap().value();
    let run = || {
        let started = Instant::now();
        let mut t = x.add_scalar(1.0).unwrap();
        for _ in 1..OPS / 10 {
            t = t.add_scalar(1.0).unwrap();
        }
        drop(t);
        started.elapsed().as_secs_f64() * 1e9 / (OPS / 10) as f64
    };
    if grad {
        run()
    } else {
        session.no_grad(run)
    }
}

/// Seconds for `steps` MLP training steps on the CPU, under `budget`.
fn mlp_steps(budget: Option<u64>, steps: usize) -> (f64, u64) {
    let config = Config {
        budget: budget.into(),
        ..Config::default().with_heuristic("dtr-eq")
    };
    let s = Session::new(CpuBackend::new(), config).unwrap();
    let mut rng = s.rng(0);
    let (batch, width, depth) = (512, 128, 12);
    let x = s
        .tensor(&vec![0.5; batch * width], &[batch, width])
        .unwrap();
    let y = s.tensor(&vec![1.0; batch], &[batch]).unwrap();
    let layers: Vec<_> = (0..depth)
        .map(|_| nn::Linear::new(&s, width, width, &mut rng).unwrap())
        .collect();
    let params: Vec<_> = layers.iter().flat_map(nn::Linear::params).collect();
    let sgd = optim::Sgd::new(0.01);
    let started = Instant::now();
    for _ in 0..steps {
        let mut h = x.clone();
        for layer in &layers {
            h = layer.forward(&h).unwrap().relu().unwrap();
        }
        let loss = h.cross_entropy(&y).unwrap();
        loss.backward().unwrap();
        sgd.step(&params).unwrap();
    }
    (started.elapsed().as_secs_f64(), s.memory().peak_bytes)
}

fn main() {
    println!("| what | ns per op | with 10⁶ live tensors |");
    println!("|---|---:|---:|");
    for (what, chain, eager) in [
        (
            "interpreter apply + del, freed at once (simulator)",
            false,
            true,
        ),
        (
            "interpreter apply + del, chain kept as history (simulator)",
            true,
            false,
        ),
        (
            "interpreter apply + del, chain with eager eviction (simulator)",
            true,
            true,
        ),
    ] {
        println!(
            "| {what} | {:.0} | {:.0} |",
            interpreter_ns_per_op(chain, eager, 0),
            interpreter_ns_per_op(chain, eager, 1_000_000)
        );
    }
    println!(
        "| eager Tensor op, no grad (simulator) | {:.0} | |",
        eager_ns_per_op(false)
    );
    println!(
        "| eager Tensor op, recording autograd (simulator) | {:.0} | |",
        eager_ns_per_op(true)
    );
    let (unbounded, peak) = mlp_steps(None, 5);
    let (half, _) = mlp_steps(Some(peak / 2), 5);
    println!();
    println!(
        "eager MLP step (12 × 128, batch 512, CPU): {:.1} ms unbounded, {:.1} ms under half its peak ({:.2}×)",
        unbounded * 200.0,
        half * 200.0,
        half / unbounded
    );
}
