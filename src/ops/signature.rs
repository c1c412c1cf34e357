//! Shape inference and cost estimates for every [`Op`].

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Op, ReduceOp, Window2d};
use crate::error::{Error, Result};
use crate::intern::Interner;
use crate::shape::{broadcast_dims, broadcast_layout, checked_numel, resolve_axis, Dims, Layout};

/// Bytes per element; every data-carrying backend stores f32.
pub const ELEMENT_BYTES: u64 = 4;

/// What one output of an op is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OutputSpec {
    /// For a fresh storage, a contiguous layout; for a view, its layout inside
    /// the aliased input's storage.
    pub layout: Layout,
    /// `Some(i)`: a view of input `i`'s storage (size 0, no allocation).
    pub alias_of: Option<usize>,
    /// Bytes this output allocates (0 for views).
    pub bytes: u64,
}

impl OutputSpec {
    fn fresh(dims: &[usize]) -> OutputSpec {
        let layout = Layout::contiguous(dims);
        let bytes = layout.numel() as u64 * ELEMENT_BYTES;
        OutputSpec {
            layout,
            alias_of: None,
            bytes,
        }
    }

    fn view(layout: Layout, input: usize) -> OutputSpec {
        OutputSpec {
            layout,
            alias_of: Some(input),
            bytes: 0,
        }
    }

    /// Bytes this output allocates (0 for views).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// The outputs of a signature: immutable and shared, so that the many ops
/// of a program with equal outputs (every layer of a chain, every step of a
/// training loop) hold one copy (see [`OutputsInterner::intern`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Outputs(Arc<[OutputSpec]>);

/// The distinct [`Outputs`] in use, each held once.
#[derive(Debug, Default)]
pub struct OutputsInterner(Interner<[OutputSpec]>);

impl OutputsInterner {
    /// The held copy equal to `outputs`, or `outputs` itself, now held (see
    /// [`Interner::get`]).
    pub fn intern(&mut self, outputs: Outputs) -> Outputs {
        Outputs(self.0.get(&*outputs.0, || outputs.0.clone()))
    }

    /// Distinct outputs held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no outputs are held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Deref for Outputs {
    type Target = [OutputSpec];

    fn deref(&self) -> &[OutputSpec] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Outputs {
    type Item = &'a OutputSpec;
    type IntoIter = std::slice::Iter<'a, OutputSpec>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<OutputSpec> for Outputs {
    fn from_iter<I: IntoIterator<Item = OutputSpec>>(iter: I) -> Outputs {
        Outputs(iter.into_iter().collect())
    }
}

impl From<SmallVec<[OutputSpec; 2]>> for Outputs {
    fn from(outputs: SmallVec<[OutputSpec; 2]>) -> Outputs {
        outputs.into_iter().collect()
    }
}

/// The checked outputs of an op applied to given inputs, and its cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    /// What each output is, in order.
    pub outputs: Outputs,
    /// Estimated compute cost (≥ 1): FLOPs, or elements touched for memory-bound ops.
    pub cost: u64,
}

impl Signature {
    fn one(output: OutputSpec, cost: usize) -> Signature {
        Signature {
            outputs: [output].into_iter().collect(),
            cost: (cost as u64).max(1),
        }
    }

