//! Synthetic workloads as traces: forward and backward passes with every
//! tensor released at its last use, as a framework would.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smallvec::smallvec;

use crate::error::Result;
use crate::trace::{Trace, TraceBuilder, TraceTensor};

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workload {
    /// `length` layers, each a unit op on the previous activation; the
    /// backward pass reads each layer's input.
    Chain {
        /// Layers (at least 1).
        length: usize,
    },
    /// A chain with a residual connection around every `skip` layers.
    Resnet {
        /// Layers (at least 1).
        length: usize,
        /// Layers a residual connection spans (0 counts as 1).
        skip: usize,
    },
    /// `depth` levels down (each half the size) and back up, each up level
    /// reading the matching down level.
    Unet {
        /// Levels (at least 1).
        depth: usize,
    },
    /// `nodes` ops, each reading one to three random earlier tensors, with
    /// random sizes and costs.
    Random {
        /// Ops (at least 1).
        nodes: usize,
        /// Seeds the choice of inputs, sizes and costs.
        seed: u64,
    },
}

/// Bytes of a unit activation.
pub const UNIT: u64 = 1 << 20;

struct Builder {
    trace: TraceBuilder,
    line: usize,
}

impl Builder {
    fn op(
        &mut self,
        name: &str,
        inputs: &[TraceTensor],
        bytes: u64,
        cost: u64,
    ) -> Result<TraceTensor> {
        self.line += 1;
        let label = |i: usize| format!("input {i} of `{name}`");
        let made = self.trace.apply(
            self.line,
            name,
            None,
            inputs.into(),
            &[(bytes, None, None)],
            cost,
            None,
            &label,
        )?;
        Ok(made[0])
    }

    fn put(&mut self, bytes: u64) -> Result<TraceTensor> {
        self.line += 1;
        self.trace.put(self.line, bytes, None, None)
    }

    fn del(&mut self, tensor: TraceTensor) -> Result<()> {
        self.line += 1;
        self.trace
            .del(self.line, tensor, &format!("tensor {tensor}"))
    }
}

/// The largest length, depth or node count: 10⁸ ops take tens of GB as a
/// trace.
pub const MAX_SIZE: usize = 100_000_000;

/// Builds the workload's trace (named `source` in messages).
pub fn generate(workload: Workload, source: &str) -> Result<Trace> {
    let (flag, size) = match workload {
        Workload::Chain { length } | Workload::Resnet { length, .. } => ("--length", length),
        Workload::Unet { depth } => ("--depth", depth),
        Workload::Random { nodes, .. } => ("--nodes", nodes),
    };
    if size == 0 {
        return Err(crate::error::Error::InvalidArgument(format!(
            "{flag} must be at least 1"
        )));
    }
    if size > MAX_SIZE {
        return Err(crate::error::Error::InvalidArgument(format!(
            "{flag} must be at most {MAX_SIZE} (a trace of {size} would not fit in memory)"
        )));
    }
    let mut b = Builder {
        trace: TraceBuilder::new(source),
        line: 0,
    };
    match workload {
        Workload::Chain { length } => chain(&mut b, length, 0)?,
        Workload::Resnet { length, skip } => chain(&mut b, length, skip.max(1))?,
        Workload::Unet { depth } => unet(&mut b, depth)?,
        Workload::Random { nodes, seed } => random(&mut b, nodes, seed)?,
    }
    Ok(b.trace.finish())
}

/// Forward `x_i = f(x_{i-1})` (plus `x_{i-skip}` every `skip` layers when
/// `skip > 0`), then backward `g_{i-1} = f'(g_i, x_{i-1})`, with the
/// residual gradient added where a skip began.
fn chain(b: &mut Builder, length: usize, skip: usize) -> Result<()> {
    let mut xs = vec![b.put(UNIT)?];
    for i in 1..=length {
        let mut inputs: smallvec::SmallVec<[TraceTensor; 4]> = smallvec![xs[i - 1]];
        if skip > 0 && i % skip == 0 && i >= skip {
            inputs.push(xs[i - skip]);
        }
        xs.push(b.op(
            if inputs.len() > 1 { "block" } else { "layer" },
            &inputs,
            UNIT,
            1,
        )?);
    }
    let mut grad = b.op("loss_backward", &[xs[length]], UNIT, 1)?;
    // Residual gradients waiting to be added at the layer a skip began from.
    let mut pending: Vec<Option<TraceTensor>> = vec![None; length + 1];
    for i in (1..=length).rev() {
        if skip > 0 && i % skip == 0 && i >= skip {
            pending[i - skip] = Some(b.op("residual_backward", &[grad], UNIT, 1)?);
        }
        let mut next = b.op("layer_backward", &[grad, xs[i - 1]], UNIT, 1)?;
        b.del(grad)?;
        b.del(xs[i])?;
        if let Some(residual) = pending[i - 1].take() {
            let sum = b.op("add", &[next, residual], UNIT, 1)?;
            b.del(next)?;
            b.del(residual)?;
            next = sum;
        }
        grad = next;
    }
    b.del(grad)?;
    b.del(xs[0])
}

