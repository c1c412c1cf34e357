#![cfg(feature = "wgpu")]
//! One test body per op and per interpreter scenario, run against every
//! backend and compared with the CPU reference.
//!
//! The GPU tests skip (saying so) when no adapter exists, unless
//! `DTR_REQUIRE_GPU=1`, which turns a missing adapter into a failure; CI sets
//! it and runs them on Mesa's software Vulkan driver.
//!
//! Tolerances follow WGSL's precision rules: + − × ÷ are correctly rounded
//! (1e-6 relative), exp / log / tanh / sigmoid / gelu / pow are accurate to a
//! few ULP (1e-5), and sums (matmul, reductions, normalisations, convolutions)
//! may add in another order (1e-4). Errors are relative to max(|reference|, 1).
//! On the CPU itself the results must be bitwise equal.

use dtr::memory::MemoryModel;
use dtr::{
    Backend, BinaryOp, Config, CpuBackend, Interpreter, Op, ReduceOp, RestoreMode, ScalarOp,
    TensorId, UnaryOp, WgpuBackend, WgpuOptions, Window2d,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

const EXACT: f32 = 1e-6;
const TRANSCENDENTAL: f32 = 1e-5;
const SUMS: f32 = 1e-4;

/// Input values and shape.
type Input = (Vec<f32>, Vec<usize>);

/// Puts the inputs' ids in, gets the tensors to read out.
type Program<'a, B> = &'a dyn Fn(&mut Interpreter<B>, &[TensorId]) -> Vec<TensorId>;

fn random(seed: u64, dims: &[usize], lo: f32, hi: f32) -> Input {
    let mut rng = StdRng::seed_from_u64(seed);
    (
        (0..dims.iter().product())
            .map(|_| rng.gen_range(lo..hi))
            .collect(),
        dims.to_vec(),
    )
}

/// Runs `program` (puts of `inputs`, then ops) and reads every output.
fn run<B: Backend>(
    dtr: &mut Interpreter<B>,
    inputs: &[Input],
    program: Program<'_, B>,
) -> Vec<Vec<f32>> {
    let ids: Vec<TensorId> = inputs.iter().map(|(v, d)| dtr.put(v, d).unwrap()).collect();
    let outputs = program(dtr, &ids);
    outputs
        .into_iter()
        .map(|t| dtr.get_value(t).unwrap())
        .collect()
}

fn apply<B: Backend>(dtr: &mut Interpreter<B>, op: Op, inputs: &[TensorId]) -> Vec<TensorId> {
    dtr.apply_op(op, inputs).unwrap().to_vec()
}

fn assert_close(name: &str, got: &[Vec<f32>], expected: &[Vec<f32>], tolerance: f32) {
    assert_eq!(got.len(), expected.len(), "{name}: output count");
    for (k, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g.len(), e.len(), "{name}: output {k} length");
        for (i, (a, b)) in g.iter().zip(e).enumerate() {
            let bound = tolerance * b.abs().max(1.0);
            assert!(
                (a - b).abs() <= bound,
                "{name}: output {k}[{i}] is {a}, the CPU gives {b} (tolerance {bound})"
            );
        }
    }
}

/// The interpreter each suite runs on.
trait Target {
    type B: Backend;
    fn make(config: Config) -> Option<Interpreter<Self::B>>;
    /// Looser than bitwise only away from the reference backend.
    fn tolerance(t: f32) -> f32;
}

struct Cpu;
impl Target for Cpu {
    type B = CpuBackend;
    fn make(config: Config) -> Option<Interpreter<CpuBackend>> {
        Some(Interpreter::new(CpuBackend::new(), config).unwrap())
    }
    fn tolerance(_: f32) -> f32 {
        0.0
    }
}

struct Gpu;
impl Target for Gpu {
    type B = WgpuBackend;
    fn make(config: Config) -> Option<Interpreter<WgpuBackend>> {
        match WgpuBackend::new(&WgpuOptions::default()) {
            Ok(backend) => Some(Interpreter::new(backend, config).unwrap()),
            Err(error) if std::env::var("DTR_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
                panic!("DTR_REQUIRE_GPU=1 but {error}")
            }
            Err(error) => {
                eprintln!("SKIPPED: {error}");
                None
            }
        }
    }
    fn tolerance(t: f32) -> f32 {
        t
    }
}

