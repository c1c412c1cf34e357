//! Tensor handles, their ops with backward rules, and parameters.

use std::cell::RefCell;
use std::rc::Rc;

use smallvec::{smallvec, SmallVec};

use super::autograd::{self, BackwardFn, Edge, GradFn, InputGrads};
use super::session::Session;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::TensorId;
use crate::ops::{BinaryOp, Op, ReduceOp, ScalarOp, UnaryOp, Window2d};
use crate::shape::Dims;

/// A backward rule as an op records it.
struct Rule<B: Backend> {
    name: &'static str,
    /// Positions of the op's outputs the rule reads.
    saves: &'static [usize],
    backward: BackwardFn<B>,
}

struct TensorInner<B: Backend> {
    id: TensorId,
    dims: Dims,
    session: Session<B>,
    /// Where this tensor's gradient goes: `None` when it needs none.
    grad: Option<Edge<B>>,
}

impl<B: Backend> Drop for TensorInner<B> {
    fn drop(&mut self) {
        self.session.release(self.id);
    }
}

/// A handle to a tensor of a [`Session`]. Clones share it; the last one
/// dropped releases it (DTR may still keep it as history for recomputation).
pub struct Tensor<B: Backend>(Rc<TensorInner<B>>);

impl<B: Backend> Clone for Tensor<B> {
    fn clone(&self) -> Self {
        Tensor(self.0.clone())
    }
}

impl<B: Backend> std::fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, dims {:?})", self.0.id, self.0.dims)
    }
}

/// Sums `grad` down to `dims`, undoing broadcasting.
fn sum_to<B: Backend>(grad: Tensor<B>, dims: &[usize]) -> Result<Tensor<B>> {
    let mut grad = grad;
    while grad.dims().len() > dims.len() {
        grad = grad.sum(0, false)?;
    }
    for (axis, &d) in dims.iter().enumerate() {
        if d == 1 && grad.dims()[axis] != 1 {
            grad = grad.sum(axis as isize, true)?;
        }
    }
    Ok(grad)
}

impl<B: Backend> Tensor<B> {
    pub(crate) fn wrap(session: &Session<B>, id: TensorId, grad: Option<Edge<B>>) -> Tensor<B> {
        let dims = session
            .shared
            .interpreter
            .borrow()
            .dims(id)
            .map(Dims::from)
            .unwrap_or_default();
        Tensor(Rc::new(TensorInner {
            id,
            dims,
            session: session.clone(),
            grad,
        }))
    }

    /// The interpreter's id for this tensor (for [`Session::with_interpreter`]).
    pub fn id(&self) -> TensorId {
        self.0.id
    }

    /// The shape.
    pub fn dims(&self) -> &[usize] {
        &self.0.dims
    }

    /// The session the tensor belongs to.
    pub fn session(&self) -> &Session<B> {
        &self.0.session
    }

