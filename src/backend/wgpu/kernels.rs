//! Which WGSL kernel runs each op, with what parameters and bindings.

use super::{fail, Slice, WgpuBackend, WgpuBuffer};
use crate::backend::BufferView;
use crate::error::Result;
use crate::ops::{BinaryOp, Op, ReduceOp, ScalarOp, Signature, UnaryOp, Window2d};
use crate::shape::{broadcast_layout, resolve_axis, Layout};

/// Dims of the strided kernels' parameter block (see `elementwise.wgsl`).
const MAX_RANK: usize = 8;

/// One WGSL entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Unary,
    UnaryBackward,
    Binary,
    Scalar,
    Copy,
    Fill,
    Unary4,
    Binary4,
    Scalar4,
    MatMul,
    Reduce,
    Softmax,
    SoftmaxBackward,
    LayerNorm,
    LayerNormBackwardInput,
    LayerNormBackwardParams,
    Conv2d,
    Conv2dBackwardData,
    Conv2dBackwardWeight,
    MaxPool,
    MaxPoolBackward,
    AvgPool,
    AvgPoolBackward,
    Embedding,
    EmbeddingBackward,
    CrossEntropyRows,
    CrossEntropyBackward,
}

impl Kernel {
    /// The shader file and the sources that make its module, in order: the
    /// shared prelude, any helpers, then the file itself.
    pub fn module(self) -> (&'static str, &'static [&'static str]) {
        use Kernel::*;
        const COMMON: &str = include_str!("../../../shaders/common.wgsl");
        const REDUCE: &str = include_str!("../../../shaders/workgroup_reduce.wgsl");
        match self {
            Unary | UnaryBackward | Binary | Scalar | Copy | Fill => (
                "elementwise.wgsl",
                &[COMMON, include_str!("../../../shaders/elementwise.wgsl")],
            ),
            Unary4 | Binary4 | Scalar4 => (
                "elementwise_vec4.wgsl",
                &[
                    COMMON,
                    include_str!("../../../shaders/elementwise_vec4.wgsl"),
                ],
            ),
            MatMul => (
                "matmul.wgsl",
                &[COMMON, include_str!("../../../shaders/matmul.wgsl")],
            ),
            Reduce => (
                "reduce.wgsl",
                &[COMMON, include_str!("../../../shaders/reduce.wgsl")],
            ),
            Softmax | SoftmaxBackward => (
                "softmax.wgsl",
                &[
                    COMMON,
                    REDUCE,
                    include_str!("../../../shaders/softmax.wgsl"),
                ],
            ),
            LayerNorm | LayerNormBackwardInput | LayerNormBackwardParams => (
                "layer_norm.wgsl",
                &[
                    COMMON,
                    REDUCE,
                    include_str!("../../../shaders/layer_norm.wgsl"),
                ],
            ),
            Conv2d | Conv2dBackwardData | Conv2dBackwardWeight => (
                "conv.wgsl",
                &[COMMON, include_str!("../../../shaders/conv.wgsl")],
            ),
            MaxPool | MaxPoolBackward | AvgPool | AvgPoolBackward => (
                "pool.wgsl",
                &[COMMON, include_str!("../../../shaders/pool.wgsl")],
            ),
            Embedding | EmbeddingBackward | CrossEntropyRows | CrossEntropyBackward => (
                "lookup.wgsl",
                &[COMMON, include_str!("../../../shaders/lookup.wgsl")],
            ),
        }
    }

    pub fn entry_point(self) -> &'static str {
        use Kernel::*;
        match self {
            Unary => "unary",
            UnaryBackward => "unary_backward",
            Binary => "binary",
            Scalar => "scalar",
            Copy => "copy",
            Fill => "fill",
            Unary4 => "unary4",
            Binary4 => "binary4",
            Scalar4 => "scalar4",
            MatMul => "matmul",
            Reduce => "reduce",
            Softmax => "softmax",
            SoftmaxBackward => "softmax_backward",
            LayerNorm => "layer_norm",
            LayerNormBackwardInput => "layer_norm_backward_input",
            LayerNormBackwardParams => "layer_norm_backward_params",
            Conv2d => "conv2d",
            Conv2dBackwardData => "conv2d_backward_data",
            Conv2dBackwardWeight => "conv2d_backward_weight",
            MaxPool => "max_pool",
            MaxPoolBackward => "max_pool_backward",
            AvgPool => "avg_pool",
            AvgPoolBackward => "avg_pool_backward",
            Embedding => "embedding",
            EmbeddingBackward => "embedding_backward",
            CrossEntropyRows => "cross_entropy_rows",
            CrossEntropyBackward => "cross_entropy_backward",
        }
    }
}