/// Runs `program` on the target and on the CPU and compares.
fn check<T: Target>(
    name: &str,
    tolerance: f32,
    inputs: &[Input],
    program: Program<'_, T::B>,
    reference: Program<'_, CpuBackend>,
) {
    let Some(mut target) = T::make(Config::default()) else {
        return;
    };
    let mut cpu = Interpreter::new(CpuBackend::new(), Config::default()).unwrap();
    let got = run(&mut target, inputs, program);
    let expected = run(&mut cpu, inputs, reference);
    assert_close(name, &got, &expected, T::tolerance(tolerance));
}

/// `check` for a program that is the same on both (a closure generic over the backend).
macro_rules! same_program {
    ($T:ty, $name:expr, $tol:expr, $inputs:expr, |$dtr:ident, $ids:ident| $body:expr) => {
        check::<$T>($name, $tol, &$inputs, &|$dtr, $ids| $body, &|$dtr, $ids| {
            $body
        })
    };
}

fn unary_ops<T: Target>() {
    for (i, op) in UnaryOp::ALL.into_iter().enumerate() {
        let positive = matches!(op, UnaryOp::Log | UnaryOp::Sqrt);
        let (lo, hi) = if positive { (0.1, 3.0) } else { (-3.0, 3.0) };
        let tol = if matches!(op, UnaryOp::Neg | UnaryOp::Relu) {
            EXACT
        } else {
            TRANSCENDENTAL
        };
        // [3, 5] takes the strided kernel, [2, 8] the vec4 one; the transposed view reads strided.
        for dims in [vec![3, 5], vec![2, 8]] {
            let inputs = [
                random(i as u64, &dims, lo, hi),
                random(50 + i as u64, &dims, -2.0, 2.0),
            ];
            same_program!(T, op.name(), tol, inputs, |d, x| {
                let y = apply(d, Op::Unary(op), &[x[0]])[0];
                let t = apply(d, Op::Transpose { dim0: 0, dim1: 1 }, &[x[0]])[0];
                let yt = apply(d, Op::Unary(op), &[t])[0];
                let saved = if op.backward_uses_output() { y } else { x[0] };
                let g = apply(d, Op::UnaryBackward(op), &[x[1], saved])[0];
                vec![y, yt, g]
            });
        }
    }
}

fn binary_and_scalar_ops<T: Target>() {
    for (i, op) in BinaryOp::ALL.into_iter().enumerate() {
        let inputs = [
            random(i as u64, &[4, 1], 0.5, 2.0),
            random(9, &[3], 0.5, 2.0),
            random(10, &[2, 8], 0.5, 2.0),
        ];
        same_program!(T, op.name(), EXACT, inputs, |d, x| {
            let broadcast = apply(d, Op::Binary(op), &[x[0], x[1]])[0];
            let packed = apply(d, Op::Binary(op), &[x[2], x[2]])[0];
            vec![broadcast, packed]
        });
    }
    for (i, op) in [ScalarOp::Add, ScalarOp::Mul, ScalarOp::Pow]
        .into_iter()
        .enumerate()
    {
        let inputs = [
            random(i as u64, &[3, 5], 0.5, 2.0),
            random(3, &[4, 4], 0.5, 2.0),
        ];
        let tol = if op == ScalarOp::Pow {
            TRANSCENDENTAL
        } else {
            EXACT
        };
        same_program!(T, "scalar", tol, inputs, |d, x| {
            vec![
                apply(d, Op::Scalar { op, value: 1.5 }, &[x[0]])[0],
                apply(d, Op::Scalar { op, value: -0.5 }, &[x[1]])[0],
            ]
        });
    }
    same_program!(T, "fill", EXACT, [], |d, _x| vec![
        apply(d, Op::fill(&[3, 7], 2.5), &[])[0]
    ]);
}