    /// Bytes that all fresh outputs together allocate.
    pub fn output_bytes(&self) -> u64 {
        self.outputs
            .iter()
            .fold(0, |sum, o| sum.saturating_add(o.bytes))
    }
}

impl Op {
    /// Number of inputs the op takes; `None` for variadic ([`Op::Concat`]).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Fill { .. } => 0,
            Op::Unary(_)
            | Op::Scalar { .. }
            | Op::Transpose { .. }
            | Op::Reshape { .. }
            | Op::Slice { .. }
            | Op::Expand { .. }
            | Op::Contiguous
            | Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. }
            | Op::AvgPool2dBackward { .. } => 1,
            Op::UnaryBackward(_)
            | Op::Binary(_)
            | Op::MatMul
            | Op::SoftmaxBackward { .. }
            | Op::LogSoftmaxBackward { .. }
            | Op::Conv2d(_)
            | Op::Conv2dBackwardData { .. }
            | Op::Conv2dBackwardWeight { .. }
            | Op::MaxPool2dBackward { .. }
            | Op::Embedding
            | Op::EmbeddingBackward { .. }
            | Op::CrossEntropy => 2,
            Op::LayerNorm { .. } | Op::CrossEntropyBackward => 3,
            Op::LayerNormBackward => 5,
            Op::Concat { .. } | Op::Recorded(_) => return None,
        })
    }

    /// Checks the inputs' layouts and describes the outputs.
    pub fn signature(&self, inputs: &[&Layout]) -> Result<Signature> {
        let name = self.name();
        let fail = |message: String| Error::shape(name.to_string(), message);
        match self.arity() {
            Some(n) if n != inputs.len() => {
                return Err(fail(format!("takes {n} inputs, got {}", inputs.len())))
            }
            None if inputs.is_empty() && matches!(self, Op::Concat { .. }) => {
                return Err(fail("needs at least one input".into()))
            }
            _ => {}
        }
        if let Op::Fill { dims, .. } | Op::Reshape { dims } | Op::Expand { dims } = self {
            if checked_numel(dims).is_none() {
                return Err(fail(format!("shape {:?} is too large", dims.as_slice())));
            }
        }
        let dims = |i: usize| -> &[usize] { &inputs[i].dims };
        let fresh = |dims: &[usize], cost: usize| Ok(Signature::one(OutputSpec::fresh(dims), cost));
        let inferred = match self {
            Op::Fill { dims, .. } => fresh(dims, dims.iter().product()),
            Op::Unary(_) | Op::Scalar { .. } | Op::Contiguous => fresh(dims(0), inputs[0].numel()),
            Op::UnaryBackward(_) => {
                same_shape(dims(0), dims(1)).and_then(|()| fresh(dims(0), 2 * inputs[0].numel()))
            }
            Op::Binary(_) => match broadcast_dims(dims(0), dims(1)) {
                Some(out) => fresh(&out, out.iter().product()),
                None => Err(format!(
                    "shapes {:?} and {:?} do not broadcast",
                    dims(0),
                    dims(1)
                )),
            },
            Op::MatMul => matmul_signature(dims(0), dims(1)),
            Op::Transpose { .. } | Op::Reshape { .. } | Op::Slice { .. } | Op::Expand { .. } => {
                view_signature(self, inputs[0])
            }
            Op::Concat { axis } => concat_signature(*axis, inputs),
            Op::Reduce { op, axis, keepdim } => axis_of(*axis, inputs[0].rank())
                .and_then(|a| reduce_signature(*op, a, *keepdim, dims(0))),
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                axis_of(*axis, inputs[0].rank()).and_then(|_| fresh(dims(0), 4 * inputs[0].numel()))
            }
            Op::SoftmaxBackward { axis } | Op::LogSoftmaxBackward { axis } => {
                axis_of(*axis, inputs[0].rank())
                    .and_then(|_| same_shape(dims(0), dims(1)))
                    .and_then(|()| fresh(dims(0), 4 * inputs[0].numel()))
            }
            Op::LayerNorm { .. } => layer_norm_signature(dims(0), dims(1), dims(2)),
            Op::LayerNormBackward => layer_norm_backward_signature(inputs),
            Op::Conv2d(_) | Op::Conv2dBackwardData { .. } | Op::Conv2dBackwardWeight { .. } => {
                conv_signature(self, dims(0), dims(1))
            }
            Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. }
            | Op::MaxPool2dBackward { .. }
            | Op::AvgPool2dBackward { .. } => pool_signature(self, inputs),
            Op::Embedding => {
                if inputs[0].rank() != 2 {
                    return Err(fail(format!(
                        "weight must be [vocab, dim], got {:?}",
                        dims(0)
                    )));
                }
                let mut out: Dims = dims(1).into();
                out.push(dims(0)[1]);
                fresh(&out, out.iter().product())
            }
            Op::EmbeddingBackward { num_embeddings } => {
                let (dy, idx) = (dims(0), dims(1));
                if dy.len() != idx.len() + 1 || dy[..idx.len()] != *idx {
                    Err(format!(
                        "grad_out {dy:?} must be indices {idx:?} plus one axis"
                    ))
                } else {
                    fresh(&[*num_embeddings, dy[dy.len() - 1]], inputs[0].numel())
                }
            }
            Op::CrossEntropy => check_cross_entropy(dims(0), dims(1))
                .and_then(|()| fresh(&[], 4 * inputs[0].numel())),
            Op::CrossEntropyBackward => {
                if !dims(0).is_empty() {
                    Err(format!("grad_loss must be a scalar, got {:?}", dims(0)))
                } else {
                    check_cross_entropy(dims(1), dims(2))
                        .and_then(|()| fresh(dims(1), 4 * inputs[1].numel()))
                }
            }
            Op::Recorded(recorded) => recorded_signature(recorded, inputs),
        };
        let mut signature = inferred.map_err(fail)?;
        if !matches!(self, Op::Recorded(_))
            && signature.outputs.iter().any(|o| o.alias_of.is_none())
        {
            let read = inputs.iter().fold(0u64, |sum, layout| {
                sum.saturating_add(layout.numel() as u64)
            });
            let written = signature.output_bytes() / ELEMENT_BYTES;
            let traffic = read
                .saturating_add(written)
                .saturating_mul(ELEMENT_TRAFFIC_COST);
            signature.cost = signature.cost.max(traffic);
        }
        Ok(signature)
    }
}

