//! Backend throughput, side by side: matmul GFLOP/s at 512³, 1024³, 2048³,
//! elementwise add GB/s, and one training step (a 6-layer MLP, forward and
//! backward) unbounded and under half its peak. Each GPU figure includes
//! one read back at the end, which is also what makes the GPU finish.
//!
//! `cargo bench --bench backends` (add `-- cpu` or `-- wgpu` for one backend)

use std::time::Instant;

use dtr::{
    Backend, BinaryOp, Config, CpuBackend, Interpreter, Op, ReduceOp, TensorId, UnaryOp,
    WgpuBackend, WgpuOptions,
};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5
        })
        .collect()
}

/// Seconds per op, from `reps` ops and one read back.
fn time_ops<B: Backend>(
    dtr: &mut Interpreter<B>,
    reps: usize,
    op: &dyn Fn(&mut Interpreter<B>) -> TensorId,
) -> f64 {
    let warm = op(dtr);
    dtr.get_value(warm).unwrap();
    dtr.del(warm).unwrap();
    let started = Instant::now();
    let mut last = None;
    for _ in 0..reps {
        if let Some(t) = last.take() {
            dtr.del(t).unwrap();
        }
        last = Some(op(dtr));
    }
    let last = last.unwrap();
    let probe = dtr
        .apply1(
            Op::Reduce {
                op: ReduceOp::Sum,
                axis: 0,
                keepdim: false,
            },
            &[last],
        )
        .unwrap();
    dtr.get_value(probe).unwrap();
    started.elapsed().as_secs_f64() / reps as f64
}

fn matmul_gflops<B: Backend>(backend: B, n: usize, reps: usize) -> f64 {
    let mut dtr = Interpreter::new(backend, Config::default()).unwrap();
    let a = dtr.put(&values(n * n, 1), &[n, n]).unwrap();
    let b = dtr.put(&values(n * n, 2), &[n, n]).unwrap();
    let seconds = time_ops(&mut dtr, reps, &|d| d.apply1(Op::MatMul, &[a, b]).unwrap());
    2.0 * (n * n * n) as f64 / seconds / 1e9
}

fn add_gbps<B: Backend>(backend: B, n: usize, reps: usize) -> f64 {
    let mut dtr = Interpreter::new(backend, Config::default()).unwrap();
    let a = dtr.put(&values(n, 1), &[n]).unwrap();
    let b = dtr.put(&values(n, 2), &[n]).unwrap();
    let seconds = time_ops(&mut dtr, reps, &|d| {
        d.apply1(Op::Binary(BinaryOp::Add), &[a, b]).unwrap()
    });
    3.0 * 4.0 * n as f64 / seconds / 1e9
}

/// One step of a 6-layer MLP (batch 1024, width 128): forward, loss, backward.
fn training_step<B: Backend>(
    dtr: &mut Interpreter<B>,
    x: TensorId,
    y: TensorId,
    weights: &[TensorId],
) -> f32 {
    let mut acts = vec![x];
    let mut pre = Vec::new();
    for (l, &w) in weights.iter().enumerate() {
        let z = dtr.apply1(Op::MatMul, &[acts[l], w]).unwrap();
        if l + 1 < weights.len() {
            acts.push(dtr.apply1(Op::Unary(UnaryOp::Relu), &[z]).unwrap());
        }
        pre.push(z);
    }
    let logits = *pre.last().unwrap();
    let loss = dtr.apply1(Op::CrossEntropy, &[logits, y]).unwrap();
    let one = dtr.apply1(Op::fill(&[], 1.0), &[]).unwrap();
    let mut grad = dtr
        .apply1(Op::CrossEntropyBackward, &[one, logits, y])
        .unwrap();
    for l in (0..weights.len()).rev() {
        if l + 1 < weights.len() {
            let g = dtr
                .apply1(Op::UnaryBackward(UnaryOp::Relu), &[grad, pre[l]])
                .unwrap();
            dtr.del(grad).unwrap();
            grad = g;
        }
        dtr.del(pre[l]).unwrap();
        let at = dtr
            .apply1(Op::Transpose { dim0: 0, dim1: 1 }, &[acts[l]])
            .unwrap();
        let gw = dtr.apply1(Op::MatMul, &[at, grad]).unwrap();
        dtr.del(at).unwrap();
        dtr.get_value(gw).unwrap();
        dtr.del(gw).unwrap();
        if l > 0 {
            let wt = dtr
                .apply1(Op::Transpose { dim0: 0, dim1: 1 }, &[weights[l]])
                .unwrap();
            let g = dtr.apply1(Op::MatMul, &[grad, wt]).unwrap();
            for t in [wt, grad, acts[l]] {
                dtr.del(t).unwrap();
            }
            grad = g;
        }
    }
    dtr.del(grad).unwrap();
    dtr.del(one).unwrap();
    let value = dtr.get_value(loss).unwrap()[0];
    dtr.del(loss).unwrap();
    value
}