fn views_and_layout_ops<T: Target>() {
    let inputs = [
        random(1, &[4, 6], -1.0, 1.0),
        random(2, &[2, 6], -1.0, 1.0),
        random(3, &[6], -1.0, 1.0),
    ];
    same_program!(T, "views", EXACT, inputs, |d, x| {
        let t = apply(d, Op::Transpose { dim0: 0, dim1: 1 }, &[x[0]])[0];
        let packed = apply(d, Op::Contiguous, &[t])[0];
        let sliced = apply(
            d,
            Op::Slice {
                axis: 1,
                start: 1,
                end: 5,
            },
            &[x[0]],
        )[0];
        let reshaped = apply(d, Op::reshape(&[2, 8]), &[sliced])[0];
        let expanded = apply(d, Op::expand(&[4, 6]), &[x[2]])[0];
        let summed = apply(d, Op::Binary(BinaryOp::Add), &[expanded, x[0]])[0];
        let rows = apply(d, Op::Concat { axis: 0 }, &[x[0], x[1]])[0];
        let columns = apply(d, Op::Concat { axis: 1 }, &[t, t])[0];
        vec![t, packed, sliced, reshaped, summed, rows, columns]
    });
}

fn matmul_and_reductions<T: Target>() {
    let inputs = [
        random(1, &[5, 7], -1.0, 1.0),
        random(2, &[7, 3], -1.0, 1.0),
        random(3, &[2, 5, 7], -1.0, 1.0),
        random(4, &[2, 7, 3], -1.0, 1.0),
    ];
    same_program!(T, "matmul", SUMS, inputs, |d, x| {
        let plain = apply(d, Op::MatMul, &[x[0], x[1]])[0];
        let shared = apply(d, Op::MatMul, &[x[2], x[1]])[0];
        let batched = apply(d, Op::MatMul, &[x[2], x[3]])[0];
        let at = apply(d, Op::Transpose { dim0: 0, dim1: 1 }, &[x[1]])[0];
        let bt = apply(d, Op::Transpose { dim0: 0, dim1: 1 }, &[x[0]])[0];
        let viewed = apply(d, Op::MatMul, &[at, bt])[0];
        vec![plain, shared, batched, viewed]
    });
    let inputs = [random(5, &[3, 300, 2], -1.0, 1.0)];
    same_program!(T, "reductions", SUMS, inputs, |d, x| {
        let mut outs = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            for (axis, keepdim) in [(0, false), (1, true), (-1, false)] {
                outs.push(apply(d, Op::Reduce { op, axis, keepdim }, &[x[0]])[0]);
            }
        }
        outs
    });
}

fn normalisations<T: Target>() {
    let inputs = [
        random(1, &[4, 300], -3.0, 3.0),
        random(2, &[4, 300], -1.0, 1.0),
    ];
    same_program!(T, "softmax", SUMS, inputs, |d, x| {
        let mut outs = Vec::new();
        for axis in [-1, 0] {
            let s = apply(d, Op::Softmax { axis }, &[x[0]])[0];
            let l = apply(d, Op::LogSoftmax { axis }, &[x[0]])[0];
            outs.push(apply(d, Op::SoftmaxBackward { axis }, &[x[1], s])[0]);
            outs.push(apply(d, Op::LogSoftmaxBackward { axis }, &[x[1], l])[0]);
            outs.extend([s, l]);
        }
        outs
    });
    let inputs = [
        random(1, &[3, 40], -2.0, 2.0),
        random(2, &[40], 0.5, 1.5),
        random(3, &[40], -0.5, 0.5),
        random(4, &[3, 40], -1.0, 1.0),
    ];
    same_program!(T, "layer_norm", SUMS, inputs, |d, x| {
        let outs = apply(d, Op::LayerNorm { eps: 1e-5 }, &x[..3]);
        let grads = apply(
            d,
            Op::LayerNormBackward,
            &[x[3], x[0], x[1], outs[1], outs[2]],
        );
        outs.into_iter().chain(grads).collect()
    });
}

