//! The op set: what each op is called, its attributes, its shape rules and
//! its default recompute cost.
//!
//! An [`Op`] is pure description; backends execute it. [`Op::signature`]
//! checks the inputs' layouts, says for each output whether it is a fresh
//! storage or a view of an input, and estimates the cost in FLOPs (for
//! memory-bound ops, elements touched) that the eviction heuristics use as
//! the recompute cost `c0`.

mod signature;

pub(crate) use signature::recorded_outputs;
pub use signature::{OutputSpec, Outputs, OutputsInterner, Signature, ELEMENT_BYTES};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::shape::Dims;

/// Elementwise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `eˣ`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `max(x, 0)`.
    Relu,
    /// The tanh approximation used by GPT-style models.
    Gelu,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e⁻ˣ)`.
    Sigmoid,
}

impl UnaryOp {
    /// Every unary op, for tests and tools that cover them all.
    pub const ALL: [UnaryOp; 8] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
    ];

    /// Whether [`Op::UnaryBackward`] takes this op's output (`true`) or its
    /// input (`false`) as the saved tensor. Saving the output where the
    /// derivative is cheap in it (exp, sqrt, tanh, sigmoid) is what frameworks do.
    pub fn backward_uses_output(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Tanh | UnaryOp::Sigmoid
        )
    }

    /// The op's name in traces and logs (`"relu"`).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
        }
    }
}

/// Elementwise functions of two tensors, with NumPy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

    /// The op's name in traces and logs (`"add"`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// Elementwise functions of a tensor and a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScalarOp {
    /// `x + c`.
    Add,
    /// `x · c`.
    Mul,
    /// `x^c`.
    Pow,
}

/// Reductions over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// Sum of the axis.
    Sum,
    /// Mean of the axis.
    Mean,
    /// Largest value of the axis.
    Max,
}

/// 2-D window geometry shared by convolution and pooling: per spatial axis
/// (height, width) the stride and the zero padding on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct Window2d {
    /// Step between windows, per axis (at least 1 for a valid op).
    pub stride: [usize; 2],
    /// Zeros added before and after each axis.
    pub padding: [usize; 2],
}

impl Window2d {
    /// The same `stride` and `padding` on both axes.
    pub fn new(stride: usize, padding: usize) -> Window2d {
        Window2d {
            stride: [stride, stride],
            padding: [padding, padding],
        }
    }

    /// Output extent of one spatial axis, or `None` when the window does not fit.
    pub(crate) fn output_len(&self, axis: usize, input: usize, kernel: usize) -> Option<usize> {
        let padded = input + 2 * self.padding[axis];
        if kernel == 0 || self.stride[axis] == 0 || padded < kernel {
            return None;
        }
        Some((padded - kernel) / self.stride[axis] + 1)
    }
}

/// An operation on tensors, with its attributes. Inputs are listed per variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// No inputs; a tensor of `dims` filled with `value`. Recomputable, unlike a put.
    Fill {
        /// The output's shape.
        dims: Dims,
        /// Every element's value.
        value: f32,
    },
    /// `(x)`.
    Unary(UnaryOp),
    /// `(grad_out, saved)` → grad of the input; `saved` is the op's output or
    /// input as [`UnaryOp::backward_uses_output`] says.
    UnaryBackward(UnaryOp),
    /// `(a, b)`, broadcasting.
    Binary(BinaryOp),
    /// `(x)` combined with the constant `value`.
    Scalar {
        /// The function.
        op: ScalarOp,
        /// The constant `c`.
        value: f32,
    },
    /// `(a [.., m, k], b [.., k, n])`; batch axes must match, or `b` is 2-D.
    MatMul,
    /// `(x)`, a view with axes `dim0` and `dim1` swapped.
    Transpose {
        /// One axis (negative counts from the end).
        dim0: isize,
        /// The other axis.
        dim1: isize,
    },
    /// `(x)`, a view when `x` is contiguous, else a copy.
    Reshape {
        /// The new shape (same element count).
        dims: Dims,
    },
    /// `(x)`, a view of `start..end` along `axis`.
    Slice {
        /// The sliced axis (negative counts from the end).
        axis: isize,
        /// First index kept.
        start: usize,
        /// One past the last index kept.
        end: usize,
    },
    /// `(x)`, a broadcast view to `dims` (stride 0 on stretched axes).
    Expand {
        /// The broadcast shape.
        dims: Dims,
    },
    /// `(x)`, a packed row-major copy.
    Contiguous,
    /// `(x₀, x₁, …)` joined along `axis`.
    Concat {
        /// The joined axis (negative counts from the end).
        axis: isize,
    },
    /// `(x)` reduced over `axis`.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The reduced axis (negative counts from the end).
        axis: isize,
        /// Keep the axis with extent 1 (else drop it).
        keepdim: bool,
    },
    /// `(x)`, numerically stable softmax over `axis`.
    Softmax {
        /// The normalised axis (negative counts from the end).
        axis: isize,
    },
    /// `(x)`, log of the softmax over `axis`.
    LogSoftmax {
        /// The normalised axis (negative counts from the end).
        axis: isize,
    },
    /// `(grad_out, y)` with `y` the softmax output.
    SoftmaxBackward {
        /// The forward op's axis.
        axis: isize,
    },
    /// `(grad_out, y)` with `y` the log-softmax output.
    LogSoftmaxBackward {
        /// The forward op's axis.
        axis: isize,
    },
    /// `(x [.., d], gamma [d], beta [d])` → `(y, mean [..], rstd [..])`, over the last axis.
    LayerNorm {
        /// Added to the variance before the square root.
        eps: f32,
    },
    /// `(grad_y, x, gamma, mean, rstd)` → `(grad_x, grad_gamma, grad_beta)`.
    LayerNormBackward,
    /// `(x [n, c, h, w], weight [o, c, kh, kw])` → `[n, o, oh, ow]`.
    Conv2d(Window2d),
    /// `(grad_out, weight)` → grad of `x`, whose spatial size is `input_hw`.
    Conv2dBackwardData {
        /// The forward convolution's stride and padding.
        window: Window2d,
        /// Height and width of the forward input.
        input_hw: [usize; 2],
    },
    /// `(grad_out, x)` → grad of the weight, whose kernel size is `kernel_hw`.
    Conv2dBackwardWeight {
        /// The forward convolution's stride and padding.
        window: Window2d,
        /// Height and width of the kernel.
        kernel_hw: [usize; 2],
    },
    /// `(x [n, c, h, w])`; padding counts as -∞.
    MaxPool2d {
        /// Window height and width.
        kernel: [usize; 2],
        /// Stride and padding.
        window: Window2d,
    },
    /// `(grad_out, x)` → grad of `x`; ties send the gradient to the first maximum.
    MaxPool2dBackward {
        /// The forward pooling's window height and width.
        kernel: [usize; 2],
        /// The forward pooling's stride and padding.
        window: Window2d,
    },
    /// `(x [n, c, h, w])`; padding counts as 0 and in the divisor.
    AvgPool2d {
        /// Window height and width.
        kernel: [usize; 2],
        /// Stride and padding.
        window: Window2d,
    },
    /// `(grad_out)` → grad of `x`, whose spatial size is `input_hw`.
    AvgPool2dBackward {
        /// The forward pooling's window height and width.
        kernel: [usize; 2],
        /// The forward pooling's stride and padding.
        window: Window2d,
        /// Height and width of the forward input.
        input_hw: [usize; 2],
    },
    /// `(weight [v, d], indices [..])` → `[.., d]`; indices are integral f32.
    Embedding,
    /// `(grad_out [.., d], indices [..])` → grad of the weight `[num_embeddings, d]`.
    EmbeddingBackward {
        /// Rows of the weight table.
        num_embeddings: usize,
    },
    /// `(logits [n, c], targets [n])` → mean negative log-likelihood `[]`.
    CrossEntropy,
    /// `(grad_loss [], logits, targets)` → grad of the logits.
    CrossEntropyBackward,
    /// An op known only by what a trace recorded of it: any inputs, the given
    /// cost and output sizes. Only data-free backends (the simulator) run it.
    Recorded(RecordedOp),
}

/// What a trace records of an op dtr may have no kernel for. Names and
/// outputs are shared (`Arc`): a replay's many nodes of the same op hold
/// one copy, which keeps the graph small at millions of nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedOp {
    /// The op's name as recorded (`aten.mm.default`).
    pub name: Arc<str>,
    /// Its recompute cost, in the trace's cost units.
    pub cost: u64,
    /// Its outputs, in order.
    pub outputs: Arc<[RecordedOutput]>,
    /// The recording framework's id for this call: a foreign backend (the
    /// PyTorch one of the `dtr` Python package) re-runs call `call` to
    /// rematerialise the outputs. 0 in traces, which only the simulator runs.
    #[serde(default)]
    pub call: u64,
    /// The module of the model that ran it (`GPT2LMHeadModel.transformer.h.0.attn`),
    /// when the recorder knew it: for people reading traces and timelines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<Arc<str>>,
}

/// One output of a [`RecordedOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RecordedOutput {
    /// Bytes allocated (0 for a view).
    pub bytes: u64,
    /// `Some(i)`: a view of input `i`'s storage.
    pub alias_of: Option<usize>,
}