/// Seconds per step, unbounded and under half the unbounded peak.
fn steps<B: Backend>(make: &dyn Fn() -> B) -> (f64, f64) {
    let (batch, width, classes, layers) = (1024, 128, 10, 6);
    let run = |budget: Option<u64>| {
        let config = Config {
            budget: budget.into(),
            ..Config::default()
        };
        let mut dtr = Interpreter::new(make(), config).unwrap();
        let x = dtr.put(&values(batch * width, 3), &[batch, width]).unwrap();
        let labels: Vec<f32> = (0..batch).map(|i| (i % classes) as f32).collect();
        let y = dtr.put(&labels, &[batch]).unwrap();
        let weights: Vec<TensorId> = (0..layers)
            .map(|l| {
                let out = if l + 1 == layers { classes } else { width };
                dtr.put(&values(width * out, l as u32), &[width, out])
                    .unwrap()
            })
            .collect();
        training_step(&mut dtr, x, y, &weights);
        let started = Instant::now();
        let reps = 3;
        for _ in 0..reps {
            training_step(&mut dtr, x, y, &weights);
        }
        (
            started.elapsed().as_secs_f64() / reps as f64,
            dtr.memory().peak_bytes,
        )
    };
    let (unbounded, peak) = run(None);
    let (budgeted, _) = run(Some(peak / 2));
    (unbounded, budgeted)
}

fn report<B: Backend>(name: &str, make: &dyn Fn() -> B) {
    for (n, reps) in [(512, 5), (1024, 3), (2048, 1)] {
        println!(
            "| {name} | matmul {n}³ | {:.2} GFLOP/s |",
            matmul_gflops(make(), n, reps)
        );
    }
    println!(
        "| {name} | add, 2²⁴ elements | {:.2} GB/s |",
        add_gbps(make(), 1 << 24, 5)
    );
    let (unbounded, budgeted) = steps(make);
    println!(
        "| {name} | MLP step, unbounded | {:.1} ms |",
        unbounded * 1e3
    );
    println!(
        "| {name} | MLP step, ½ peak | {:.1} ms ({:.2}×) |",
        budgeted * 1e3,
        budgeted / unbounded
    );
}

fn main() {
    let only = std::env::args().skip(1).find(|a| a == "cpu" || a == "wgpu");
    println!("| backend | benchmark | result |");
    println!("|---|---|---:|");
    if only.as_deref() != Some("wgpu") {
        report("cpu", &CpuBackend::new);
    }
    if only.as_deref() != Some("cpu") {
        match WgpuBackend::new(&WgpuOptions::default()) {
            Ok(backend) => {
                let name = format!("wgpu ({})", backend.adapter_name());
                drop(backend);
                report(&name, &|| {
                    WgpuBackend::new(&WgpuOptions::default()).expect("adapter found once")
                });
            }
            Err(error) => println!("| wgpu | skipped | {error} |"),
        }
    }
}