    /// Whether a gradient flows back from this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.grad.is_some()
    }

    /// The values, recomputing them if they were evicted.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        self.session()
            .with_interpreter(|dtr| dtr.get_value(self.0.id))
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        match self.to_vec()?.as_slice() {
            [value] => Ok(*value),
            values => Err(Error::InvalidArgument(format!(
                "item() of a tensor of {} elements (dims {:?})",
                values.len(),
                self.dims()
            ))),
        }
    }

    /// Cuts the interpreter's compute history of this tensor, making it a
    /// root (see [`crate::Interpreter::detach`]). A view of another tensor's
    /// storage cannot be cut: it keeps its history and this returns `false`.
    pub(crate) fn cut_history(&self) -> Result<bool> {
        self.session().with_interpreter(|dtr| {
            if dtr.is_view(self.id())? {
                return Ok(false);
            }
            dtr.detach(self.id())?;
            Ok(true)
        })
    }

    /// The same values with no gradient history.
    pub fn detach(&self) -> Tensor<B> {
        // A new interpreter handle to the same tensor (its history stays,
        // so DTR can still evict and recompute it).
        let retained = self.session().with_interpreter(|dtr| dtr.retain(self.0.id));
        debug_assert!(retained.is_ok(), "a live handle can be retained");
        Tensor::wrap(self.session(), self.0.id, None)
    }

    /// Applies `op`; unless grad is off or no input needs a gradient,
    /// records `backward` for the first output.
    fn apply(
        op: Op,
        inputs: &[&Tensor<B>],
        name: &'static str,
        backward: impl FnOnce(&Tensor<B>) -> Result<InputGrads<B>> + 'static,
    ) -> Result<Tensor<B>> {
        let rule = Rule {
            name,
            saves: &[],
            backward: Box::new(move |g, _| backward(g)),
        };
        let mut outputs = Tensor::run(op, inputs, Some(rule))?;
        Ok(outputs.swap_remove(0))
    }

    /// [`Tensor::apply`] for a rule that reads the op's outputs at the
    /// positions `saves` (given to it in that order). Returns every output;
    /// the gradient flows from the first one only.
    fn apply_saving(
        op: Op,
        inputs: &[&Tensor<B>],
        name: &'static str,
        saves: &'static [usize],
        backward: impl FnOnce(&Tensor<B>, &[Tensor<B>]) -> Result<InputGrads<B>> + 'static,
    ) -> Result<SmallVec<[Tensor<B>; 3]>> {
        let rule = Rule {
            name,
            saves,
            backward: Box::new(backward),
        };
        Tensor::run(op, inputs, Some(rule))
    }

    /// Applies `op` recording no backward (the ops of backward rules).
    fn plain(op: Op, inputs: &[&Tensor<B>]) -> Result<Tensor<B>> {
        let mut outputs = Tensor::run(op, inputs, None)?;
        Ok(outputs.swap_remove(0))
    }

    fn run(
        op: Op,
        inputs: &[&Tensor<B>],
        rule: Option<Rule<B>>,
    ) -> Result<SmallVec<[Tensor<B>; 3]>> {
        let session = inputs
            .first()
            .map(|t| t.session().clone())
            .ok_or_else(|| Error::InvalidArgument(format!("`{}` needs an input", op.name())))?;
        if inputs
            .iter()
            .any(|t| !Rc::ptr_eq(&t.session().shared, &session.shared))
        {
            return Err(Error::InvalidArgument(format!(
                "`{}`: inputs come from different sessions",
                op.name()
            )));
        }
        let ids: SmallVec<[TensorId; 4]> = inputs.iter().map(|t| t.0.id).collect();
        let made = session.with_interpreter(|dtr| dtr.apply_op(op, &ids))?;
        let edges: SmallVec<[Option<Edge<B>>; 3]> =
            inputs.iter().map(|t| t.0.grad.clone()).collect();
        let records = !session.shared.no_grad.get() && edges.iter().any(Option::is_some);
        let (node, saves) = match rule {
            Some(rule) if records => {
                let node = Rc::new(GradFn {
                    name: rule.name,
                    inputs: edges,
                    backward: RefCell::new(Some(rule.backward)),
                    saved_outputs: RefCell::new(SmallVec::new()),
                });
                (Some(node), rule.saves)
            }
            _ => (None, &[][..]),
        };
        let mut outputs: SmallVec<[Tensor<B>; 3]> = SmallVec::new();
        for (i, id) in made.into_iter().enumerate() {
            let grad = if i == 0 {
                node.clone().map(Edge::Node)
            } else {
                None
            };
            outputs.push(Tensor::wrap(&session, id, grad));
        }
        if let Some(node) = &node {
            // Gradient-free handles: a handle with the edge would be a cycle.
            let mut saved = node.saved_outputs.borrow_mut();
            for &i in saves {
                let output = outputs.get(i).ok_or_else(|| {
                    Error::InvalidArgument(format!("`{}` has no output {i} to save", node.name))
                })?;
                saved.push(output.detach());
            }
        }
        Ok(outputs)
    }

    /// Runs the backward pass from this one-element tensor (a loss),
    /// accumulating gradients into the parameters it depends on.
    pub fn backward(&self) -> Result<()> {
        if self.dims().iter().product::<usize>() != 1 {
            return Err(Error::InvalidArgument(format!(
                "backward() from a tensor of dims {:?}; reduce it to one element first",
                self.dims()
            )));
        }
        let session = self.session().clone();
        let seed = session.no_grad(|| session.full(self.dims(), 1.0))?;
        match &self.0.grad {
            Some(Edge::Node(node)) => session.no_grad(|| autograd::backward(node, seed)),
            Some(Edge::Param(param)) => match param.upgrade() {
                Some(param) => session.no_grad(|| param.accumulate(seed)),
                None => Ok(()),
            },
            None => Err(Error::InvalidArgument(
                "backward() from a tensor that needs no gradient".into(),
            )),
        }
    }

    // ---- Elementwise ----

    fn binary(&self, other: &Tensor<B>, op: BinaryOp) -> Result<Tensor<B>> {
        let (a, b) = (self.clone(), other.clone());
        let (a_dims, b_dims): (Dims, Dims) = (self.0.dims.clone(), other.0.dims.clone());
        let (a_saved, b_saved) = match op {
            BinaryOp::Add | BinaryOp::Sub => (None, None),
            BinaryOp::Mul | BinaryOp::Div => (Some(a), Some(b)),
        };
        Tensor::apply(Op::Binary(op), &[self, other], op.name(), move |g| {
            let (ga, gb) = match op {
                BinaryOp::Add => (g.clone(), g.clone()),
                BinaryOp::Sub => (g.clone(), g.neg()?),
                BinaryOp::Mul => {
                    let (a, b) = (a_saved.expect("saved"), b_saved.expect("saved"));
                    (g.mul(&b)?, g.mul(&a)?)
                }
                BinaryOp::Div => {
                    // d(a/b) = g/b, −g·a/b²
                    let (a, b) = (a_saved.expect("saved"), b_saved.expect("saved"));
                    let ga = g.div(&b)?;
                    (ga.clone(), ga.mul(&a)?.div(&b)?.neg()?)
                }
            };
            Ok(smallvec![
                Some(sum_to(ga, &a_dims)?),
                Some(sum_to(gb, &b_dims)?)
            ])
        })
    }

    /// `self + other`, broadcasting.
    pub fn add(&self, other: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary(other, BinaryOp::Add)
    }

    /// `self - other`, broadcasting.
    pub fn sub(&self, other: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary(other, BinaryOp::Sub)
    }

    /// `self · other` elementwise, broadcasting.
    pub fn mul(&self, other: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary(other, BinaryOp::Mul)
    }

    /// `self / other` elementwise, broadcasting.
    pub fn div(&self, other: &Tensor<B>) -> Result<Tensor<B>> {
        self.binary(other, BinaryOp::Div)
    }

    fn scalar(&self, op: ScalarOp, value: f32) -> Result<Tensor<B>> {
        let x = (op == ScalarOp::Pow).then(|| self.clone());
        Tensor::apply(Op::Scalar { op, value }, &[self], "scalar", move |g| {
            let grad = match op {
                ScalarOp::Add => g.clone(),
                ScalarOp::Mul => g.mul_scalar(value)?,
                ScalarOp::Pow => {
                    let x = x.expect("saved");
                    g.mul(&x.pow(value - 1.0)?.mul_scalar(value)?)?
                }
            };
            Ok(smallvec![Some(grad)])
        })
    }

    /// `self + value`.
    pub fn add_scalar(&self, value: f32) -> Result<Tensor<B>> {
        self.scalar(ScalarOp::Add, value)
    }

    /// `self · value`.
    pub fn mul_scalar(&self, value: f32) -> Result<Tensor<B>> {
        self.scalar(ScalarOp::Mul, value)
    }

    /// `self` to the power `exponent`, elementwise.
    pub fn pow(&self, exponent: f32) -> Result<Tensor<B>> {
        self.scalar(ScalarOp::Pow, exponent)
    }

    /// `-self`.
    pub fn neg(&self) -> Result<Tensor<B>> {
        self.mul_scalar(-1.0)
    }

    fn unary(&self, op: UnaryOp) -> Result<Tensor<B>> {
        let backward = move |g: &Tensor<B>, saved: &Tensor<B>| -> Result<InputGrads<B>> {
            Ok(smallvec![Some(Tensor::plain(
                Op::UnaryBackward(op),
                &[g, saved]
            )?)])
        };
        if op.backward_uses_output() {
            let mut outputs =
                Tensor::apply_saving(Op::Unary(op), &[self], op.name(), &[0], move |g, saved| {
                    backward(g, &saved[0])
                })?;
            Ok(outputs.swap_remove(0))
        } else {
            let input = self.clone();
            Tensor::apply(Op::Unary(op), &[self], op.name(), move |g| {
                backward(g, &input)
            })
        }
    }

    /// `eˣ`, elementwise.
    pub fn exp(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Exp)
    }
    /// Natural logarithm, elementwise.
    pub fn log(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Log)
    }
    /// Square root, elementwise.
    pub fn sqrt(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Sqrt)
    }
    /// `max(x, 0)`, elementwise.
    pub fn relu(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Relu)
    }
    /// GELU (tanh approximation), elementwise.
    pub fn gelu(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Gelu)
    }
    /// Hyperbolic tangent, elementwise.
    pub fn tanh(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Tanh)
    }
    /// `1 / (1 + e⁻ˣ)`, elementwise.
    pub fn sigmoid(&self) -> Result<Tensor<B>> {
        self.unary(UnaryOp::Sigmoid)
    }

    // ---- Linear algebra and shapes ----

    /// `[.., m, k] × [.., k, n]` (or a 2-D right side).
    pub fn matmul(&self, other: &Tensor<B>) -> Result<Tensor<B>> {
        let (a, b) = (self.clone(), other.clone());
        Tensor::apply(Op::MatMul, &[self, other], "matmul", move |g| {
            let ga = g.matmul(&b.transpose(-1, -2)?)?;
            let gb = if b.dims().len() == 2 && a.dims().len() > 2 {
                // Every batch shares b: fold the batch into the rows.
                let k = a.dims()[a.dims().len() - 1];
                let n = b.dims()[1];
                let rows = a.dims().iter().product::<usize>() / k.max(1);
                let a2 = a.reshape(&[rows, k])?;
                let g2 = g.reshape(&[rows, n])?;
                a2.transpose(0, 1)?.matmul(&g2)?
            } else {
                a.transpose(-1, -2)?.matmul(g)?
            };
            Ok(smallvec![Some(ga), Some(gb)])
        })
    }

    /// A view with axes `dim0` and `dim1` swapped (negative axes count from the end).
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Result<Tensor<B>> {
        Tensor::apply(
            Op::Transpose { dim0, dim1 },
            &[self],
            "transpose",
            move |g| Ok(smallvec![Some(g.transpose(dim0, dim1)?)]),
        )
    }

    /// A view (or a copy when not contiguous) with the given dims.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor<B>> {
        let original = self.0.dims.clone();
        Tensor::apply(Op::reshape(dims), &[self], "reshape", move |g| {
            Ok(smallvec![Some(g.reshape(&original)?)])
        })
    }

    /// Sum over `axis`.
    pub fn sum(&self, axis: isize, keepdim: bool) -> Result<Tensor<B>> {
        self.reduce(ReduceOp::Sum, axis, keepdim)
    }

    /// Mean over `axis`.
    pub fn mean(&self, axis: isize, keepdim: bool) -> Result<Tensor<B>> {
        self.reduce(ReduceOp::Mean, axis, keepdim)
    }

    fn reduce(&self, op: ReduceOp, axis: isize, keepdim: bool) -> Result<Tensor<B>> {
        if op == ReduceOp::Max {
            return Err(Error::InvalidArgument(
                "max has no gradient here; use softmax or max_pool2d".into(),
            ));
        }
        let dims = self.0.dims.clone();
        let rank = dims.len() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            return Err(Error::InvalidArgument(format!(
                "reduce: axis {axis} out of range for dims {dims:?}"
            )));
        }
        let a = a as usize;
        Tensor::apply(
            Op::Reduce { op, axis, keepdim },
            &[self],
            "reduce",
            move |g| {
                let mut kept: Dims = dims.clone();
                kept[a] = 1;
                let g = g.reshape(&kept)?;
                let g = if op == ReduceOp::Mean {
                    g.mul_scalar(1.0 / dims[a].max(1) as f32)?
                } else {
                    g
                };
                let spread = Tensor::plain(Op::expand(&dims), &[&g])?;
                Ok(smallvec![Some(spread)])
            },
        )
    }

    // ---- Neural-network ops ----

    /// Softmax over `axis` (negative counts from the end).
    pub fn softmax(&self, axis: isize) -> Result<Tensor<B>> {
        self.softmax_like(axis, false)
    }

    /// Log of the softmax over `axis` (negative counts from the end).
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor<B>> {
        self.softmax_like(axis, true)
    }

    fn softmax_like(&self, axis: isize, log: bool) -> Result<Tensor<B>> {
        let (op, backward) = if log {
            (Op::LogSoftmax { axis }, Op::LogSoftmaxBackward { axis })
        } else {
            (Op::Softmax { axis }, Op::SoftmaxBackward { axis })
        };
        let mut outputs = Tensor::apply_saving(op, &[self], "softmax", &[0], move |g, y| {
            Ok(smallvec![Some(Tensor::plain(backward, &[g, &y[0]])?)])
        })?;
        Ok(outputs.swap_remove(0))
    }

    /// Layer norm over the last axis with `gamma` and `beta` of that size.
    pub fn layer_norm(&self, gamma: &Tensor<B>, beta: &Tensor<B>, eps: f32) -> Result<Tensor<B>> {
        let (x, w) = (self.clone(), gamma.clone());
        // Outputs: y, then the mean and 1/std the backward reads.
        let mut outputs = Tensor::apply_saving(
            Op::LayerNorm { eps },
            &[self, gamma, beta],
            "layer_norm",
            &[1, 2],
            move |g, stats| {
                let grads = Tensor::run(
                    Op::LayerNormBackward,
                    &[g, &x, &w, &stats[0], &stats[1]],
                    None,
                )?;
                Ok(grads.into_iter().map(Some).collect())
            },
        )?;
        Ok(outputs.swap_remove(0))
    }

    /// `self [n, c, h, w]` convolved with `weight [o, c, kh, kw]`.
    pub fn conv2d(&self, weight: &Tensor<B>, window: Window2d) -> Result<Tensor<B>> {
        let (x, w) = (self.clone(), weight.clone());
        Tensor::apply(Op::Conv2d(window), &[self, weight], "conv2d", move |g| {
            let input_hw = [x.dims()[2], x.dims()[3]];
            let kernel_hw = [w.dims()[2], w.dims()[3]];
            let gx = Tensor::plain(Op::Conv2dBackwardData { window, input_hw }, &[g, &w])?;
            let gw = Tensor::plain(Op::Conv2dBackwardWeight { window, kernel_hw }, &[g, &x])?;
            Ok(smallvec![Some(gx), Some(gw)])
        })
    }

    /// Max pooling of `self [n, c, h, w]` over `kernel` windows (padding counts as -∞).
    pub fn max_pool2d(&self, kernel: [usize; 2], window: Window2d) -> Result<Tensor<B>> {
        let x = self.clone();
        Tensor::apply(
            Op::MaxPool2d { kernel, window },
            &[self],
            "max_pool2d",
            move |g| {
                Ok(smallvec![Some(Tensor::plain(
                    Op::MaxPool2dBackward { kernel, window },
                    &[g, &x]
                )?)])
            },
        )
    }

    /// Average pooling of `self [n, c, h, w]` over `kernel` windows (padding
    /// counts as 0, and in the divisor).
    pub fn avg_pool2d(&self, kernel: [usize; 2], window: Window2d) -> Result<Tensor<B>> {
        let input_hw = match self.dims() {
            [_, _, h, w] => [*h, *w],
            dims => {
                return Err(Error::InvalidArgument(format!(
                    "avg_pool2d of dims {dims:?}: expected [n, c, h, w]"
                )))
            }
        };
        Tensor::apply(
            Op::AvgPool2d { kernel, window },
            &[self],
            "avg_pool2d",
            move |g| {
                Ok(smallvec![Some(Tensor::plain(
                    Op::AvgPool2dBackward {
                        kernel,
                        window,
                        input_hw
                    },
                    &[g]
                )?)])
            },
        )
    }

    /// Rows of this `[v, d]` table at `indices` (integral values).
    pub fn embedding(&self, indices: &Tensor<B>) -> Result<Tensor<B>> {
        let num_embeddings = self.dims().first().copied().unwrap_or(0);
        let idx = indices.clone();
        Tensor::apply(Op::Embedding, &[self, indices], "embedding", move |g| {
            let gw = Tensor::plain(Op::EmbeddingBackward { num_embeddings }, &[g, &idx])?;
            Ok(smallvec![Some(gw), None])
        })
    }

    /// Mean cross-entropy of these `[n, c]` logits against class `targets [n]`.
    pub fn cross_entropy(&self, targets: &Tensor<B>) -> Result<Tensor<B>> {
        let (logits, t) = (self.clone(), targets.clone());
        Tensor::apply(
            Op::CrossEntropy,
            &[self, targets],
            "cross_entropy",
            move |g| {
                let gl = Tensor::plain(Op::CrossEntropyBackward, &[g, &logits, &t])?;
                Ok(smallvec![Some(gl), None])
            },
        )
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident) => {
        impl<B: Backend> std::ops::$trait<&Tensor<B>> for &Tensor<B> {
            type Output = Result<Tensor<B>>;
            fn $method(self, other: &Tensor<B>) -> Result<Tensor<B>> {
                Tensor::$method(self, other)
            }
        }
    };
}
operator!(Add, add);
operator!(Sub, sub);
operator!(Mul, mul);
operator!(Div, div);

