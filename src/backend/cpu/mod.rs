//! The CPU reference backend: f32, row-major, single-threaded and
//! deterministic (the same inputs give bitwise the same outputs), so a run
//! under any budget can be compared bit for bit with the unbounded run.

mod nn;

use std::borrow::Cow;

use smallvec::{smallvec, SmallVec};

use super::{Backend, BufferView};
use crate::error::{Error, Result};
use crate::memory::Block;
use crate::ops::{BinaryOp, Op, ReduceOp, ScalarOp, Signature, UnaryOp};
use crate::shape::{broadcast_layout, resolve_axis, Layout};

/// Runs every op on the host.
#[derive(Debug, Default, Clone)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> CpuBackend {
        CpuBackend
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    /// The host's memory: the cgroup's limit where one is set, else the
    /// machine's total (Linux; elsewhere unknown).
    fn device_memory_bytes(&self) -> Option<u64> {
        let cgroup_limit = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok());
        cgroup_limit.or_else(|| {
            let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
            let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
    }

    fn upload(&mut self, data: &[f32], layout: &Layout, _at: Option<Block>) -> Result<Vec<f32>> {
        if data.len() != layout.numel() {
            return Err(Error::InvalidArgument(format!(
                "{} values given for a tensor of shape {:?} ({} elements)",
                data.len(),
                layout.dims.as_slice(),
                layout.numel()
            )));
        }
        Ok(data.to_vec())
    }

    fn allocate(&mut self, layout: &Layout, _bytes: u64, _at: Option<Block>) -> Result<Vec<f32>> {
        Ok(vec![0.0; layout.numel()])
    }

    fn execute(
        &mut self,
        op: &Op,
        inputs: &[BufferView<'_, Vec<f32>>],
        signature: &Signature,
        _at: Option<&[Block]>,
    ) -> Result<SmallVec<[Option<Vec<f32>>; 2]>> {
        let out_dims = |i: usize| signature.outputs[i].layout.dims.as_slice();
        let input = |i: usize| packed(inputs[i]);
        let one = |v: Vec<f32>| Ok(smallvec![Some(v)]);
        match op {
            Op::Recorded(recorded) => Err(Error::backend(
                "cpu",
                format!(
                    "`{}` was recorded without a kernel; replay it on the simulator backend",
                    recorded.name
                ),
            )),
            Op::Transpose { .. } | Op::Slice { .. } | Op::Expand { .. } => Ok(smallvec![None]),
            Op::Reshape { .. } if signature.outputs[0].alias_of.is_some() => Ok(smallvec![None]),
            Op::Reshape { .. } | Op::Contiguous => one(input(0).into_owned()),
            Op::Fill { dims, value } => one(vec![*value; dims.iter().product()]),
            Op::Unary(u) => one(input(0).iter().map(|&x| unary(*u, x)).collect()),
            Op::UnaryBackward(u) => {
                let (grad, saved) = (input(0), input(1));
                one(grad
                    .iter()
                    .zip(saved.iter())
                    .map(|(&g, &s)| unary_backward(*u, g, s))
                    .collect())
            }
            Op::Scalar { op, value } => {
                one(input(0).iter().map(|&x| scalar(*op, x, *value)).collect())
            }
            Op::Binary(b) => one(binary(*b, inputs[0], inputs[1], out_dims(0))),
            Op::MatMul => one(matmul(inputs[0], inputs[1], out_dims(0))),
            Op::Concat { axis } => one(concat(inputs, *axis, out_dims(0))),
            Op::Reduce { op, axis, .. } => one(reduce(*op, inputs[0], *axis)),
            Op::Softmax { axis } => one(nn::softmax(
                &input(0),
                split_axis(inputs[0].layout, *axis),
                false,
            )),
            Op::LogSoftmax { axis } => one(nn::softmax(
                &input(0),
                split_axis(inputs[0].layout, *axis),
                true,
            )),
            Op::SoftmaxBackward { axis } => one(nn::softmax_backward(
                &input(0),
                &input(1),
                split_axis(inputs[0].layout, *axis),
                false,
            )),
            Op::LogSoftmaxBackward { axis } => one(nn::softmax_backward(
                &input(0),
                &input(1),
                split_axis(inputs[0].layout, *axis),
                true,
            )),
            Op::LayerNorm { eps } => {
                let d = *inputs[0].layout.dims.last().unwrap_or(&1);
                let (y, mean, rstd) = nn::layer_norm(&input(0), &input(1), &input(2), d, *eps);
                Ok(smallvec![Some(y), Some(mean), Some(rstd)])
            }
            Op::LayerNormBackward => {
                let d = *inputs[1].layout.dims.last().unwrap_or(&1);
                let (dx, dgamma, dbeta) = nn::layer_norm_backward(
                    &input(0),
                    &input(1),
                    &input(2),
                    &input(3),
                    &input(4),
                    d,
                );
                Ok(smallvec![Some(dx), Some(dgamma), Some(dbeta)])
            }
            Op::Conv2d(window) => {
                let geometry = nn::ConvGeometry::new(
                    &inputs[0].layout.dims,
                    &inputs[1].layout.dims,
                    out_dims(0),
                    window,
                );
                one(nn::conv2d(&input(0), &input(1), &geometry))
            }
            Op::Conv2dBackwardData { window, .. } => {
                let geometry = nn::ConvGeometry::new(
                    out_dims(0),
                    &inputs[1].layout.dims,
                    &inputs[0].layout.dims,
                    window,
                );
                one(nn::conv2d_backward_data(&input(0), &input(1), &geometry))
            }
            Op::Conv2dBackwardWeight { window, .. } => {
                let geometry = nn::ConvGeometry::new(
                    &inputs[1].layout.dims,
                    out_dims(0),
                    &inputs[0].layout.dims,
                    window,
                );
                one(nn::conv2d_backward_weight(&input(0), &input(1), &geometry))
            }
            Op::MaxPool2d { kernel, window } => {
                let geometry =
                    nn::PoolGeometry::new(&inputs[0].layout.dims, out_dims(0), *kernel, window);
                one(nn::max_pool2d(&input(0), &geometry))
            }
            Op::MaxPool2dBackward { kernel, window } => {
                let geometry = nn::PoolGeometry::new(
                    &inputs[1].layout.dims,
                    &inputs[0].layout.dims,
                    *kernel,
                    window,
                );
                one(nn::max_pool2d_backward(&input(0), &input(1), &geometry))
            }
            Op::AvgPool2d { kernel, window } => {
                let geometry =
                    nn::PoolGeometry::new(&inputs[0].layout.dims, out_dims(0), *kernel, window);
                one(nn::avg_pool2d(&input(0), &geometry))
            }
            Op::AvgPool2dBackward { kernel, window, .. } => {
                let geometry =
                    nn::PoolGeometry::new(out_dims(0), &inputs[0].layout.dims, *kernel, window);
                one(nn::avg_pool2d_backward(&input(0), &geometry))
            }
            Op::Embedding => {
                let d = inputs[0].layout.dims[1];
                one(nn::embedding(&input(0), &input(1), d)?)
            }
            Op::EmbeddingBackward { num_embeddings } => {
                let d = *inputs[0].layout.dims.last().unwrap_or(&1);
                one(nn::embedding_backward(
                    &input(0),
                    &input(1),
                    *num_embeddings,
                    d,
                )?)
            }
            Op::CrossEntropy => {
                let classes = inputs[0].layout.dims[1];
                one(vec![nn::cross_entropy(&input(0), &input(1), classes)?])
            }
            Op::CrossEntropyBackward => {
                let classes = inputs[1].layout.dims[1];
                let grad = input(0)[0];
                one(nn::cross_entropy_backward(
                    grad,
                    &input(1),
                    &input(2),
                    classes,
                )?)
            }
        }
    }

    fn read(&mut self, view: BufferView<'_, Vec<f32>>) -> Result<Vec<f32>> {
        Ok(packed(view).into_owned())
    }
}

/// The view's elements in row-major order: borrowed when already packed.
fn packed<'a>(view: BufferView<'a, Vec<f32>>) -> Cow<'a, [f32]> {
    let layout = view.layout;
    let n = layout.numel();
    if layout.is_contiguous() {
        return Cow::Borrowed(&view.buffer[layout.offset..layout.offset + n]);
    }
    let mut out = Vec::with_capacity(n);
    layout.for_each_index(|i| out.push(view.buffer[i]));
    Cow::Owned(out)
}