/// What moving one element through memory costs, in flops of a matrix
/// product. Elementwise ops, copies, reductions and softmax run at memory
/// speed: on this project's CPU backend about 20–25 GEMM flops' time per
/// element read or written (`cargo bench --bench cpu_kernels`: a 256³
/// matmul at ~140 GFLOP/s beside `add` at ~0.15 ns per element moved), and
/// GPUs have a similar ratio of compute to memory bandwidth. Pricing them
/// by their flops alone made recomputing attention scores and activations
/// look ~20× cheaper than it is, so an op's cost is the larger of its flops
/// and its traffic; views move nothing and keep their nominal cost.
pub const ELEMENT_TRAFFIC_COST: u64 = 24;

/// Shape inference's answer, with the problem in words when it fails.
type Inferred = std::result::Result<Signature, String>;

fn axis_of(axis: isize, rank: usize) -> std::result::Result<usize, String> {
    resolve_axis(axis, rank).ok_or_else(|| format!("axis {axis} is out of range for rank {rank}"))
}

fn same_shape(a: &[usize], b: &[usize]) -> std::result::Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("shapes {a:?} and {b:?} must be equal"))
    }
}

/// Transpose, reshape, slice and expand: views of their input where the
/// layout allows (a reshape of a non-contiguous tensor copies).
fn view_signature(op: &Op, input: &Layout) -> Inferred {
    let view = |layout: Layout| Ok(Signature::one(OutputSpec::view(layout, 0), 1));
    match op {
        Op::Transpose { dim0, dim1 } => {
            let (a, b) = (axis_of(*dim0, input.rank())?, axis_of(*dim1, input.rank())?);
            let mut layout = input.clone();
            layout.dims.swap(a, b);
            layout.strides.swap(a, b);
            view(layout)
        }
        Op::Reshape { dims: target } => {
            let numel: usize = target.iter().product();
            if numel != input.numel() {
                return Err(format!(
                    "cannot reshape {:?} ({} elements) to {:?} ({numel} elements)",
                    input.dims.as_slice(),
                    input.numel(),
                    target.as_slice()
                ));
            }
            if input.is_contiguous() {
                let mut layout = Layout::contiguous(target);
                layout.offset = input.offset;
                view(layout)
            } else {
                Ok(Signature::one(OutputSpec::fresh(target), numel))
            }
        }
        Op::Slice { axis, start, end } => {
            let a = axis_of(*axis, input.rank())?;
            if start > end || *end > input.dims[a] {
                return Err(format!(
                    "range {start}..{end} is outside axis {a} of length {}",
                    input.dims[a]
                ));
            }
            let mut layout = input.clone();
            layout.offset += start * layout.strides[a];
            layout.dims[a] = end - start;
            view(layout)
        }
        Op::Expand { dims: target } => match broadcast_layout(input, target) {
            Some(layout) => view(layout),
            None => Err(format!(
                "cannot expand {:?} to {:?}",
                input.dims.as_slice(),
                target.as_slice()
            )),
        },
        other => unreachable!("`{}` is not a view op", other.name()),
    }
}

