//! Every backward op against central finite differences of its forward op.
//!
//! For a forward op `F` and a fixed random weighting `R` of its output, the
//! scalar `L(X) = Σ F(X) · R` has gradient `backward(R, …)` with respect to
//! each input. f32 central differences with step 1e-2 are accurate to about
//! 1e-3 here; the tolerance is 1e-2 relative to max(1, |gradient|).

use dtr::{Config, CpuBackend, Interpreter, Op, TensorId, UnaryOp, Window2d};
use rand::{rngs::StdRng, Rng, SeedableRng};

type Dtr = Interpreter<CpuBackend>;
type Forward<'a> = &'a dyn Fn(&mut Dtr, &[TensorId]) -> TensorId;
type Backward<'a> = &'a dyn Fn(&mut Dtr, TensorId, &[TensorId]) -> Vec<TensorId>;

struct Case {
    /// Input values and shapes.
    inputs: Vec<(Vec<f32>, Vec<usize>)>,
    /// Which inputs to differentiate.
    wrt: Vec<usize>,
}

fn random(rng: &mut StdRng, dims: &[usize], lo: f32, hi: f32) -> (Vec<f32>, Vec<usize>) {
    let n = dims.iter().product();
    (
        (0..n).map(|_| rng.gen_range(lo..hi)).collect(),
        dims.to_vec(),
    )
}

/// Values spread out so that max and ReLU stay away from their kinks.
fn distinct(rng: &mut StdRng, dims: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let n: usize = dims.iter().product();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    (
        order
            .iter()
            .map(|&k| (k as f32 - n as f32 / 2.0) * 0.1 + 0.05)
            .collect(),
        dims.to_vec(),
    )
}

fn put_all(dtr: &mut Dtr, inputs: &[(Vec<f32>, Vec<usize>)]) -> Vec<TensorId> {
    inputs.iter().map(|(v, d)| dtr.put(v, d).unwrap()).collect()
}

/// `Σ F(X) · R` in f64.
fn weighted_output(
    forward: Forward<'_>,
    inputs: &[(Vec<f32>, Vec<usize>)],
    weights: &[f32],
) -> f64 {
    let mut dtr = Interpreter::new(CpuBackend::new(), Config::default()).unwrap();
    let ids = put_all(&mut dtr, inputs);
    let out = forward(&mut dtr, &ids);
    let values = dtr.get_value(out).unwrap();
    values
        .iter()
        .zip(weights)
        .map(|(&v, &w)| v as f64 * w as f64)
        .sum()
}

/// Checks `backward(grad_out = R, inputs)` (one gradient per `wrt` entry) against finite differences.
fn check(name: &str, case: Case, forward: Forward<'_>, backward: Backward<'_>) {
    let mut rng = StdRng::seed_from_u64(7);
    let mut dtr = Interpreter::new(CpuBackend::new(), Config::default()).unwrap();
    let ids = put_all(&mut dtr, &case.inputs);
    let out = forward(&mut dtr, &ids);
    let out_dims = dtr.dims(out).unwrap().to_vec();
    let (weights, _) = random(&mut rng, &out_dims, -1.0, 1.0);
    let grad_out = dtr.put(&weights, &out_dims).unwrap();
    let grads = backward(&mut dtr, grad_out, &ids);
    assert_eq!(
        grads.len(),
        case.wrt.len(),
        "{name}: one gradient per input checked"
    );
    for (&input, &grad) in case.wrt.iter().zip(&grads) {
        let analytic = dtr.get_value(grad).unwrap();
        let (values, _) = &case.inputs[input];
        assert_eq!(
            analytic.len(),
            values.len(),
            "{name}: gradient of input {input} has the input's size"
        );
        for j in 0..values.len() {
            let eps = 1e-2f32;
            let mut shifted = case.inputs.clone();
            shifted[input].0[j] = values[j] + eps;
            let plus = weighted_output(forward, &shifted, &weights);
            shifted[input].0[j] = values[j] - eps;
            let minus = weighted_output(forward, &shifted, &weights);
            let numeric = (plus - minus) / (2.0 * eps as f64);
            let tolerance = 1e-2 * numeric.abs().max(1.0);
            assert!(
                (analytic[j] as f64 - numeric).abs() <= tolerance,
                "{name}: d/d input {input}[{j}] is {} but finite differences give {numeric}",
                analytic[j]
            );
        }
    }
}

fn apply(dtr: &mut Dtr, op: Op, inputs: &[TensorId]) -> TensorId {
    dtr.apply1(op, inputs).unwrap()
}

#[test]
fn unary_backward() {
    let mut rng = StdRng::seed_from_u64(1);
    for op in UnaryOp::ALL {
        let x = match op {
            UnaryOp::Log | UnaryOp::Sqrt => random(&mut rng, &[3, 4], 0.5, 2.0),
            UnaryOp::Relu => distinct(&mut rng, &[3, 4]),
            _ => random(&mut rng, &[3, 4], -2.0, 2.0),
        };
        check(
            op.name(),
            Case {
                inputs: vec![x],
                wrt: vec![0],
            },
            &|d, x| apply(d, Op::Unary(op), &[x[0]]),
            &|d, g, x| {
                let saved = if op.backward_uses_output() {
                    apply(d, Op::Unary(op), &[x[0]])
                } else {
                    x[0]
                };
                vec![apply(d, Op::UnaryBackward(op), &[g, saved])]
            },
        );
    }
}

