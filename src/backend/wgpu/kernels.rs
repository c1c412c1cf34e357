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
pub(crate) enum Kernel {
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

/// One op being encoded: its inputs (views and GPU slices), the slices of
/// its fresh outputs, and its signature.
struct Call<'a, 'b> {
    inputs: &'a [BufferView<'b, WgpuBuffer>],
    ins: Vec<Slice>,
    outs: Vec<Option<Slice>>,
    signature: &'a Signature,
    /// Elements of the first output, as the kernels count them.
    n32: u32,
}

impl Call<'_, '_> {
    fn out(&self, k: usize) -> &Slice {
        self.outs[k].as_ref().expect("fresh output")
    }

    fn out_layout(&self) -> &Layout {
        &self.signature.outputs[0].layout
    }

    fn out_dims(&self) -> &[usize] {
        &self.out_layout().dims
    }

    fn input_dims(&self, k: usize) -> &[usize] {
        &self.inputs[k].layout.dims
    }
}

/// Encodes `op` writing into `outputs` (one buffer per fresh output): picks
/// the kernel family, whose function sets parameters and bindings.
pub fn encode(
    gpu: &mut WgpuBackend,
    op: &Op,
    inputs: &[BufferView<'_, WgpuBuffer>],
    signature: &Signature,
    outputs: &[Option<WgpuBuffer>],
) -> Result<()> {
    let call = Call {
        inputs,
        ins: inputs.iter().map(|v| gpu.slice(v.buffer)).collect(),
        outs: outputs
            .iter()
            .map(|o| o.as_ref().map(|b| gpu.slice(b)))
            .collect(),
        signature,
        n32: to_u32(signature.outputs[0].layout.numel(), "element count")?,
    };
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
            gpu.copy(
                &call.ins[0],
                input,
                call.out(0),
                &Layout::contiguous(&input.dims),
            )
        }
        Op::Concat { axis } => concat(gpu, &call, *axis),
        Op::Fill { value, .. } => {
            let params = [call.n32, 0, 0, value.to_bits()];
            gpu.dispatch(
                Kernel::Fill,
                &params,
                &[(3, call.out(0))],
                groups_for(call.n32),
            );
            Ok(())
        }
        Op::Unary(u) => map(
            gpu,
            &call,
            [Kernel::Unary4, Kernel::Unary],
            unary_code(*u),
            0.0,
        ),
        Op::Scalar { op, value } => map(
            gpu,
            &call,
            [Kernel::Scalar4, Kernel::Scalar],
            scalar_code(*op),
            *value,
        ),
        Op::Binary(b) => binary(gpu, &call, *b),
        Op::UnaryBackward(u) => {
            let (g, s) = (call.inputs[0], call.inputs[1]);
            let n = call.out_layout().numel();
            let params = strided_params(
                n,
                unary_code(*u),
                0.0,
                call.out_dims(),
                g.layout,
                Some(s.layout),
                None,
            )?;
            let bindings = [(1, &call.ins[0]), (2, &call.ins[1]), (3, call.out(0))];
            gpu.dispatch(
                Kernel::UnaryBackward,
                &params,
                &bindings,
                groups_for(call.n32),
            );
            Ok(())
        }
        Op::MatMul => matmul(gpu, &call),
        Op::Reduce { op, axis, .. } => {
            let code = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Mean => 1,
                ReduceOp::Max => 2,
            };
            let a = gpu.packed(inputs[0])?;
            reduce(gpu, &a, call.out(0), split(call.input_dims(0), *axis), code)
        }
        Op::Softmax { axis } => softmax(gpu, &call, *axis, false, false),
        Op::LogSoftmax { axis } => softmax(gpu, &call, *axis, true, false),
        Op::SoftmaxBackward { axis } => softmax(gpu, &call, *axis, false, true),
        Op::LogSoftmaxBackward { axis } => softmax(gpu, &call, *axis, true, true),
        Op::LayerNorm { eps } => layer_norm(gpu, &call, *eps),
        Op::LayerNormBackward => layer_norm_backward(gpu, &call),
        Op::Conv2d(window) => conv2d(gpu, &call, Kernel::Conv2d, window),
        Op::Conv2dBackwardData { window, .. } => {
            conv2d(gpu, &call, Kernel::Conv2dBackwardData, window)
        }
        Op::Conv2dBackwardWeight { window, .. } => {
            conv2d(gpu, &call, Kernel::Conv2dBackwardWeight, window)
        }
        Op::MaxPool2d { kernel, window } => pool2d(gpu, &call, Kernel::MaxPool, kernel, window),
        Op::AvgPool2d { kernel, window } => pool2d(gpu, &call, Kernel::AvgPool, kernel, window),
        Op::MaxPool2dBackward { kernel, window } => {
            pool2d(gpu, &call, Kernel::MaxPoolBackward, kernel, window)
        }
        Op::AvgPool2dBackward { kernel, window, .. } => {
            pool2d(gpu, &call, Kernel::AvgPoolBackward, kernel, window)
        }
        Op::Embedding => embedding(gpu, &call),
        Op::EmbeddingBackward { num_embeddings } => embedding_backward(gpu, &call, *num_embeddings),
        Op::CrossEntropy => cross_entropy(gpu, &call),
        Op::CrossEntropyBackward => cross_entropy_backward(gpu, &call),
    }
}