impl Op {
    /// A [`RecordedOp`] called `name` that costs `cost` and makes one new
    /// storage of `bytes` (for the simulator).
    pub fn recorded(name: &str, cost: u64, bytes: u64) -> Op {
        Op::Recorded(RecordedOp {
            name: name.into(),
            cost,
            outputs: [RecordedOutput {
                bytes,
                alias_of: None,
            }]
            .into(),
            call: 0,
            module: None,
        })
    }

    /// [`Op::Fill`] of `dims` with `value`.
    pub fn fill(dims: &[usize], value: f32) -> Op {
        Op::Fill {
            dims: dims.into(),
            value,
        }
    }

    /// [`Op::Reshape`] to `dims`.
    pub fn reshape(dims: &[usize]) -> Op {
        Op::Reshape { dims: dims.into() }
    }

    /// [`Op::Expand`] to `dims`.
    pub fn expand(dims: &[usize]) -> Op {
        Op::Expand { dims: dims.into() }
    }

    /// A stable, lower-case name (used in traces and logs).
    pub fn name(&self) -> &str {
        match self {
            Op::Fill { .. } => "fill",
            Op::Unary(u) => u.name(),
            Op::UnaryBackward(u) => match u {
                UnaryOp::Neg => "neg_backward",
                UnaryOp::Exp => "exp_backward",
                UnaryOp::Log => "log_backward",
                UnaryOp::Sqrt => "sqrt_backward",
                UnaryOp::Relu => "relu_backward",
                UnaryOp::Gelu => "gelu_backward",
                UnaryOp::Tanh => "tanh_backward",
                UnaryOp::Sigmoid => "sigmoid_backward",
            },
            Op::Binary(b) => b.name(),
            Op::Scalar {
                op: ScalarOp::Add, ..
            } => "add_scalar",
            Op::Scalar {
                op: ScalarOp::Mul, ..
            } => "mul_scalar",
            Op::Scalar {
                op: ScalarOp::Pow, ..
            } => "pow_scalar",
            Op::MatMul => "matmul",
            Op::Transpose { .. } => "transpose",
            Op::Reshape { .. } => "reshape",
            Op::Slice { .. } => "slice",
            Op::Expand { .. } => "expand",
            Op::Contiguous => "contiguous",
            Op::Concat { .. } => "concat",
            Op::Reduce {
                op: ReduceOp::Sum, ..
            } => "sum",
            Op::Reduce {
                op: ReduceOp::Mean, ..
            } => "mean",
            Op::Reduce {
                op: ReduceOp::Max, ..
            } => "max",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::SoftmaxBackward { .. } => "softmax_backward",
            Op::LogSoftmaxBackward { .. } => "log_softmax_backward",
            Op::LayerNorm { .. } => "layer_norm",
            Op::LayerNormBackward => "layer_norm_backward",
            Op::Conv2d(_) => "conv2d",
            Op::Conv2dBackwardData { .. } => "conv2d_backward_data",
            Op::Conv2dBackwardWeight { .. } => "conv2d_backward_weight",
            Op::MaxPool2d { .. } => "max_pool2d",
            Op::MaxPool2dBackward { .. } => "max_pool2d_backward",
            Op::AvgPool2d { .. } => "avg_pool2d",
            Op::AvgPool2dBackward { .. } => "avg_pool2d_backward",
            Op::Embedding => "embedding",
            Op::EmbeddingBackward { .. } => "embedding_backward",
            Op::CrossEntropy => "cross_entropy",
            Op::CrossEntropyBackward => "cross_entropy_backward",
            Op::Recorded(recorded) => &recorded.name,
        }
    }
}
