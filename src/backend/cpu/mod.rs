//! The CPU backend: f32, row-major, deterministic. The same inputs give
//! bitwise the same outputs, whatever the thread count and however the
//! threads are scheduled, so a run under any budget can be compared bit for
//! bit with the unbounded run.
//!
//! - Matrix products (matmul, batched matmul, and the products inside
//!   convolutions, which run as im2col + GEMM) use the `gemm` crate's SIMD
//!   kernels (`matmul.rs`), called single-threaded on blocks of the output
//!   chosen from the shape alone; transposed and strided operands are read
//!   in place. A convolution's weight gradient over large images runs as
//!   blocked dot products instead (`row_dots`).
//! - Elementwise ops, broadcasting and reductions (`elementwise.rs`) are
//!   slice loops built for AVX2 when the host has it; `exp` and `tanh` are
//!   branch-free polynomials that vectorise (`math.rs`).
//! - Work on large tensors is split over a thread pool the backend owns
//!   ([`CpuBackend::with_threads`]; all cores by default), once it passes a
//!   size threshold (small tensors run on the calling thread). Pieces are
//!   cut by the shape alone and partial sums combined in a fixed order
//!   (`parallel.rs`).
//!
//! GEMM picks its kernels by the host's SIMD (AVX-512, AVX2, ...): two
//! machines of different kinds may differ in the last bits; one machine
//! never does.

mod elementwise;
mod math;
mod matmul;
mod nn;
mod parallel;

use std::borrow::Cow;

use smallvec::{smallvec, SmallVec};

use super::{Backend, BufferView};
use crate::error::{Error, Result};
use crate::memory::Block;
use crate::ops::{Op, Signature};
use crate::shape::{broadcast_layout, resolve_axis, Layout};
use parallel::Threads;

/// Runs every op on the host, on a pool of threads.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    threads: Threads,
}

impl Default for CpuBackend {
    fn default() -> CpuBackend {
        CpuBackend::new()
    }
}

impl CpuBackend {
    /// A backend using every core the process may use.
    pub fn new() -> CpuBackend {
        CpuBackend::with_threads(Threads::available())
            .or_else(|_| CpuBackend::with_threads(1))
            .expect("one thread needs no pool")
    }

    /// A backend whose kernels use `threads` threads (1: all on the caller).
    /// Results do not depend on the count, only the speed does.
    ///
    /// ```
    /// use dtr::{Config, CpuBackend, Interpreter};
    /// let backend = CpuBackend::with_threads(2)?;
    /// assert_eq!(backend.threads(), 2);
    /// let dtr = Interpreter::new(backend, Config::default())?;
    /// # Ok::<(), dtr::Error>(())
    /// ```
    pub fn with_threads(threads: usize) -> Result<CpuBackend> {
        Ok(CpuBackend {
            threads: Threads::new(threads)?,
        })
    }