fn concat_signature(axis: isize, inputs: &[&Layout]) -> Inferred {
    let first = &inputs[0].dims;
    let a = axis_of(axis, first.len())?;
    let mut out: Dims = first.clone();
    for (i, input) in inputs.iter().enumerate().skip(1) {
        let compatible = input.rank() == out.len()
            && input
                .dims
                .iter()
                .zip(&out)
                .enumerate()
                .all(|(k, (x, y))| k == a || x == y);
        if !compatible {
            return Err(format!(
                "input {i} has shape {:?}, incompatible with {:?} along axis {a}",
                input.dims.as_slice(),
                first.as_slice()
            ));
        }
        out[a] += input.dims[a];
    }
    let n = out.iter().product();
    Ok(Signature::one(OutputSpec::fresh(&out), n))
}

fn reduce_signature(op: ReduceOp, axis: usize, keepdim: bool, x: &[usize]) -> Inferred {
    if op == ReduceOp::Max && x[axis] == 0 {
        return Err("max over an empty axis".into());
    }
    let mut out: Dims = x.into();
    if keepdim {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    Ok(Signature::one(OutputSpec::fresh(&out), x.iter().product()))
}

/// Normalised x, then the per-row mean and reciprocal standard deviation.
fn layer_norm_signature(x: &[usize], gamma: &[usize], beta: &[usize]) -> Inferred {
    let (rows, d) = layer_norm_rows(x)?;
    for (what, dims) in [("gamma", gamma), ("beta", beta)] {
        if dims != [d] {
            return Err(format!("{what} has shape {dims:?}, expected [{d}]"));
        }
    }
    let stats = &x[..x.len() - 1];
    Ok(Signature {
        outputs: [
            OutputSpec::fresh(x),
            OutputSpec::fresh(stats),
            OutputSpec::fresh(stats),
        ]
        .into_iter()
        .collect(),
        cost: (8 * rows * d) as u64,
    })
}

/// From (dy, x, gamma, mean, rstd): the gradients of x, gamma and beta.
fn layer_norm_backward_signature(inputs: &[&Layout]) -> Inferred {
    let dims = |i: usize| -> &[usize] { &inputs[i].dims };
    same_shape(dims(0), dims(1))?;
    let (rows, d) = layer_norm_rows(dims(1))?;
    let stats = &dims(1)[..dims(1).len() - 1];
    if dims(2) != [d] || dims(3) != stats || dims(4) != stats {
        return Err(format!(
            "gamma {:?}, mean {:?}, rstd {:?} do not match x {:?}",
            dims(2),
            dims(3),
            dims(4),
            dims(1)
        ));
    }
    Ok(Signature {
        outputs: [
            OutputSpec::fresh(dims(1)),
            OutputSpec::fresh(&[d]),
            OutputSpec::fresh(&[d]),
        ]
        .into_iter()
        .collect(),
        cost: (12 * rows * d) as u64,
    })
}

/// A convolution (x, weight) or its gradients: for the data, from
/// (grad_out, weight); for the weight, from (grad_out, x).
fn conv_signature(op: &Op, first: &[usize], second: &[usize]) -> Inferred {
    let fresh = |dims: [usize; 4], flops| Ok(Signature::one(OutputSpec::fresh(&dims), flops));
    match op {
        Op::Conv2d(window) => {
            let (x, w) = (rank4(first, "x")?, rank4(second, "weight")?);
            if x[1] != w[1] {
                return Err(format!(
                    "x has {} channels but weight expects {}",
                    x[1], w[1]
                ));
            }
            let (oh, ow) = conv_output(window, [x[2], x[3]], [w[2], w[3]])?;
            let flops = 2 * x[0] * w[0] * oh * ow * w[1] * w[2] * w[3];
            fresh([x[0], w[0], oh, ow], flops)
        }
        Op::Conv2dBackwardData { window, input_hw } => {
            let (dy, w) = (rank4(first, "grad_out")?, rank4(second, "weight")?);
            let expected = conv_output(window, *input_hw, [w[2], w[3]])?;
            if dy[1] != w[0] || (dy[2], dy[3]) != expected {
                return Err(format!(
                    "grad_out {dy:?} does not match weight {w:?} and input size {input_hw:?}"
                ));
            }
            let flops = 2 * dy[0] * w[0] * dy[2] * dy[3] * w[1] * w[2] * w[3];
            fresh([dy[0], w[1], input_hw[0], input_hw[1]], flops)
        }
        Op::Conv2dBackwardWeight { window, kernel_hw } => {
            let (dy, x) = (rank4(first, "grad_out")?, rank4(second, "x")?);
            let expected = conv_output(window, [x[2], x[3]], *kernel_hw)?;
            if dy[0] != x[0] || (dy[2], dy[3]) != expected {
                return Err(format!(
                    "grad_out {dy:?} does not match x {x:?} and kernel size {kernel_hw:?}"
                ));
            }
            let flops = 2 * dy[0] * dy[1] * dy[2] * dy[3] * x[1] * kernel_hw[0] * kernel_hw[1];
            fresh([dy[1], x[1], kernel_hw[0], kernel_hw[1]], flops)
        }
        other => unreachable!("`{}` is not a convolution", other.name()),
    }
}

/// Max and average pooling of x, and their gradients: max pooling's from
/// (grad_out, x), average pooling's from grad_out and the input size.
fn pool_signature(op: &Op, inputs: &[&Layout]) -> Inferred {
    let window_cost = |dims: &[usize], kernel: &[usize; 2]| {
        dims.iter().product::<usize>() * kernel[0] * kernel[1]
    };
    match op {
        Op::MaxPool2d { kernel, window } | Op::AvgPool2d { kernel, window } => {
            let x = rank4(&inputs[0].dims, "x")?;
            check_pool_padding(kernel, window)?;
            let (oh, ow) = conv_output(window, [x[2], x[3]], *kernel)?;
            let out = [x[0], x[1], oh, ow];
            Ok(Signature::one(
                OutputSpec::fresh(&out),
                window_cost(&out, kernel),
            ))
        }
        Op::MaxPool2dBackward { kernel, window } => {
            let (dy, x) = (
                rank4(&inputs[0].dims, "grad_out")?,
                rank4(&inputs[1].dims, "x")?,
            );
            let (oh, ow) = conv_output(window, [x[2], x[3]], *kernel)?;
            if dy != [x[0], x[1], oh, ow] {
                return Err(format!(
                    "grad_out {dy:?} does not match the pooled shape of x {x:?}"
                ));
            }
            Ok(Signature::one(
                OutputSpec::fresh(&x),
                window_cost(&dy, kernel),
            ))
        }
        Op::AvgPool2dBackward {
            kernel,
            window,
            input_hw,
        } => {
            let dy = rank4(&inputs[0].dims, "grad_out")?;
            let (oh, ow) = conv_output(window, *input_hw, *kernel)?;
            if (dy[2], dy[3]) != (oh, ow) {
                return Err(format!(
                    "grad_out {dy:?} does not match input size {input_hw:?}"
                ));
            }
            let out = [dy[0], dy[1], input_hw[0], input_hw[1]];
            Ok(Signature::one(
                OutputSpec::fresh(&out),
                window_cost(&dy, kernel),
            ))
        }
        other => unreachable!("`{}` is not a pooling op", other.name()),
    }
}

/// A recorded op's outputs: views of the inputs it names, or data-free
/// storages whose layouts only describe their bytes.
fn recorded_signature(recorded: &super::RecordedOp, inputs: &[&Layout]) -> Inferred {
    Ok(Signature {
        outputs: recorded_outputs(recorded, inputs)?,
        cost: recorded.cost,
    })
}

/// [`recorded_signature`]'s outputs.
pub(crate) fn recorded_outputs(
    recorded: &super::RecordedOp,
    inputs: &[&Layout],
) -> std::result::Result<Outputs, String> {
    let mut outputs = SmallVec::new();
    for (k, output) in recorded.outputs.iter().enumerate() {
        outputs.push(match output.alias_of {
            Some(i) if i >= inputs.len() => {
                return Err(format!(
                    "output {k} aliases input {i}, but there are {} inputs",
                    inputs.len()
                ))
            }
            Some(i) => OutputSpec::view(inputs[i].clone(), i),
            None => OutputSpec {
                layout: Layout::contiguous(&[output.bytes.div_ceil(ELEMENT_BYTES) as usize]),
                alias_of: None,
                bytes: output.bytes,
            },
        });
    }
    Ok(Outputs::from(outputs))
}

fn matmul_signature(a: &[usize], b: &[usize]) -> Inferred {
    if a.len() < 2 || b.len() < 2 {
        return Err(format!("operands must have rank >= 2, got {a:?} and {b:?}"));
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return Err(format!("inner dimensions differ: {a:?} x {b:?}"));
    }
    let batch_a = &a[..a.len() - 2];
    let batch_b = &b[..b.len() - 2];
    if !batch_b.is_empty() && batch_a != batch_b {
        return Err(format!("batch dimensions differ: {a:?} x {b:?}"));
    }
    let mut out: Dims = batch_a.into();
    out.push(m);
    out.push(n);
    let batch: usize = batch_a.iter().product();
    Ok(Signature::one(
        OutputSpec::fresh(&out),
        2 * batch * m * n * k,
    ))
}

fn layer_norm_rows(x: &[usize]) -> std::result::Result<(usize, usize), String> {
    match x.split_last() {
        Some((&d, rest)) if d > 0 => Ok((rest.iter().product(), d)),
        _ => Err(format!("x must have a nonempty last axis, got {x:?}")),
    }
}

fn rank4(dims: &[usize], what: &str) -> std::result::Result<[usize; 4], String> {
    dims.try_into()
        .map_err(|_| format!("{what} must be 4-D [n, c, h, w], got {dims:?}"))
}

fn conv_output(
    window: &Window2d,
    input_hw: [usize; 2],
    kernel_hw: [usize; 2],
) -> std::result::Result<(usize, usize), String> {
    let oh = window.output_len(0, input_hw[0], kernel_hw[0]);
    let ow = window.output_len(1, input_hw[1], kernel_hw[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok((oh, ow)),
        _ => Err(format!(
            "kernel {kernel_hw:?} with stride {:?} and padding {:?} does not fit input {input_hw:?}",
            window.stride, window.padding
        )),
    }
}

fn check_pool_padding(kernel: &[usize; 2], window: &Window2d) -> std::result::Result<(), String> {
    // A window made only of padding would have no element to take the max of.
    if window.padding[0] * 2 > kernel[0] || window.padding[1] * 2 > kernel[1] {
        return Err(format!(
            "padding {:?} must be at most half the kernel {kernel:?}",
            window.padding
        ));
    }
    Ok(())
}

fn check_cross_entropy(logits: &[usize], targets: &[usize]) -> std::result::Result<(), String> {
    if logits.len() != 2 || targets != [logits[0]] || logits[1] == 0 {
        return Err(format!(
            "logits must be [n, c>0] and targets [n], got {logits:?} and {targets:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, UnaryOp};

    fn c(dims: &[usize]) -> Layout {
        Layout::contiguous(dims)
    }

    #[test]
    fn broadcasting_binary_and_mismatch() {
        let s = Op::Binary(BinaryOp::Add)
            .signature(&[&c(&[4, 1]), &c(&[3])])
            .unwrap();
        assert_eq!(s.outputs[0].layout.dims.as_slice(), &[4, 3]);
        let err = Op::Binary(BinaryOp::Add)
            .signature(&[&c(&[4, 2]), &c(&[3])])
            .unwrap_err();
        assert!(err.to_string().contains("do not broadcast"), "{err}");
    }

    #[test]
    fn views_alias_their_input() {
        let t = Op::Transpose { dim0: 0, dim1: 1 }
            .signature(&[&c(&[2, 3])])
            .unwrap();
        assert_eq!(t.outputs[0].alias_of, Some(0));
        assert_eq!(t.outputs[0].bytes(), 0);
        // Reshape of a non-contiguous view must copy.
        let r = Op::reshape(&[6])
            .signature(&[&t.outputs[0].layout])
            .unwrap();
        assert_eq!(r.outputs[0].alias_of, None);
        assert_eq!(r.outputs[0].bytes(), 24);
    }

    #[test]
    fn matmul_and_conv_shapes() {
        let m = Op::MatMul
            .signature(&[&c(&[5, 2, 3]), &c(&[3, 4])])
            .unwrap();
        assert_eq!(m.outputs[0].layout.dims.as_slice(), &[5, 2, 4]);
        // Small: moving its 42 + 40 elements costs more than its 240 flops.
        assert_eq!(
            m.cost,
            (5 * 2 * 3 + 3 * 4 + 5 * 2 * 4) * ELEMENT_TRAFFIC_COST
        );
        let big = Op::MatMul
            .signature(&[&c(&[256, 256]), &c(&[256, 256])])
            .unwrap();
        assert_eq!(
            big.cost,
            2 * 256 * 256 * 256,
            "large products cost their flops"
        );
        assert!(Op::MatMul.signature(&[&c(&[2, 3]), &c(&[4, 5])]).is_err());
        let conv = Op::Conv2d(Window2d::new(2, 1))
            .signature(&[&c(&[1, 3, 8, 8]), &c(&[4, 3, 3, 3])])
            .unwrap();
        assert_eq!(conv.outputs[0].layout.dims.as_slice(), &[1, 4, 4, 4]);
    }

    #[test]
    fn memory_bound_ops_cost_their_traffic_and_views_stay_cheap() {
        let exp = Op::Unary(UnaryOp::Exp).signature(&[&c(&[1000])]).unwrap();
        assert_eq!(exp.cost, 2000 * ELEMENT_TRAFFIC_COST);
        let view = Op::Transpose { dim0: 0, dim1: 1 }
            .signature(&[&c(&[100, 10])])
            .unwrap();
        assert_eq!(view.cost, 1);
    }

    #[test]
    fn arity_is_checked() {
        let err = Op::Unary(UnaryOp::Exp).signature(&[]).unwrap_err();
        assert!(err.to_string().contains("takes 1 inputs"), "{err}");
    }

    #[test]
    fn layer_norm_has_three_outputs() {
        let s = Op::LayerNorm { eps: 1e-5 }
            .signature(&[&c(&[2, 5]), &c(&[5]), &c(&[5])])
            .unwrap();
        assert_eq!(s.outputs.len(), 3);
        assert_eq!(s.outputs[1].layout.dims.as_slice(), &[2]);
    }
}
