//! The CPU backend's kernels at the sizes the examples use, each on one
//! thread (`1`) and on all cores (`0`): elementwise maps, broadcasting adds,
//! reductions, softmax and matmuls, each op's result freed at once. The
//! serial/parallel size thresholds in `src/backend/cpu/parallel.rs` and
//! `matmul.rs` were read off this table.
//!
//! `cargo bench --bench cpu_kernels` (any divan flag after `--`, such as a
//! name filter: `-- softmax`).

use std::fmt;

use divan::Bencher;
use dtr::{BinaryOp, Config, CpuBackend, Interpreter, Op, ReduceOp, TensorId, UnaryOp};

fn main() {
    divan::main();
}

/// Thread counts compared: 1, and 0 for all cores (the backend's default).
const THREADS: [usize; 2] = [1, 0];

/// Elements per operand of the elementwise cases, as `[n / 64, 64]`.
const ELEMENTS: [usize; 7] = [8_192, 16_384, 32_768, 65_536, 131_072, 262_144, 1 << 20];

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5
        })
        .collect()
}

/// Times `op` on puts of `shapes` on a backend of `threads` threads.
fn bench_op(bencher: Bencher, threads: usize, shapes: &[&[usize]], op: Op) {
    let backend = match threads {
        0 => CpuBackend::new(),
        n => CpuBackend::with_threads(n).unwrap(),
    };
    let mut dtr = Interpreter::new(backend, Config::default()).unwrap();
    let inputs: Vec<TensorId> = shapes
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let n = dims.iter().product();
            dtr.put(&values(n, i as u32), dims).unwrap()
        })
        .collect();
    bencher.bench_local(|| {
        let out = dtr.apply1(op.clone(), &inputs).unwrap();
        dtr.del(out).unwrap();
    });
}

fn elementwise(bencher: Bencher, threads: usize, elements: usize, arity: usize, op: Op) {
    let dims: &[usize] = &[elements / 64, 64];
    bench_op(bencher, threads, &vec![dims; arity], op);
}

#[divan::bench(consts = THREADS, args = ELEMENTS)]
fn relu<const T: usize>(bencher: Bencher, elements: usize) {
    elementwise(bencher, T, elements, 1, Op::Unary(UnaryOp::Relu));
}

#[divan::bench(consts = THREADS, args = ELEMENTS)]
fn gelu<const T: usize>(bencher: Bencher, elements: usize) {
    elementwise(bencher, T, elements, 1, Op::Unary(UnaryOp::Gelu));
}

#[divan::bench(consts = THREADS, args = ELEMENTS)]
fn add<const T: usize>(bencher: Bencher, elements: usize) {
    elementwise(bencher, T, elements, 2, Op::Binary(BinaryOp::Add));
}

#[divan::bench(consts = THREADS, args = ELEMENTS)]
fn softmax<const T: usize>(bencher: Bencher, elements: usize) {
    elementwise(bencher, T, elements, 1, Op::Softmax { axis: -1 });
}

#[divan::bench(consts = THREADS, args = ELEMENTS)]
fn sum_over_rows<const T: usize>(bencher: Bencher, elements: usize) {
    let op = Op::Reduce {
        op: ReduceOp::Sum,
        axis: 0,
        keepdim: false,
    };
    elementwise(bencher, T, elements, 1, op);
}

/// A product `[m, k] x [k, n]`.
#[derive(Clone, Copy)]
struct Product(usize, usize, usize);

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Product(m, k, n) = *self;
        write!(f, "{m}x{k}x{n} ({} Mflop)", 2 * m * k * n / 1_000_000)
    }
}

#[divan::bench(consts = THREADS, args = [
    Product(1024, 32, 32),
    Product(1024, 32, 128),
    Product(1024, 128, 32),
    Product(1024, 128, 128),
    Product(256, 256, 256),
    Product(64, 64, 64),
])]
fn matmul<const T: usize>(bencher: Bencher, product: Product) {
    let Product(m, k, n) = product;
    bench_op(bencher, T, &[&[m, k], &[k, n]], Op::MatMul);
}