    /// How many threads the kernels use.
    pub fn threads(&self) -> usize {
        self.threads.count()
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn can_swap(&self) -> bool {
        true
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
        let threads = &self.threads;
        let out_dims = |i: usize| signature.outputs[i].layout.dims.as_slice();
        let input = |i: usize| packed(threads, inputs[i]);
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
            Op::Unary(u) => one(elementwise::unary(threads, *u, &input(0))),
            Op::UnaryBackward(u) => one(elementwise::unary_backward(
                threads,
                *u,
                &input(0),
                &input(1),
            )),
            Op::Scalar { op, value } => one(elementwise::scalar(threads, *op, &input(0), *value)),
            Op::Binary(b) => {
                // Both inputs read through views of the output's shape
                // (stride 0 on broadcast axes), never copied first.
                let (Some(la), Some(lb)) = (
                    broadcast_layout(inputs[0].layout, out_dims(0)),
                    broadcast_layout(inputs[1].layout, out_dims(0)),
                ) else {
                    unreachable!("shapes were checked by the signature")
                };
                one(elementwise::binary(
                    threads,
                    *b,
                    (inputs[0].buffer, &la),
                    (inputs[1].buffer, &lb),
                ))
            }
            Op::MatMul => {
                let batch = out_dims(0)[..out_dims(0).len() - 2].iter().product();
                let a = matmul::Operand::new(inputs[0].buffer, inputs[0].layout, batch);
                let b = matmul::Operand::new(inputs[1].buffer, inputs[1].layout, batch);
                one(matmul::batched(threads, &a, &b))
            }
            Op::Concat { axis } => one(concat(threads, inputs, *axis, out_dims(0))),
            Op::Reduce { op, axis, .. } => one(elementwise::reduce(
                threads,
                *op,
                &input(0),
                split_axis(inputs[0].layout, *axis),
            )),
            Op::Softmax { axis } => one(nn::softmax(
                threads,
                &input(0),
                split_axis(inputs[0].layout, *axis),
                false,
            )),
            Op::LogSoftmax { axis } => one(nn::softmax(
                threads,
                &input(0),
                split_axis(inputs[0].layout, *axis),
                true,
            )),
            Op::SoftmaxBackward { axis } => one(nn::softmax_backward(
                threads,
                &input(0),
                &input(1),
                split_axis(inputs[0].layout, *axis),
                false,
            )),
            Op::LogSoftmaxBackward { axis } => one(nn::softmax_backward(
                threads,
                &input(0),
                &input(1),
                split_axis(inputs[0].layout, *axis),
                true,
            )),
            Op::LayerNorm { eps } => {
                let d = *inputs[0].layout.dims.last().unwrap_or(&1);
                let (y, mean, rstd) =
                    nn::layer_norm(threads, &input(0), &input(1), &input(2), d, *eps);
                Ok(smallvec![Some(y), Some(mean), Some(rstd)])
            }
            Op::LayerNormBackward => {
                let d = *inputs[1].layout.dims.last().unwrap_or(&1);
                let (dx, dgamma, dbeta) = nn::layer_norm_backward(
                    threads,
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
                one(nn::conv2d(threads, &input(0), &input(1), &geometry))
            }
            Op::Conv2dBackwardData { window, .. } => {
                let geometry = nn::ConvGeometry::new(
                    out_dims(0),
                    &inputs[1].layout.dims,
                    &inputs[0].layout.dims,
                    window,
                );
                one(nn::conv2d_backward_data(
                    threads,
                    &input(0),
                    &input(1),
                    &geometry,
                ))
            }
            Op::Conv2dBackwardWeight { window, .. } => {
                let geometry = nn::ConvGeometry::new(
                    &inputs[1].layout.dims,
                    out_dims(0),
                    &inputs[0].layout.dims,
                    window,
                );
                one(nn::conv2d_backward_weight(
                    threads,
                    &input(0),
                    &input(1),
                    &geometry,
                ))
            }
            Op::MaxPool2d { kernel, window } => {
                let geometry =
                    nn::PoolGeometry::new(&inputs[0].layout.dims, out_dims(0), *kernel, window);
                one(nn::max_pool2d(threads, &input(0), &geometry))
            }
            Op::MaxPool2dBackward { kernel, window } => {
                let geometry = nn::PoolGeometry::new(
                    &inputs[1].layout.dims,
                    &inputs[0].layout.dims,
                    *kernel,
                    window,
                );
                one(nn::max_pool2d_backward(
                    threads,
                    &input(0),
                    &input(1),
                    &geometry,
                ))
            }
            Op::AvgPool2d { kernel, window } => {
                let geometry =
                    nn::PoolGeometry::new(&inputs[0].layout.dims, out_dims(0), *kernel, window);
                one(nn::avg_pool2d(threads, &input(0), &geometry))
            }
            Op::AvgPool2dBackward { kernel, window, .. } => {
                let geometry =
                    nn::PoolGeometry::new(out_dims(0), &inputs[0].layout.dims, *kernel, window);
                one(nn::avg_pool2d_backward(threads, &input(0), &geometry))
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
        Ok(packed(&self.threads, view).into_owned())
    }
}

/// The view's elements in row-major order: borrowed when already packed.
fn packed<'a>(threads: &Threads, view: BufferView<'a, Vec<f32>>) -> Cow<'a, [f32]> {
    let layout = view.layout;
    let n = layout.numel();
    if layout.is_contiguous() {
        return Cow::Borrowed(&view.buffer[layout.offset..layout.offset + n]);
    }
    Cow::Owned(elementwise::gather(threads, view.buffer, layout))
}

/// `(outer, len, inner)` of a row-major tensor split around `axis`. The
/// axis was validated by [`Op::signature`], so it is in range here.
fn split_axis(layout: &Layout, axis: isize) -> (usize, usize, usize) {
    let a = resolve_axis(axis, layout.rank()).unwrap_or(0);
    let outer = layout.dims[..a].iter().product();
    let inner = layout.dims[a + 1..].iter().product();
    (outer, layout.dims[a], inner)
}

fn concat(
    threads: &Threads,
    inputs: &[BufferView<'_, Vec<f32>>],
    axis: isize,
    out_dims: &[usize],
) -> Vec<f32> {
    let (outer, _, inner) = split_axis(&Layout::contiguous(out_dims), axis);
    let parts: Vec<(Cow<'_, [f32]>, usize)> = inputs
        .iter()
        .map(|v| (packed(threads, *v), split_axis(v.layout, axis).1 * inner))
        .collect();
    let mut out = Vec::with_capacity(out_dims.iter().product());
    for o in 0..outer {
        for (data, row) in &parts {
            out.extend_from_slice(&data[o * row..(o + 1) * row]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, ReduceOp};

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
        CpuBackend::new()
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
            CpuBackend::new()
                .read(BufferView {
                    buffer: &buffer,
                    layout: &t
                })
                .unwrap(),
            vec![1., 4., 2., 5., 3., 6.]
        );
    }
}