pub(crate) struct ParamInner<B: Backend> {
    value: RefCell<Tensor<B>>,
    grad: RefCell<Option<Tensor<B>>>,
}

impl<B: Backend> ParamInner<B> {
    /// Adds `grad` to the accumulated gradient. The sum is cut from its
    /// history (a root, as gradients are leaves in PyTorch): recomputing it
    /// would replay the backward pass, and its history would keep the
    /// forward pass's tensors tracked until the optimiser step.
    pub(crate) fn accumulate(&self, grad: Tensor<B>) -> Result<()> {
        let mut slot = self.grad.borrow_mut();
        let sum = match slot.take() {
            Some(sum) => sum.add(&grad)?,
            None => grad.detach(),
        };
        // A view of another tensor's storage cannot be cut: cut a packed copy.
        let root = if sum.cut_history()? {
            sum
        } else {
            let copy = Tensor::plain(Op::Contiguous, &[&sum])?;
            copy.cut_history()?;
            copy
        };
        *slot = Some(root);
        Ok(())
    }
}

/// A trainable tensor, with an accumulated gradient. Its value is a
/// constant (a put, then a detached tensor): never recomputed, and evicted
/// only by swapping it to host memory (`RestoreMode::Swap` or `Hybrid`).
/// Cloning gives another handle to the same parameter.
pub struct Param<B: Backend>(Rc<ParamInner<B>>);