/// `(outer, len, inner)` of a row-major tensor split around `axis`. The
/// axis was validated by [`Op::signature`], so it is in range here.
fn split_axis(layout: &Layout, axis: isize) -> (usize, usize, usize) {
    let a = resolve_axis(axis, layout.rank()).unwrap_or(0);
    let outer = layout.dims[..a].iter().product();
    let inner = layout.dims[a + 1..].iter().product();
    (outer, layout.dims[a], inner)
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

fn unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// `saved` is the op's output or input, as [`UnaryOp::backward_uses_output`] says.
fn unary_backward(op: UnaryOp, grad: f32, saved: f32) -> f32 {
    match op {
        UnaryOp::Neg => -grad,
        UnaryOp::Exp => grad * saved,
        UnaryOp::Log => grad / saved,
        UnaryOp::Sqrt => grad / (2.0 * saved),
        UnaryOp::Relu => {
            if saved > 0.0 {
                grad
            } else {
                0.0
            }
        }
        UnaryOp::Gelu => {
            let x = saved;
            let t = (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh();
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
            grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
        }
        UnaryOp::Tanh => grad * (1.0 - saved * saved),
        UnaryOp::Sigmoid => grad * saved * (1.0 - saved),
    }
}

fn scalar(op: ScalarOp, x: f32, c: f32) -> f32 {
    match op {
        ScalarOp::Add => x + c,
        ScalarOp::Mul => x * c,
        ScalarOp::Pow => x.powf(c),
    }
}

fn binary(
    op: BinaryOp,
    a: BufferView<'_, Vec<f32>>,
    b: BufferView<'_, Vec<f32>>,
    out_dims: &[usize],
) -> Vec<f32> {
    let f = |x: f32, y: f32| match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
    };
    if a.layout.dims.as_slice() == out_dims && b.layout.dims.as_slice() == out_dims {
        let (a, b) = (packed(a), packed(b));
        return a.iter().zip(b.iter()).map(|(&x, &y)| f(x, y)).collect();
    }
    // Broadcast by reading both inputs through stride-0 views of the output shape.
    let (Some(la), Some(lb)) = (
        broadcast_layout(a.layout, out_dims),
        broadcast_layout(b.layout, out_dims),
    ) else {
        unreachable!("shapes were checked by the signature")
    };
    let lhs = packed(BufferView {
        buffer: a.buffer,
        layout: &la,
    });
    let rhs = packed(BufferView {
        buffer: b.buffer,
        layout: &lb,
    });
    lhs.iter().zip(rhs.iter()).map(|(&x, &y)| f(x, y)).collect()
}

fn matmul(
    a: BufferView<'_, Vec<f32>>,
    b: BufferView<'_, Vec<f32>>,
    out_dims: &[usize],
) -> Vec<f32> {
    let (ad, bd) = (&a.layout.dims, &b.layout.dims);
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch: usize = out_dims[..out_dims.len() - 2].iter().product();
    let b_batched = bd.len() > 2;
    let (a, b) = (packed(a), packed(b));
    let mut out = vec![0.0f32; batch * m * n];
    for p in 0..batch {
        let a = &a[p * m * k..(p + 1) * m * k];
        let b = if b_batched {
            &b[p * k * n..(p + 1) * k * n]
        } else {
            &b[..]
        };
        let out = &mut out[p * m * n..(p + 1) * m * n];
        // i-k-j order streams rows of b and out; the summation order is fixed.
        for i in 0..m {
            let row = &mut out[i * n..(i + 1) * n];
            for kk in 0..k {
                let x = a[i * k + kk];
                for (o, &y) in row.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                    *o += x * y;
                }
            }
        }
    }
    out
}

