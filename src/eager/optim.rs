//! Optimisers. Each step computes new parameter values with ordinary ops
//! (no gradient recorded), then [`Param::set`] detaches them from their
//! history, so a training loop does not keep past steps alive.

use super::Param;
use crate::backend::Backend;
use crate::error::Result;

/// Plain stochastic gradient descent: `p ← p − lr · g`.
pub struct Sgd {
    /// The learning rate.
    pub lr: f32,
}

impl Sgd {
    /// SGD with learning rate `lr`.
    pub fn new(lr: f32) -> Sgd {
        Sgd { lr }
    }

    /// Updates every parameter that has a gradient, then clears the gradients.
    pub fn step<B: Backend>(&self, params: &[Param<B>]) -> Result<()> {
        for param in params {
            let Some(grad) = param.grad() else { continue };
            let value = param.value();
            let updated = value
                .session()
                .no_grad(|| value.sub(&grad.mul_scalar(self.lr)?))?;
            param.set(updated)?;
            param.zero_grad();
        }
        Ok(())
    }
}

/// Adam (Kingma and Ba) with bias correction; its moments live in the
/// interpreter like any tensor, detached after each step.
pub struct Adam<B: Backend> {
    /// The learning rate.
    pub lr: f32,
    /// Decay rates of the first and second moments (0.9, 0.999).
    pub betas: (f32, f32),
    /// Added to the denominator for stability (1e-8).
    pub eps: f32,
    steps: i32,
    /// First and second moments, one pair per parameter, in `step`'s order.
    moments: Vec<(Param<B>, Param<B>)>,
}

impl<B: Backend> Adam<B> {
    /// Adam with learning rate `lr` and the usual defaults for the rest.
    pub fn new(lr: f32) -> Adam<B> {
        Adam {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            steps: 0,
            moments: Vec::new(),
        }
    }

    /// Updates every parameter that has a gradient (pass the same list, in
    /// the same order, each step), then clears the gradients.
    pub fn step(&mut self, params: &[Param<B>]) -> Result<()> {
        self.steps += 1;
        let (b1, b2) = self.betas;
        let correction1 = 1.0 - b1.powi(self.steps);
        let correction2 = 1.0 - b2.powi(self.steps);
        for (i, param) in params.iter().enumerate() {
            let Some(grad) = param.grad() else { continue };
            let value = param.value();
            let session = value.session().clone();
            if self.moments.len() <= i {
                let zeros = vec![0.0; param.dims().iter().product()];
                self.moments.push((
                    session.param(&zeros, &param.dims())?,
                    session.param(&zeros, &param.dims())?,
                ));
            }
            let (m, v) = &self.moments[i];
            let (new_m, new_v, updated) = session.no_grad(|| -> Result<_> {
                let new_m = m.value().mul_scalar(b1)?.add(&grad.mul_scalar(1.0 - b1)?)?;
                let new_v = v
                    .value()
                    .mul_scalar(b2)?
                    .add(&grad.mul(&grad)?.mul_scalar(1.0 - b2)?)?;
                let denominator = new_v
                    .mul_scalar(1.0 / correction2)?
                    .sqrt()?
                    .add_scalar(self.eps)?;
                let step = new_m.mul_scalar(self.lr / correction1)?.div(&denominator)?;
                Ok((new_m, new_v, value.sub(&step)?))
            })?;
            m.set(new_m)?;
            v.set(new_v)?;
            param.set(updated)?;
            param.zero_grad();
        }
        Ok(())
    }
}