/// A one-input elementwise op (`code` of `kernels`' family, with `scalar`):
/// the vec4 kernel when the input is packed like the output, else strided.
fn map(
    gpu: &mut WgpuBackend,
    call: &Call<'_, '_>,
    [packed, strided]: [Kernel; 2],
    code: u32,
    scalar: f32,
) -> Result<()> {
    let (a, n32) = (call.inputs[0], call.n32);
    let bindings = [(1, &call.ins[0]), (3, call.out(0))];
    if vec4_ready(a.layout, call.out_dims()) {
        let params = [n32 / 4, code, scalar.to_bits()];
        gpu.dispatch(packed, &params, &bindings, groups_for(n32 / 4));
    } else {
        let n = call.out_layout().numel();
        let params = strided_params(n, code, scalar, call.out_dims(), a.layout, None, None)?;
        gpu.dispatch(strided, &params, &bindings, groups_for(n32));
    }
    Ok(())
}

/// A broadcasting two-input elementwise op.
fn binary(gpu: &mut WgpuBackend, call: &Call<'_, '_>, op: BinaryOp) -> Result<()> {
    let (x, y, n32) = (call.inputs[0], call.inputs[1], call.n32);
    let out_dims = call.out_dims();
    let bindings = [(1, &call.ins[0]), (2, &call.ins[1]), (3, call.out(0))];
    if vec4_ready(x.layout, out_dims) && vec4_ready(y.layout, out_dims) {
        let params = [n32 / 4, binary_code(op), 0];
        gpu.dispatch(Kernel::Binary4, &params, &bindings, groups_for(n32 / 4));
    } else {
        let (Some(lx), Some(ly)) = (
            broadcast_layout(x.layout, out_dims),
            broadcast_layout(y.layout, out_dims),
        ) else {
            return Err(fail("operands do not broadcast"));
        };
        let n = call.out_layout().numel();
        let params = strided_params(n, binary_code(op), 0.0, out_dims, &lx, Some(&ly), None)?;
        gpu.dispatch(Kernel::Binary, &params, &bindings, groups_for(n32));
    }
    Ok(())
}

/// Each input copied into its slab of the output along `axis`.
fn concat(gpu: &mut WgpuBackend, call: &Call<'_, '_>, axis: isize) -> Result<()> {
    let target = Layout::contiguous(call.out_dims());
    let a = resolve_axis(axis, target.dims.len()).unwrap_or(0);
    let mut start = 0;
    for (input, slice) in call.inputs.iter().zip(&call.ins) {
        let mut slab = target.clone();
        slab.dims[a] = input.layout.dims[a];
        slab.offset = start * target.strides[a];
        start += input.layout.dims[a];
        gpu.copy(slice, input.layout, call.out(0), &slab)?;
    }
    Ok(())
}

fn matmul(gpu: &mut WgpuBackend, call: &Call<'_, '_>) -> Result<()> {
    let (ad, bd, out_dims) = (call.input_dims(0), call.input_dims(1), call.out_dims());
    let (m, k, nn) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch: usize = out_dims[..out_dims.len() - 2].iter().product();
    let b_stride = if bd.len() > 2 { k * nn } else { 0 };
    let (a, b) = (gpu.packed(call.inputs[0])?, gpu.packed(call.inputs[1])?);
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
        &[(1, &a), (2, &b), (3, call.out(0))],
        groups,
    );
    Ok(())
}