/// Down: `d_i = down(d_{i-1})`, half the bytes each level; up: `u_i =
/// up(u_{i+1}, d_i)`; then the backward pass in reverse, reading both.
fn unet(b: &mut Builder, depth: usize) -> Result<()> {
    let size = |level: usize| (UNIT << depth.min(20)) >> level.min(40);
    let mut down = vec![b.put(size(0))?];
    for level in 1..=depth {
        down.push(b.op(
            "down",
            &[down[level - 1]],
            size(level),
            size(level - 1) / UNIT.max(1) + 1,
        )?);
    }
    let mut ups = vec![0; depth + 1];
    ups[depth] = down[depth];
    for level in (0..depth).rev() {
        ups[level] = b.op(
            "up",
            &[ups[level + 1], down[level]],
            size(level),
            size(level) / UNIT.max(1) + 1,
        )?;
    }
    let mut grad = b.op("loss_backward", &[ups[0]], size(0), 1)?;
    for level in 0..depth {
        let up_grad = b.op(
            "up_backward",
            &[grad, ups[level + 1], down[level]],
            size(level + 1),
            2,
        )?;
        let skip_grad = b.op("skip_backward", &[grad, down[level]], size(level), 1)?;
        b.del(grad)?;
        b.del(ups[level])?;
        let down_grad = b.op("down_backward", &[up_grad, down[level]], size(level), 2)?;
        let sum = b.op("add", &[down_grad, skip_grad], size(level), 1)?;
        for t in [up_grad, skip_grad, down_grad] {
            b.del(t)?;
        }
        if level > 0 {
            b.del(down[level])?;
        }
        grad = sum;
    }
    b.del(ups[depth])?;
    b.del(grad)?;
    b.del(down[0])
}

/// A random DAG: each op reads one to three of the live tensors; a tensor
/// is released once no later op will read it.
fn random(b: &mut Builder, nodes: usize, seed: u64) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Plan first (who reads what), so releases can follow last uses.
    let mut sizes = vec![UNIT];
    let mut plan: Vec<(Vec<usize>, u64, u64)> = Vec::new();
    for i in 1..=nodes {
        let arity = rng.gen_range(1..=3usize.min(i));
        let mut inputs: Vec<usize> = (0..arity)
            .map(|_| rng.gen_range(i.saturating_sub(8)..i))
            .collect();
        inputs.sort_unstable();
        inputs.dedup();
        let bytes = UNIT * rng.gen_range(1..=4);
        plan.push((inputs, bytes, rng.gen_range(1..=10)));
        sizes.push(bytes);
    }
    let mut last_use = vec![0usize; nodes + 1];
    for (op, (inputs, _, _)) in plan.iter().enumerate() {
        for &input in inputs {
            last_use[input] = op + 1;
        }
    }
    let mut tensors = vec![b.put(sizes[0])?];
    for (op, (inputs, bytes, cost)) in plan.iter().enumerate() {
        let ids: Vec<TraceTensor> = inputs.iter().map(|&i| tensors[i]).collect();
        tensors.push(b.op("node", &ids, *bytes, *cost)?);
        for &input in inputs {
            if last_use[input] == op + 1 {
                b.del(tensors[input])?;
            }
        }
    }
    // Tensors no op reads are outputs: released at the end.
    for (i, &tensor) in tensors.iter().enumerate() {
        if last_use[i] == 0 {
            b.del(tensor)?;
        }
    }
    Ok(())
}
