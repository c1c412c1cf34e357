//! Reverse-mode autograd: each op output that needs a gradient holds a
//! [`GradFn`] with the tensors its backward reads and edges to where its
//! inputs' gradients go. `backward` walks them in reverse topological order;
//! each node's saved tensors are dropped as soon as it has run, so the
//! backward pass frees memory as it goes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use smallvec::SmallVec;

use super::tensor::{ParamInner, Tensor};
use crate::backend::Backend;
use crate::error::{Error, Result};

/// Gradients of a node's inputs, in input order (`None`: no gradient).
pub(crate) type InputGrads<B> = SmallVec<[Option<Tensor<B>>; 3]>;

/// Computes the inputs' gradients from the output's, given the op's
/// outputs that the rule asked to keep (see [`GradFn::saved_outputs`]).
pub(crate) type BackwardFn<B> = Box<dyn FnOnce(&Tensor<B>, &[Tensor<B>]) -> Result<InputGrads<B>>>;

/// Where an input's gradient goes.
pub(crate) enum Edge<B: Backend> {
    /// Into the node that made the input.
    Node(Rc<GradFn<B>>),
    /// Into a parameter's accumulated gradient.
    Param(Weak<ParamInner<B>>),
}

impl<B: Backend> Clone for Edge<B> {
    fn clone(&self) -> Self {
        match self {
            Edge::Node(node) => Edge::Node(node.clone()),
            Edge::Param(param) => Edge::Param(param.clone()),
        }
    }
}

pub(crate) struct GradFn<B: Backend> {
    pub(crate) name: &'static str,
    pub(crate) inputs: SmallVec<[Option<Edge<B>>; 3]>,
    /// Taken when run: a graph is differentiated once.
    pub(crate) backward: RefCell<Option<BackwardFn<B>>>,
    /// Gradient-free handles to the op's own outputs that the backward rule
    /// reads (softmax's output, layer norm's statistics), filled in once
    /// the op has run.
    pub(crate) saved_outputs: RefCell<SmallVec<[Tensor<B>; 2]>>,
}

/// Runs the backward pass from `root` (whose gradient is `seed`).
pub(crate) fn backward<B: Backend>(root: &Rc<GradFn<B>>, seed: Tensor<B>) -> Result<()> {
    let key = |node: &Rc<GradFn<B>>| Rc::as_ptr(node) as usize;
    // Post-order over the nodes reachable from the root, without recursion.
    let mut order: Vec<Rc<GradFn<B>>> = Vec::new();
    let mut visited: HashMap<usize, ()> = HashMap::new();
    let mut stack: Vec<(Rc<GradFn<B>>, usize)> = vec![(root.clone(), 0)];
    visited.insert(key(root), ());
    while let Some((node, next)) = stack.pop() {
        let child = node.inputs[next..]
            .iter()
            .enumerate()
            .find_map(|(i, edge)| match edge {
                Some(Edge::Node(child)) if !visited.contains_key(&key(child)) => {
                    Some((next + i, child.clone()))
                }
                _ => None,
            });
        match child {
            Some((i, child)) => {
                visited.insert(key(&child), ());
                stack.push((node, i + 1));
                stack.push((child, 0));
            }
            None => order.push(node),
        }
    }
    let mut grads: HashMap<usize, Tensor<B>> = HashMap::new();
    grads.insert(key(root), seed);
    for node in order.into_iter().rev() {
        let Some(grad) = grads.remove(&key(&node)) else {
            continue; // no gradient reached it
        };
        let run = node.backward.borrow_mut().take().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "backward through `{}` a second time: its saved tensors are gone",
                node.name
            ))
        })?;
        let saved = node.saved_outputs.take();
        let input_grads = run(&grad, &saved)?;
        drop((grad, saved));
        for (edge, input_grad) in node.inputs.iter().zip(input_grads) {
            let (Some(edge), Some(input_grad)) = (edge, input_grad) else {
                continue;
            };
            match edge {
                Edge::Node(child) => {
                    let total = match grads.remove(&key(child)) {
                        Some(sum) => sum.add(&input_grad)?,
                        None => input_grad,
                    };
                    // A gradient waiting for its consumers is cut from its
                    // history, as `Param::accumulate` does: recomputing it would
                    // replay the backward pass from the loss, a chain whose
                    // every level locks an activation, and which made a 12-layer
                    // MLP at 0.3 of its peak cost 9× instead of 1.8×. Only a
                    // few wait at once. Views keep their history.
                    total.cut_history()?;
                    grads.insert(key(child), total);
                }
                Edge::Param(param) => {
                    if let Some(param) = param.upgrade() {
                        param.accumulate(input_grad)?;
                    }
                }
            }
        }
    }
    Ok(())
}