/// Softmax or log-softmax along `axis`, or (`backward`) their gradient
/// from the output gradient and the forward result.
fn softmax(
    gpu: &mut WgpuBackend,
    call: &Call<'_, '_>,
    axis: isize,
    log: bool,
    backward: bool,
) -> Result<()> {
    let (outer, len, inner) = split(call.input_dims(0), axis);
    let params = [
        to_u32(outer, "rows")?,
        to_u32(len, "length")?,
        to_u32(inner, "columns")?,
        u32::from(log),
    ];
    let rows = rows_groups(to_u32(outer * inner, "rows")?);
    let a = gpu.packed(call.inputs[0])?;
    if backward {
        let y = gpu.packed(call.inputs[1])?;
        let bindings = [(1, &a), (2, &y), (3, call.out(0))];
        gpu.dispatch(Kernel::SoftmaxBackward, &params, &bindings, rows);
    } else {
        gpu.dispatch(Kernel::Softmax, &params, &[(1, &a), (3, call.out(0))], rows);
    }
    Ok(())
}

fn layer_norm(gpu: &mut WgpuBackend, call: &Call<'_, '_>, eps: f32) -> Result<()> {
    let d = *call.input_dims(0).last().unwrap_or(&1);
    let rows = call.inputs[0].layout.numel() / d.max(1);
    let (x, gamma, beta) = (
        gpu.packed(call.inputs[0])?,
        gpu.packed(call.inputs[1])?,
        gpu.packed(call.inputs[2])?,
    );
    let params = [to_u32(rows, "rows")?, to_u32(d, "width")?, eps.to_bits()];
    let bindings = [
        (1, &x),
        (2, &gamma),
        (3, &beta),
        (7, call.out(0)),
        (8, call.out(1)),
        (9, call.out(2)),
    ];
    gpu.dispatch(
        Kernel::LayerNorm,
        &params,
        &bindings,
        rows_groups(params[0]),
    );
    Ok(())
}

/// The input gradient (one workgroup per row), then the parameters'
/// gradients (one thread per column).
fn layer_norm_backward(gpu: &mut WgpuBackend, call: &Call<'_, '_>) -> Result<()> {
    let d = *call.input_dims(1).last().unwrap_or(&1);
    let rows = call.inputs[1].layout.numel() / d.max(1);
    let packed: Vec<Slice> = call
        .inputs
        .iter()
        .map(|v| gpu.packed(*v))
        .collect::<Result<_>>()?;
    let (dy, x, gamma, mean, rstd) = (&packed[0], &packed[1], &packed[2], &packed[3], &packed[4]);
    let params = [to_u32(rows, "rows")?, to_u32(d, "width")?, 0];
    let bindings = [
        (1, x),
        (2, gamma),
        (4, dy),
        (5, mean),
        (6, rstd),
        (7, call.out(0)),
    ];
    let kernel = Kernel::LayerNormBackwardInput;
    gpu.dispatch(kernel, &params, &bindings, rows_groups(params[0]));
    let bindings = [
        (1, x),
        (4, dy),
        (5, mean),
        (6, rstd),
        (7, call.out(1)),
        (8, call.out(2)),
    ];
    let kernel = Kernel::LayerNormBackwardParams;
    gpu.dispatch(kernel, &params, &bindings, groups_for(params[1]));
    Ok(())
}

/// A convolution or one of its gradients: the same parameters, named by
/// the forward pass's input `x`, weight `w` and output `y`.
fn conv2d(
    gpu: &mut WgpuBackend,
    call: &Call<'_, '_>,
    kernel: Kernel,
    window: &Window2d,
) -> Result<()> {
    let (x_dims, w_dims, y_dims) = match kernel {
        Kernel::Conv2d => (call.input_dims(0), call.input_dims(1), call.out_dims()),
        Kernel::Conv2dBackwardData => (call.out_dims(), call.input_dims(1), call.input_dims(0)),
        _ => (call.input_dims(1), call.out_dims(), call.input_dims(0)),
    };
    let mut params = Vec::with_capacity(14);
    for d in [
        x_dims[0], x_dims[1], x_dims[2], x_dims[3], w_dims[0], w_dims[2], w_dims[3], y_dims[2],
        y_dims[3],
    ] {
        params.push(to_u32(d, "dimension")?);
    }
    params.extend(window_params(window));
    params.push(call.n32);
    let (a, b) = (gpu.packed(call.inputs[0])?, gpu.packed(call.inputs[1])?);
    let bindings = [(1, &a), (2, &b), (3, call.out(0))];
    gpu.dispatch(kernel, &params, &bindings, groups_for(call.n32));
    Ok(())
}