#[test]
fn softmax_and_log_softmax_backward() {
    let mut rng = StdRng::seed_from_u64(2);
    for axis in [-1isize, 0] {
        let x = random(&mut rng, &[3, 5], -2.0, 2.0);
        check(
            "softmax",
            Case {
                inputs: vec![x.clone()],
                wrt: vec![0],
            },
            &|d, x| apply(d, Op::Softmax { axis }, &[x[0]]),
            &|d, g, x| {
                let y = apply(d, Op::Softmax { axis }, &[x[0]]);
                vec![apply(d, Op::SoftmaxBackward { axis }, &[g, y])]
            },
        );
        check(
            "log_softmax",
            Case {
                inputs: vec![x],
                wrt: vec![0],
            },
            &|d, x| apply(d, Op::LogSoftmax { axis }, &[x[0]]),
            &|d, g, x| {
                let y = apply(d, Op::LogSoftmax { axis }, &[x[0]]);
                vec![apply(d, Op::LogSoftmaxBackward { axis }, &[g, y])]
            },
        );
    }
}

#[test]
fn layer_norm_backward() {
    let mut rng = StdRng::seed_from_u64(3);
    let inputs = vec![
        random(&mut rng, &[4, 6], -2.0, 2.0),
        random(&mut rng, &[6], 0.5, 1.5),
        random(&mut rng, &[6], -0.5, 0.5),
    ];
    check(
        "layer_norm",
        Case {
            inputs,
            wrt: vec![0, 1, 2],
        },
        &|d, x| d.apply_op(Op::LayerNorm { eps: 1e-5 }, x).unwrap()[0],
        &|d, g, x| {
            let outs = d.apply_op(Op::LayerNorm { eps: 1e-5 }, x).unwrap();
            d.apply_op(Op::LayerNormBackward, &[g, x[0], x[1], outs[1], outs[2]])
                .unwrap()
                .to_vec()
        },
    );
}

#[test]
fn conv2d_backward_data_and_weight() {
    let mut rng = StdRng::seed_from_u64(4);
    for window in [Window2d::new(1, 0), Window2d::new(2, 1)] {
        let inputs = vec![
            random(&mut rng, &[2, 3, 5, 5], -1.0, 1.0),
            random(&mut rng, &[4, 3, 3, 3], -1.0, 1.0),
        ];
        check(
            "conv2d",
            Case {
                inputs,
                wrt: vec![0, 1],
            },
            &|d, x| apply(d, Op::Conv2d(window), x),
            &|d, g, x| {
                vec![
                    apply(
                        d,
                        Op::Conv2dBackwardData {
                            window,
                            input_hw: [5, 5],
                        },
                        &[g, x[1]],
                    ),
                    apply(
                        d,
                        Op::Conv2dBackwardWeight {
                            window,
                            kernel_hw: [3, 3],
                        },
                        &[g, x[0]],
                    ),
                ]
            },
        );
    }
}

#[test]
fn pooling_backward() {
    let mut rng = StdRng::seed_from_u64(5);
    let window = Window2d::new(2, 1);
    let kernel = [3, 3];
    check(
        "max_pool2d",
        Case {
            inputs: vec![distinct(&mut rng, &[2, 2, 5, 5])],
            wrt: vec![0],
        },
        &|d, x| apply(d, Op::MaxPool2d { kernel, window }, &[x[0]]),
        &|d, g, x| {
            vec![apply(
                d,
                Op::MaxPool2dBackward { kernel, window },
                &[g, x[0]],
            )]
        },
    );
    check(
        "avg_pool2d",
        Case {
            inputs: vec![random(&mut rng, &[2, 2, 5, 5], -1.0, 1.0)],
            wrt: vec![0],
        },
        &|d, x| apply(d, Op::AvgPool2d { kernel, window }, &[x[0]]),
        &|d, g, _| {
            vec![apply(
                d,
                Op::AvgPool2dBackward {
                    kernel,
                    window,
                    input_hw: [5, 5],
                },
                &[g],
            )]
        },
    );
}

#[test]
fn embedding_and_cross_entropy_backward() {
    let mut rng = StdRng::seed_from_u64(6);
    let weight = random(&mut rng, &[5, 3], -1.0, 1.0);
    let indices = (vec![0.0, 4.0, 2.0, 4.0], vec![2, 2]);
    check(
        "embedding",
        Case {
            inputs: vec![weight, indices],
            wrt: vec![0],
        },
        &|d, x| apply(d, Op::Embedding, x),
        &|d, g, x| {
            vec![apply(
                d,
                Op::EmbeddingBackward { num_embeddings: 5 },
                &[g, x[1]],
            )]
        },
    );
    let logits = random(&mut rng, &[4, 5], -2.0, 2.0);
    let targets = (vec![1.0, 0.0, 4.0, 2.0], vec![4]);
    check(
        "cross_entropy",
        Case {
            inputs: vec![logits, targets],
            wrt: vec![0],
        },
        &|d, x| apply(d, Op::CrossEntropy, x),
        &|d, g, x| {
            vec![
                d.apply_op(Op::CrossEntropyBackward, &[g, x[0], x[1]])
                    .unwrap()[0],
            ]
        },
    );
}
