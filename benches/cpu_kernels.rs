//! The CPU backend's kernels at the sizes the examples use, on 1 thread and
//! on more: microseconds per op for elementwise maps, broadcasting adds,
//! reductions, softmax and matmuls. The serial/parallel size thresholds in
//! `src/backend/cpu/parallel.rs` and `matmul.rs` were read off this table.
//!
//! `cargo bench --bench cpu_kernels` (add `-- 4` to compare 1 and 4 threads)

use std::time::Instant;

use dtr::{BinaryOp, Config, CpuBackend, Interpreter, Op, TensorId, UnaryOp};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5
        })
        .collect()
}

/// Microseconds per op: the best of 5 rounds of `reps` ops.
type Run = dyn Fn(&mut Interpreter<CpuBackend>, &[TensorId]) -> TensorId;

fn micros(threads: usize, shapes: &[&[usize]], op: &Run) -> f64 {
    let backend = CpuBackend::with_threads(threads).unwrap();
    let mut dtr = Interpreter::new(backend, Config::default()).unwrap();
    let inputs: Vec<TensorId> = shapes
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let n = dims.iter().product();
            dtr.put(&values(n, i as u32), dims).unwrap()
        })
        .collect();
    let work: usize = shapes.iter().map(|d| d.iter().product::<usize>()).sum();
    let reps = (20_000_000 / work.max(1)).clamp(5, 2000);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..reps {
            let out = op(&mut dtr, &inputs);
            dtr.del(out).unwrap();
        }
        best = best.min(started.elapsed().as_secs_f64() / reps as f64);
    }
    best * 1e6
}

fn main() {
    let threads: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or_else(|| CpuBackend::new().threads());
    let cases: Vec<(&str, Box<Run>)> = vec![
        (
            "relu",
            Box::new(|d, x| d.apply1(Op::Unary(UnaryOp::Relu), &x[..1]).unwrap()),
        ),
        (
            "gelu",
            Box::new(|d, x| d.apply1(Op::Unary(UnaryOp::Gelu), &x[..1]).unwrap()),
        ),
        (
            "add",
            Box::new(|d, x| d.apply1(Op::Binary(BinaryOp::Add), x).unwrap()),
        ),
        (
            "softmax",
            Box::new(|d, x| d.apply1(Op::Softmax { axis: -1 }, &x[..1]).unwrap()),
        ),
        (
            "sum(0)",
            Box::new(|d, x| {
                let op = Op::Reduce {
                    op: dtr::ReduceOp::Sum,
                    axis: 0,
                    keepdim: false,
                };
                d.apply1(op, &x[..1]).unwrap()
            }),
        ),
    ];
    println!("µs per op, 1 thread vs {threads} threads");
    println!(
        "{:<10} {:>9} {:>10} {:>10} {:>7}",
        "op",
        "elements",
        "1 thread",
        format!("{threads} threads"),
        "speedup"
    );
    for (name, op) in &cases {
        for n in [
            8_192usize,
            16_384,
            32_768,
            65_536,
            131_072,
            262_144,
            1 << 20,
        ] {
            let dims: &[usize] = &[n / 64, 64];
            let shapes = [dims, dims];
            let (one, many) = (
                micros(1, &shapes, op.as_ref()),
                micros(threads, &shapes, op.as_ref()),
            );
            println!(
                "{name:<10} {n:>9} {one:>10.1} {many:>10.1} {:>7.2}",
                one / many
            );
        }
    }
    println!("\nmatmul [m, k] x [k, n]");
    for (m, k, n) in [
        (1024, 32, 32),
        (1024, 32, 128),
        (1024, 128, 32),
        (1024, 128, 128),
        (256, 256, 256),
        (64, 64, 64),
    ] {
        let op = |d: &mut Interpreter<CpuBackend>, x: &[TensorId]| d.apply1(Op::MatMul, x).unwrap();
        let shapes: [&[usize]; 2] = [&[m, k], &[k, n]];
        let (one, many) = (micros(1, &shapes, &op), micros(threads, &shapes, &op));
        let flops = 2 * m * k * n;
        println!(
            "{:<22} {flops:>9} flops {one:>8.1} {many:>8.1} {:>7.2}",
            format!("{m}x{k}x{n}"),
            one / many
        );
    }
}