/// Max or average pooling, or a gradient of one (named by the forward
/// pass's input `x` and output `y`).
fn pool2d(
    gpu: &mut WgpuBackend,
    call: &Call<'_, '_>,
    which: Kernel,
    kernel: &[usize; 2],
    window: &Window2d,
) -> Result<()> {
    let (x_dims, y_dims) = match which {
        Kernel::MaxPool | Kernel::AvgPool => (call.input_dims(0), call.out_dims()),
        _ => (call.out_dims(), call.input_dims(0)),
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
    params.push(call.n32);
    let groups = groups_for(call.n32);
    let a = gpu.packed(call.inputs[0])?;
    match which {
        Kernel::MaxPool => gpu.dispatch(
            which,
            &params,
            &[(1, &a), (2, &a), (3, call.out(0))],
            groups,
        ),
        Kernel::MaxPoolBackward => {
            let x = gpu.packed(call.inputs[1])?;
            gpu.dispatch(
                which,
                &params,
                &[(1, &a), (2, &x), (3, call.out(0))],
                groups,
            );
        }
        _ => gpu.dispatch(which, &params, &[(1, &a), (3, call.out(0))], groups),
    }
    Ok(())
}

/// Rows of a `[vocab, d]` table gathered by index; bad indices are
/// reported through the status buffer.
fn embedding(gpu: &mut WgpuBackend, call: &Call<'_, '_>) -> Result<()> {
    let (vocab, d) = (call.input_dims(0)[0], call.input_dims(0)[1]);
    let rows = call.inputs[1].layout.numel();
    let (weight, indices) = (gpu.packed(call.inputs[0])?, gpu.packed(call.inputs[1])?);
    let status = Slice::whole(&gpu.status);
    let params = [
        to_u32(rows, "rows")?,
        to_u32(d, "width")?,
        to_u32(vocab, "vocabulary")?,
        call.n32,
    ];
    let bindings = [(1, &weight), (2, &indices), (3, call.out(0)), (4, &status)];
    gpu.dispatch(Kernel::Embedding, &params, &bindings, groups_for(call.n32));
    Ok(())
}

fn embedding_backward(
    gpu: &mut WgpuBackend,
    call: &Call<'_, '_>,
    num_embeddings: usize,
) -> Result<()> {
    let d = *call.input_dims(0).last().unwrap_or(&1);
    let rows = call.inputs[1].layout.numel();
    let (dy, indices) = (gpu.packed(call.inputs[0])?, gpu.packed(call.inputs[1])?);
    let status = Slice::whole(&gpu.status);
    let params = [
        to_u32(rows, "rows")?,
        to_u32(d, "width")?,
        to_u32(num_embeddings, "vocabulary")?,
        call.n32,
    ];
    let bindings = [(1, &dy), (2, &indices), (3, call.out(0)), (4, &status)];
    gpu.dispatch(
        Kernel::EmbeddingBackward,
        &params,
        &bindings,
        groups_for(call.n32),
    );
    Ok(())
}

/// Per-row losses into scratch, then their mean.
fn cross_entropy(gpu: &mut WgpuBackend, call: &Call<'_, '_>) -> Result<()> {
    let (rows, classes) = (call.input_dims(0)[0], call.input_dims(0)[1]);
    let (logits, targets) = (gpu.packed(call.inputs[0])?, gpu.packed(call.inputs[1])?);
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
    reduce(gpu, &losses, call.out(0), (1, rows, 1), 1)
}

fn cross_entropy_backward(gpu: &mut WgpuBackend, call: &Call<'_, '_>) -> Result<()> {
    let (rows, classes) = (call.input_dims(1)[0], call.input_dims(1)[1]);
    let (grad, logits, targets) = (
        gpu.packed(call.inputs[0])?,
        gpu.packed(call.inputs[1])?,
        gpu.packed(call.inputs[2])?,
    );
    let status = Slice::whole(&gpu.status);
    let params = [
        to_u32(rows, "rows")?,
        to_u32(classes, "classes")?,
        0,
        call.n32,
    ];
    let bindings = [
        (1, &logits),
        (2, &targets),
        (3, call.out(0)),
        (4, &status),
        (5, &grad),
    ];
    gpu.dispatch(
        Kernel::CrossEntropyBackward,
        &params,
        &bindings,
        groups_for(call.n32),
    );
    Ok(())
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