fn convolution_and_pooling<T: Target>() {
    let window = Window2d::new(2, 1);
    let inputs = [
        random(1, &[2, 3, 7, 7], -1.0, 1.0),
        random(2, &[4, 3, 3, 3], -1.0, 1.0),
        random(3, &[2, 4, 4, 4], -1.0, 1.0),
    ];
    same_program!(T, "conv2d", SUMS, inputs, |d, x| {
        vec![
            apply(d, Op::Conv2d(window), &[x[0], x[1]])[0],
            apply(
                d,
                Op::Conv2dBackwardData {
                    window,
                    input_hw: [7, 7],
                },
                &[x[2], x[1]],
            )[0],
            apply(
                d,
                Op::Conv2dBackwardWeight {
                    window,
                    kernel_hw: [3, 3],
                },
                &[x[2], x[0]],
            )[0],
        ]
    });
    let kernel = [3, 3];
    let inputs = [
        random(4, &[2, 3, 7, 7], -1.0, 1.0),
        random(5, &[2, 3, 4, 4], -1.0, 1.0),
    ];
    same_program!(T, "pooling", SUMS, inputs, |d, x| {
        vec![
            apply(d, Op::MaxPool2d { kernel, window }, &[x[0]])[0],
            apply(d, Op::AvgPool2d { kernel, window }, &[x[0]])[0],
            apply(d, Op::MaxPool2dBackward { kernel, window }, &[x[1], x[0]])[0],
            apply(
                d,
                Op::AvgPool2dBackward {
                    kernel,
                    window,
                    input_hw: [7, 7],
                },
                &[x[1]],
            )[0],
        ]
    });
}

fn lookups_and_losses<T: Target>() {
    let inputs = [
        random(1, &[6, 5], -1.0, 1.0),
        (vec![0.0, 5.0, 2.0, 5.0, 1.0, 3.0], vec![2, 3]),
        random(2, &[2, 3, 5], -1.0, 1.0),
        random(3, &[4, 6], -2.0, 2.0),
        (vec![1.0, 0.0, 5.0, 2.0], vec![4]),
        (vec![0.7], vec![]),
    ];
    same_program!(T, "lookups", SUMS, inputs, |d, x| {
        vec![
            apply(d, Op::Embedding, &[x[0], x[1]])[0],
            apply(
                d,
                Op::EmbeddingBackward { num_embeddings: 6 },
                &[x[2], x[1]],
            )[0],
            apply(d, Op::CrossEntropy, &[x[3], x[4]])[0],
            apply(d, Op::CrossEntropyBackward, &[x[5], x[3], x[4]])[0],
        ]
    });
}

fn bad_indices_are_errors<T: Target>() {
    let Some(mut dtr) = T::make(Config::default()) else {
        return;
    };
    let table = dtr.put(&[0.0; 8], &[4, 2]).unwrap();
    let index = dtr.put(&[7.0], &[1]).unwrap();
    let looked_up = dtr.apply1(Op::Embedding, &[table, index]);
    let read = looked_up.and_then(|t| dtr.get_value(t));
    assert!(read.is_err(), "an out-of-range index must be an error");
    // The backend stays usable.
    let ok = dtr.put(&[1.0, 2.0], &[2]).unwrap();
    assert_eq!(dtr.get_value(ok).unwrap(), vec![1.0, 2.0]);
}

/// DTR under a budget gives the unbounded run's values on this backend,
/// counting bytes or placing them in an arena (on the GPU: ranges of one
/// device buffer at the allocator's offsets).
fn budgeted_matches_unbounded<T: Target>(memory: MemoryModel, restore: RestoreMode) {
    let program = |d: &mut Interpreter<T::B>, x: &[TensorId]| {
        let mut h = x[0];
        let mut kept = Vec::new();
        for _ in 0..6 {
            let z = apply(d, Op::MatMul, &[h, x[1]])[0];
            h = apply(d, Op::Unary(UnaryOp::Tanh), &[z])[0];
            d.del(z).unwrap();
            // The same storage bound twice in one dispatch.
            kept.push(apply(d, Op::Binary(BinaryOp::Mul), &[h, h])[0]);
        }
        let mut total = kept[0];
        for &k in &kept[1..] {
            total = apply(d, Op::Binary(BinaryOp::Add), &[total, k])[0];
        }
        vec![total, kept[2]]
    };
    let inputs = [
        random(1, &[64, 64], -0.5, 0.5),
        random(2, &[64, 64], -0.2, 0.2),
    ];
    let Some(mut unbounded) = T::make(Config::default()) else {
        return;
    };
    let expected = run(&mut unbounded, &inputs, &program);
    let peak = unbounded.memory().peak_bytes;
    // Arena blocks are 256-byte aligned; the tensors here are 16 KiB.
    let config = Config::default()
        .with_budget_bytes(peak / 2)
        .with_memory(memory)
        .with_restore(restore);
    let Some(mut bounded) = T::make(config) else {
        return;
    };
    let got = run(&mut bounded, &inputs, &program);
    assert_eq!(
        bounded.memory().arena.is_some(),
        memory != MemoryModel::Counter
    );
    let stats = bounded.stats();
    match restore {
        RestoreMode::Swap => assert!(stats.swap_ins > 0, "the budget should force swapping"),
        _ => assert!(
            stats.rematerializations > 0,
            "the budget should force recomputation"
        ),
    }
    assert!(bounded.memory().peak_bytes <= peak / 2);
    assert_eq!(
        got, expected,
        "values under a budget differ from the unbounded run on the same backend"
    );
}