fn concat(inputs: &[BufferView<'_, Vec<f32>>], axis: isize, out_dims: &[usize]) -> Vec<f32> {
    let (outer, _, inner) = split_axis(&Layout::contiguous(out_dims), axis);
    let parts: Vec<(Cow<'_, [f32]>, usize)> = inputs
        .iter()
        .map(|v| (packed(*v), split_axis(v.layout, axis).1 * inner))
        .collect();
    let mut out = Vec::with_capacity(out_dims.iter().product());
    for o in 0..outer {
        for (data, row) in &parts {
            out.extend_from_slice(&data[o * row..(o + 1) * row]);
        }
    }
    out
}

fn reduce(op: ReduceOp, x: BufferView<'_, Vec<f32>>, axis: isize) -> Vec<f32> {
    let (outer, len, inner) = split_axis(x.layout, axis);
    let x = packed(x);
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let values = (0..len).map(|l| x[(o * len + l) * inner + i]);
            out.push(match op {
                ReduceOp::Sum => values.sum(),
                ReduceOp::Mean => values.sum::<f32>() / len as f32,
                ReduceOp::Max => values.fold(f32::NEG_INFINITY, f32::max),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: Op, inputs: &[(&[f32], &[usize])]) -> Vec<Vec<f32>> {
        let layouts: Vec<Layout> = inputs.iter().map(|(_, d)| Layout::contiguous(d)).collect();
        let buffers: Vec<Vec<f32>> = inputs.iter().map(|(v, _)| v.to_vec()).collect();
        let views: Vec<_> = buffers
            .iter()
            .zip(&layouts)
            .map(|(b, l)| BufferView {
                buffer: b,
                layout: l,
            })
            .collect();
        let sig = op.signature(&layouts.iter().collect::<Vec<_>>()).unwrap();
        CpuBackend
            .execute(&op, &views, &sig, None)
            .unwrap()
            .into_iter()
            .map(|b| b.unwrap())
            .collect()
    }

    #[test]
    fn matmul_small() {
        let out = run(
            Op::MatMul,
            &[
                (&[1., 2., 3., 4., 5., 6.], &[2, 3]),
                (&[1., 0., 0., 1., 1., 1.], &[3, 2]),
            ],
        );
        assert_eq!(out[0], vec![4., 5., 10., 11.]);
    }

    #[test]
    fn broadcast_add_and_reduce() {
        let out = run(
            Op::Binary(BinaryOp::Add),
            &[(&[1., 2., 3., 4.], &[2, 2]), (&[10., 20.], &[2])],
        );
        assert_eq!(out[0], vec![11., 22., 13., 24.]);
        let sum = run(
            Op::Reduce {
                op: ReduceOp::Sum,
                axis: 0,
                keepdim: false,
            },
            &[(&[1., 2., 3., 4.], &[2, 2])],
        );
        assert_eq!(sum[0], vec![4., 6.]);
        let max = run(
            Op::Reduce {
                op: ReduceOp::Max,
                axis: -1,
                keepdim: true,
            },
            &[(&[1., 5., 3., 4.], &[2, 2])],
        );
        assert_eq!(max[0], vec![5., 4.]);
    }

    #[test]
    fn concat_along_last_axis() {
        let out = run(
            Op::Concat { axis: 1 },
            &[(&[1., 2.], &[2, 1]), (&[3., 4., 5., 6.], &[2, 2])],
        );
        assert_eq!(out[0], vec![1., 3., 4., 2., 5., 6.]);
    }

    #[test]
    fn strided_views_read_correctly() {
        let buffer = vec![1., 2., 3., 4., 5., 6.];
        let t = Layout {
            dims: [3, 2][..].into(),
            strides: [1, 3][..].into(),
            offset: 0,
        };
        assert_eq!(
            CpuBackend
                .read(BufferView {
                    buffer: &buffer,
                    layout: &t
                })
                .unwrap(),
            vec![1., 4., 2., 5., 3., 6.]
        );
    }
}