impl<B: Backend> Clone for Param<B> {
    fn clone(&self) -> Self {
        Param(self.0.clone())
    }
}

impl<B: Backend> Param<B> {
    pub(crate) fn new(session: &Session<B>, data: &[f32], dims: &[usize]) -> Result<Param<B>> {
        let id = session.with_interpreter(|dtr| dtr.put(data, dims))?;
        Ok(Param(Rc::new_cyclic(|param| ParamInner {
            value: RefCell::new(Tensor::wrap(session, id, Some(Edge::Param(param.clone())))),
            grad: RefCell::new(None),
        })))
    }

    /// The current value, as a tensor whose gradient flows into this parameter.
    pub fn value(&self) -> Tensor<B> {
        self.0.value.borrow().clone()
    }

    /// The accumulated gradient (`None` before any backward reaches it).
    pub fn grad(&self) -> Option<Tensor<B>> {
        self.0.grad.borrow().clone()
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        self.0.grad.borrow_mut().take();
    }

    /// Replaces the value (an optimiser step): the new value is detached
    /// from its history, the old one released.
    pub fn set(&self, value: Tensor<B>) -> Result<()> {
        let session = value.session().clone();
        let id = value.id();
        session.with_interpreter(|dtr| -> Result<()> {
            dtr.detach(id)?;
            dtr.retain(id)
        })?;
        let fresh = Tensor::wrap(&session, id, Some(Edge::Param(Rc::downgrade(&self.0))));
        drop(self.0.value.replace(fresh));
        Ok(())
    }

    /// The shape.
    pub fn dims(&self) -> Dims {
        self.0.value.borrow().0.dims.clone()
    }
}