/// Workgroups of 256 threads covering `n` elements, folded into two
/// dimensions past the 65,535 limit of one.
pub fn groups_for(n: u32) -> [u32; 3] {
    rows_groups(n.div_ceil(256))
}

/// One workgroup per row, folded the same way.
pub fn rows_groups(rows: u32) -> [u32; 3] {
    let x = rows.clamp(1, 65_535);
    [x, rows.div_ceil(x).max(1), 1]
}

fn to_u32(value: usize, what: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| {
        fail(format!(
            "{what} {value} does not fit the GPU's 32-bit indices"
        ))
    })
}

/// The parameter block of the strided elementwise kernels.
pub fn strided_params(
    numel: usize,
    op: u32,
    scalar: f32,
    dims: &[usize],
    a: &Layout,
    b: Option<&Layout>,
    out: Option<&Layout>,
) -> Result<Vec<u32>> {
    if dims.len() > MAX_RANK {
        return Err(fail(format!(
            "rank {} exceeds the GPU kernels' {MAX_RANK}",
            dims.len()
        )));
    }
    let mut p = vec![0u32; 39];
    p[0] = to_u32(numel, "element count")?;
    p[1] = dims.len() as u32;
    p[2] = op;
    p[3] = scalar.to_bits();
    for (i, &d) in dims.iter().enumerate() {
        p[4 + i] = to_u32(d, "dimension")?;
    }
    let mut place = |base: usize, layout: &Layout| -> Result<()> {
        for (i, &s) in layout.strides.iter().enumerate() {
            p[base + i] = to_u32(s, "stride")?;
        }
        p[base + 8] = to_u32(layout.offset, "offset")?;
        Ok(())
    };
    place(12, a)?;
    if let Some(b) = b {
        place(21, b)?;
    }
    if let Some(out) = out {
        place(30, out)?;
    }
    Ok(p)
}

fn unary_code(op: UnaryOp) -> u32 {
    match op {
        UnaryOp::Neg => 0,
        UnaryOp::Exp => 1,
        UnaryOp::Log => 2,
        UnaryOp::Sqrt => 3,
        UnaryOp::Relu => 4,
        UnaryOp::Gelu => 5,
        UnaryOp::Tanh => 6,
        UnaryOp::Sigmoid => 7,
    }
}

fn binary_code(op: BinaryOp) -> u32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    }
}

fn scalar_code(op: ScalarOp) -> u32 {
    match op {
        ScalarOp::Add => 0,
        ScalarOp::Mul => 1,
        ScalarOp::Pow => 2,
    }
}

/// Packed from element 0 with a whole number of vec4s: the fast path applies.
fn vec4_ready(layout: &Layout, dims: &[usize]) -> bool {
    layout.is_contiguous()
        && layout.offset == 0
        && layout.dims.as_slice() == dims
        && layout.numel() % 4 == 0
}

/// `(outer, len, inner)` around `axis`.
fn split(dims: &[usize], axis: isize) -> (usize, usize, usize) {
    let a = resolve_axis(axis, dims.len()).unwrap_or(0);
    (
        dims[..a].iter().product(),
        dims[a],
        dims[a + 1..].iter().product(),
    )
}

fn window_params(window: &Window2d) -> [u32; 4] {
    [
        window.stride[0] as u32,
        window.stride[1] as u32,
        window.padding[0] as u32,
        window.padding[1] as u32,
    ]
}