macro_rules! suite {
    ($module:ident, $target:ty) => {
        mod $module {
            use super::*;
            #[test]
            fn unary() {
                unary_ops::<$target>();
            }
            #[test]
            fn binary_and_scalar() {
                binary_and_scalar_ops::<$target>();
            }
            #[test]
            fn views_and_layout() {
                views_and_layout_ops::<$target>();
            }
            #[test]
            fn matmul_and_reduce() {
                matmul_and_reductions::<$target>();
            }
            #[test]
            fn softmax_and_layer_norm() {
                normalisations::<$target>();
            }
            #[test]
            fn conv_and_pool() {
                convolution_and_pooling::<$target>();
            }
            #[test]
            fn embedding_and_cross_entropy() {
                lookups_and_losses::<$target>();
            }
            #[test]
            fn bad_indices() {
                bad_indices_are_errors::<$target>();
            }
            #[test]
            fn budget_keeps_values() {
                budgeted_matches_unbounded::<$target>(MemoryModel::Counter, RestoreMode::Drop);
            }
            #[test]
            fn budget_keeps_values_swapping() {
                budgeted_matches_unbounded::<$target>(MemoryModel::Counter, RestoreMode::Swap);
            }
            #[test]
            fn budget_keeps_values_swapping_in_arena() {
                budgeted_matches_unbounded::<$target>(MemoryModel::arena(), RestoreMode::Swap);
            }
            #[test]
            fn budget_keeps_values_in_arena() {
                budgeted_matches_unbounded::<$target>(MemoryModel::arena(), RestoreMode::Drop);
            }
        }
    };
}

suite!(cpu, Cpu);
suite!(gpu, Gpu);

#[test]
fn a_budget_can_be_a_fraction_of_device_memory() {
    let host = CpuBackend::new()
        .device_memory_bytes()
        .expect("Linux tells the host's memory");
    assert!(host > 0);
    let dtr = Interpreter::new(
        CpuBackend::new(),
        Config::default().with_device_memory_fraction(0.25),
    )
    .unwrap();
    assert_eq!(dtr.memory().budget_bytes, Some(host / 4));

    for (config, expected) in [
        (
            Config::default().with_device_memory_fraction(0.0),
            "not in (0, 1]",
        ),
        (
            Config::default().with_device_memory_fraction(1.5),
            "not in (0, 1]",
        ),
    ] {
        let error = Interpreter::new(CpuBackend::new(), config).err().unwrap();
        assert!(error.to_string().contains(expected), "{error}");
    }
    let error = Interpreter::new(
        dtr::SimulatorBackend::new(),
        Config::default().with_device_memory_fraction(0.5),
    )
    .err()
    .unwrap();
    assert!(
        error.to_string().contains("simulator backend cannot tell"),
        "{error}"
    );

    // On Vulkan (Mesa's lavapipe in CI) wgpu-hal reads the device-local heap.
    if let Some(gpu) = Gpu::make(Config::default().with_device_memory_fraction(0.5)) {
        let total = gpu.backend().device_memory_bytes().expect("a Vulkan heap");
        assert_eq!(gpu.memory().budget_bytes, Some(total / 2));
    }
}