/// Encodes `op` writing into `outputs` (one buffer per fresh output).
pub fn encode(
    gpu: &mut WgpuBackend,
    op: &Op,
    inputs: &[BufferView<'_, WgpuBuffer>],
    signature: &Signature,
    outputs: &[Option<WgpuBuffer>],
) -> Result<()> {
    let ins: Vec<Slice> = inputs.iter().map(|v| gpu.slice(v.buffer)).collect();
    let outs: Vec<Option<Slice>> = outputs
        .iter()
        .map(|o| o.as_ref().map(|b| gpu.slice(b)))
        .collect();
    let out = |k: usize| -> &Slice { outs[k].as_ref().expect("fresh output") };
    let out_layout = &signature.outputs[0].layout;
    let out_dims: &[usize] = &out_layout.dims;
    let n = out_layout.numel();
    let n32 = to_u32(n, "element count")?;
    match op {
        Op::Recorded(recorded) => Err(fail(format!(
            "`{}` was recorded without a kernel; replay it on the simulator backend",
            recorded.name
        ))),
        Op::Transpose { .. } | Op::Slice { .. } | Op::Expand { .. } => Ok(()),
        Op::Reshape { .. } if signature.outputs[0].alias_of.is_some() => Ok(()),
        // Copying in the input's own shape writes its row-major order, which
        // is the reshaped tensor's too.
        Op::Reshape { .. } | Op::Contiguous => {
            let input = inputs[0].layout;
            gpu.copy(&ins[0], input, out(0), &Layout::contiguous(&input.dims))
        }
        Op::Fill { value, .. } => {
            gpu.dispatch(
                Kernel::Fill,
                &[n32, 0, 0, value.to_bits()],
                &[(3, out(0))],
                groups_for(n32),
            );
            Ok(())
        }
        Op::Unary(u) => {
            let a = inputs[0];
            if vec4_ready(a.layout, out_dims) {
                let params = [n32 / 4, unary_code(*u), 0];
                gpu.dispatch(
                    Kernel::Unary4,
                    &params,
                    &[(1, &ins[0]), (3, out(0))],
                    groups_for(n32 / 4),
                );
            } else {
                let params =
                    strided_params(n, unary_code(*u), 0.0, out_dims, a.layout, None, None)?;
                gpu.dispatch(
                    Kernel::Unary,
                    &params,
                    &[(1, &ins[0]), (3, out(0))],
                    groups_for(n32),
                );
            }
            Ok(())
        }
        Op::Scalar { op, value } => {
            let a = inputs[0];
            if vec4_ready(a.layout, out_dims) {
                let params = [n32 / 4, scalar_code(*op), value.to_bits()];
                gpu.dispatch(
                    Kernel::Scalar4,
                    &params,
                    &[(1, &ins[0]), (3, out(0))],
                    groups_for(n32 / 4),
                );
            } else {
                let params =
                    strided_params(n, scalar_code(*op), *value, out_dims, a.layout, None, None)?;
                gpu.dispatch(
                    Kernel::Scalar,
                    &params,
                    &[(1, &ins[0]), (3, out(0))],
                    groups_for(n32),
                );
            }
            Ok(())
        }
        Op::Binary(b) => {
            let (x, y) = (inputs[0], inputs[1]);
            if vec4_ready(x.layout, out_dims) && vec4_ready(y.layout, out_dims) {
                let params = [n32 / 4, binary_code(*b), 0];
                let bindings = [(1, &ins[0]), (2, &ins[1]), (3, out(0))];
                gpu.dispatch(Kernel::Binary4, &params, &bindings, groups_for(n32 / 4));
            } else {
                let (Some(lx), Some(ly)) = (
                    broadcast_layout(x.layout, out_dims),
                    broadcast_layout(y.layout, out_dims),
                ) else {
                    return Err(fail("operands do not broadcast"));
                };
                let params =
                    strided_params(n, binary_code(*b), 0.0, out_dims, &lx, Some(&ly), None)?;
                let bindings = [(1, &ins[0]), (2, &ins[1]), (3, out(0))];
                gpu.dispatch(Kernel::Binary, &params, &bindings, groups_for(n32));
            }
            Ok(())
        }
        Op::UnaryBackward(u) => {
            let (g, s) = (inputs[0], inputs[1]);
            let params = strided_params(
                n,
                unary_code(*u),
                0.0,
                out_dims,
                g.layout,
                Some(s.layout),
                None,
            )?;
            let bindings = [(1, &ins[0]), (2, &ins[1]), (3, out(0))];
            gpu.dispatch(Kernel::UnaryBackward, &params, &bindings, groups_for(n32));
            Ok(())
        }
        Op::Concat { axis } => {
            let target = Layout::contiguous(out_dims);
            let a = resolve_axis(*axis, out_dims.len()).unwrap_or(0);
            let mut start = 0;
            for (input, slice) in inputs.iter().zip(&ins) {
                let mut slab = target.clone();
                slab.dims[a] = input.layout.dims[a];
                slab.offset = start * target.strides[a];
                start += input.layout.dims[a];
                gpu.copy(slice, input.layout, out(0), &slab)?;
            }
            Ok(())
        }
        Op::MatMul => {
            let (ad, bd) = (&inputs[0].layout.dims, &inputs[1].layout.dims);
            let (m, k, nn) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
            let batch: usize = out_dims[..out_dims.len() - 2].iter().product();
            let b_stride = if bd.len() > 2 { k * nn } else { 0 };
            let (a, b) = (gpu.packed(inputs[0])?, gpu.packed(inputs[1])?);
            let params = [
                to_u32(m, "rows")?,
                to_u32(nn, "columns")?,
                to_u32(k, "inner size")?,
                to_u32(b_stride, "stride")?,
            ];
            let groups = [
                to_u32(nn.div_ceil(64), "tiles")?,
                to_u32(m.div_ceil(64), "tiles")?,
                to_u32(batch, "batch")?,
            ];
            gpu.dispatch(
                Kernel::MatMul,
                &params,
                &[(1, &a), (2, &b), (3, out(0))],
                groups,
            );
            Ok(())
        }
        Op::Reduce { op, axis, .. } => {
            let (outer, len, inner) = split(&inputs[0].layout.dims, *axis);
            let code = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Mean => 1,
                ReduceOp::Max => 2,
            };
            let a = gpu.packed(inputs[0])?;
            reduce(gpu, &a, out(0), (outer, len, inner), code)
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let (outer, len, inner) = split(&inputs[0].layout.dims, *axis);
            let log = matches!(op, Op::LogSoftmax { .. }) as u32;
            let a = gpu.packed(inputs[0])?;
            let params = [
                to_u32(outer, "rows")?,
                to_u32(len, "length")?,
                to_u32(inner, "columns")?,
                log,
            ];
            gpu.dispatch(
                Kernel::Softmax,
                &params,
                &[(1, &a), (3, out(0))],
                rows_groups(to_u32(outer * inner, "rows")?),
            );
            Ok(())
        }
        Op::SoftmaxBackward { axis } | Op::LogSoftmaxBackward { axis } => {
            let (outer, len, inner) = split(&inputs[0].layout.dims, *axis);
            let log = matches!(op, Op::LogSoftmaxBackward { .. }) as u32;
            let (g, y) = (gpu.packed(inputs[0])?, gpu.packed(inputs[1])?);
            let params = [
                to_u32(outer, "rows")?,
                to_u32(len, "length")?,
                to_u32(inner, "columns")?,
                log,
            ];
            let rows = rows_groups(to_u32(outer * inner, "rows")?);
            gpu.dispatch(
                Kernel::SoftmaxBackward,
                &params,
                &[(1, &g), (2, &y), (3, out(0))],
                rows,
            );
            Ok(())
        }
        Op::LayerNorm { eps } => {
            let d = *inputs[0].layout.dims.last().unwrap_or(&1);
            let rows = inputs[0].layout.numel() / d.max(1);
            let (x, gamma, beta) = (
                gpu.packed(inputs[0])?,
                gpu.packed(inputs[1])?,
                gpu.packed(inputs[2])?,
            );
            let params = [to_u32(rows, "rows")?, to_u32(d, "width")?, eps.to_bits()];
            let bindings = [
                (1, &x),
                (2, &gamma),
                (3, &beta),
                (7, out(0)),
                (8, out(1)),
                (9, out(2)),
            ];
            gpu.dispatch(
                Kernel::LayerNorm,
                &params,
                &bindings,
                rows_groups(params[0]),
            );
            Ok(())
        }
        Op::LayerNormBackward => {
            let d = *inputs[1].layout.dims.last().unwrap_or(&1);
            let rows = inputs[1].layout.numel() / d.max(1);
            let packed: Vec<Slice> = inputs
                .iter()
                .map(|v| gpu.packed(*v))
                .collect::<Result<_>>()?;
            let (dy, x, gamma, mean, rstd) =
                (&packed[0], &packed[1], &packed[2], &packed[3], &packed[4]);
            let params = [to_u32(rows, "rows")?, to_u32(d, "width")?, 0];
            let bindings = [
                (1, x),
                (2, gamma),
                (4, dy),
                (5, mean),
                (6, rstd),
                (7, out(0)),
            ];
            gpu.dispatch(
                Kernel::LayerNormBackwardInput,
                &params,
                &bindings,
                rows_groups(params[0]),
            );
            let bindings = [
                (1, x),
                (4, dy),
                (5, mean),
                (6, rstd),
                (7, out(1)),
                (8, out(2)),
            ];
            gpu.dispatch(
                Kernel::LayerNormBackwardParams,
                &params,
                &bindings,
                groups_for(params[1]),
            );
            Ok(())
        }
        Op::Conv2d(window)
        | Op::Conv2dBackwardData { window, .. }
        | Op::Conv2dBackwardWeight { window, .. } => {
            let (kernel, x_dims, w_dims, y_dims) = match op {
                Op::Conv2d(_) => (
                    Kernel::Conv2d,
                    &inputs[0].layout.dims,
                    &inputs[1].layout.dims,
                    out_dims,
                ),
                Op::Conv2dBackwardData { .. } => (
                    Kernel::Conv2dBackwardData,
                    &out_layout.dims,
                    &inputs[1].layout.dims,
                    &inputs[0].layout.dims[..],
                ),
                _ => (
                    Kernel::Conv2dBackwardWeight,
                    &inputs[1].layout.dims,
                    &out_layout.dims,
                    &inputs[0].layout.dims[..],
                ),
            };
            let mut params = Vec::with_capacity(14);
            for d in [
                x_dims[0], x_dims[1], x_dims[2], x_dims[3], w_dims[0], w_dims[2], w_dims[3],
                y_dims[2], y_dims[3],
            ] {
                params.push(to_u32(d, "dimension")?);
            }
            params.extend(window_params(window));
            params.push(n32);
            let (a, b) = (gpu.packed(inputs[0])?, gpu.packed(inputs[1])?);
            gpu.dispatch(
                kernel,
                &params,
                &[(1, &a), (2, &b), (3, out(0))],
                groups_for(n32),
            );
            Ok(())
        }
        Op::MaxPool2d { kernel, window }
        | Op::AvgPool2d { kernel, window }
        | Op::MaxPool2dBackward { kernel, window }
        | Op::AvgPool2dBackward { kernel, window, .. } => {
            let (x_dims, y_dims, which) = match op {
                Op::MaxPool2d { .. } => (&inputs[0].layout.dims[..], out_dims, Kernel::MaxPool),
                Op::AvgPool2d { .. } => (&inputs[0].layout.dims[..], out_dims, Kernel::AvgPool),
                Op::MaxPool2dBackward { .. } => (
                    out_dims,
                    &inputs[0].layout.dims[..],
                    Kernel::MaxPoolBackward,
                ),
                _ => (
                    out_dims,
                    &inputs[0].layout.dims[..],
                    Kernel::AvgPoolBackward,
                ),
            };
            let mut params = Vec::with_capacity(12);
            for d in [
                x_dims[0] * x_dims[1],
                x_dims[2],
                x_dims[3],
                y_dims[2],
                y_dims[3],
                kernel[0],
                kernel[1],
            ] {
                params.push(to_u32(d, "dimension")?);
            }
            params.extend(window_params(window));
            params.push(n32);
            let a = gpu.packed(inputs[0])?;
            match which {
                Kernel::MaxPool => gpu.dispatch(
                    which,
                    &params,
                    &[(1, &a), (2, &a), (3, out(0))],
                    groups_for(n32),
                ),
                Kernel::MaxPoolBackward => {
                    let x = gpu.packed(inputs[1])?;
                    gpu.dispatch(
                        which,
                        &params,
                        &[(1, &a), (2, &x), (3, out(0))],
                        groups_for(n32),
                    );
                }
                _ => gpu.dispatch(which, &params, &[(1, &a), (3, out(0))], groups_for(n32)),
            }
            Ok(())
        }
        Op::Embedding => {
            let (vocab, d) = (inputs[0].layout.dims[0], inputs[0].layout.dims[1]);
            let rows = inputs[1].layout.numel();
            let (weight, indices) = (gpu.packed(inputs[0])?, gpu.packed(inputs[1])?);
            let status = Slice::whole(&gpu.status);
            let params = [
                to_u32(rows, "rows")?,
                to_u32(d, "width")?,
                to_u32(vocab, "vocabulary")?,
                n32,
            ];
            gpu.dispatch(
                Kernel::Embedding,
                &params,
                &[(1, &weight), (2, &indices), (3, out(0)), (4, &status)],
                groups_for(n32),
            );
            Ok(())
        }
        Op::EmbeddingBackward { num_embeddings } => {
            let d = *inputs[0].layout.dims.last().unwrap_or(&1);
            let rows = inputs[1].layout.numel();
            let (dy, indices) = (gpu.packed(inputs[0])?, gpu.packed(inputs[1])?);
            let status = Slice::whole(&gpu.status);
            let params = [
                to_u32(rows, "rows")?,
                to_u32(d, "width")?,
                to_u32(*num_embeddings, "vocabulary")?,
                n32,
            ];
            let bindings = [(1, &dy), (2, &indices), (3, out(0)), (4, &status)];
            gpu.dispatch(
                Kernel::EmbeddingBackward,
                &params,
                &bindings,
                groups_for(n32),
            );
            Ok(())
        }
        Op::CrossEntropy => {
            let (rows, classes) = (inputs[0].layout.dims[0], inputs[0].layout.dims[1]);
            let (logits, targets) = (gpu.packed(inputs[0])?, gpu.packed(inputs[1])?);
            let scratch = gpu.buffer(rows as u64 * 4)?;
            gpu.scratch.push(scratch.clone());
            let losses = Slice::whole(&scratch);
            let status = Slice::whole(&gpu.status);
            let params = [to_u32(rows, "rows")?, to_u32(classes, "classes")?, 0, 0];
            let bindings = [(1, &logits), (2, &targets), (3, &losses), (4, &status)];
            gpu.dispatch(
                Kernel::CrossEntropyRows,
                &params,
                &bindings,
                groups_for(params[0]),
            );
            reduce(gpu, &losses, out(0), (1, rows, 1), 1)
        }
        Op::CrossEntropyBackward => {
            let (rows, classes) = (inputs[1].layout.dims[0], inputs[1].layout.dims[1]);
            let (grad, logits, targets) = (
                gpu.packed(inputs[0])?,
                gpu.packed(inputs[1])?,
                gpu.packed(inputs[2])?,
            );
            let status = Slice::whole(&gpu.status);
            let params = [to_u32(rows, "rows")?, to_u32(classes, "classes")?, 0, n32];
            let bindings = [
                (1, &logits),
                (2, &targets),
                (3, out(0)),
                (4, &status),
                (5, &grad),
            ];
            gpu.dispatch(
                Kernel::CrossEntropyBackward,
                &params,
                &bindings,
                groups_for(n32),
            );
            Ok(())
        }
    }
}

fn reduce(
    gpu: &mut WgpuBackend,
    a: &Slice,
    out: &Slice,
    (outer, len, inner): (usize, usize, usize),
    op: u32,
) -> Result<()> {
    let params = [
        to_u32(outer, "rows")?,
        to_u32(len, "length")?,
        to_u32(inner, "columns")?,
        op,
    ];
    gpu.dispatch(
        Kernel::Reduce,
        &params,
        &[(1, a), (3, out)],
        rows_groups(to_u32(outer * inner, "rows")?),
    );
    Ok(())
}
