//! A small layer library: enough for an MLP, a ResNet and a GPT-style
//! decoder. Each layer owns its [`Param`]s and lists them for optimisers.

use rand::rngs::StdRng;
use rand::Rng;

use super::{Param, Session, Tensor};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::ops::Window2d;

/// Uniform in ±`bound`.
fn uniform(rng: &mut StdRng, n: usize, bound: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-bound..=bound)).collect()
}

/// `x W + b` over the last axis.
pub struct Linear<B: Backend> {
    /// `W`, `[inputs, outputs]`.
    pub weight: Param<B>,
    /// `b`, `[outputs]`.
    pub bias: Param<B>,
}

impl<B: Backend> Linear<B> {
    /// He-uniform weights (variance 2 / fan-in), zero bias.
    pub fn new(
        session: &Session<B>,
        inputs: usize,
        outputs: usize,
        rng: &mut StdRng,
    ) -> Result<Self> {
        let bound = (6.0 / inputs.max(1) as f32).sqrt();
        Ok(Linear {
            weight: session.param(&uniform(rng, inputs * outputs, bound), &[inputs, outputs])?,
            bias: session.param(&vec![0.0; outputs], &[outputs])?,
        })
    }

    /// `x [.., inputs]` → `[.., outputs]`.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.matmul(&self.weight.value())?.add(&self.bias.value())
    }

    /// The layer's parameters, for an optimiser.
    pub fn params(&self) -> Vec<Param<B>> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

/// Layer norm over the last axis with a learnt scale and shift.
pub struct LayerNorm<B: Backend> {
    /// The scale, `[features]` (ones at first).
    pub gamma: Param<B>,
    /// The shift, `[features]` (zeros at first).
    pub beta: Param<B>,
    /// Added to the variance before the square root (1e-5).
    pub eps: f32,
}

impl<B: Backend> LayerNorm<B> {
    /// A layer norm over `features` values: unit scale, zero shift.
    pub fn new(session: &Session<B>, features: usize) -> Result<Self> {
        Ok(LayerNorm {
            gamma: session.param(&vec![1.0; features], &[features])?,
            beta: session.param(&vec![0.0; features], &[features])?,
            eps: 1e-5,
        })
    }

    /// `x [.., features]` normalised over its last axis, then scaled and shifted.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.layer_norm(&self.gamma.value(), &self.beta.value(), self.eps)
    }

    /// The layer's parameters, for an optimiser.
    pub fn params(&self) -> Vec<Param<B>> {
        vec![self.gamma.clone(), self.beta.clone()]
    }
}

/// A lookup table of `count` vectors of `dim` values.
pub struct Embedding<B: Backend> {
    /// The table, `[count, dim]`.
    pub weight: Param<B>,
}

impl<B: Backend> Embedding<B> {
    /// A table of `count` vectors of `dim` values, uniform in ±0.1.
    pub fn new(session: &Session<B>, count: usize, dim: usize, rng: &mut StdRng) -> Result<Self> {
        Ok(Embedding {
            weight: session.param(&uniform(rng, count * dim, 0.1), &[count, dim])?,
        })
    }

    /// `indices [..]` (integral values) → `[.., dim]`.
    pub fn forward(&self, indices: &Tensor<B>) -> Result<Tensor<B>> {
        self.weight.value().embedding(indices)
    }

    /// The layer's parameters, for an optimiser.
    pub fn params(&self) -> Vec<Param<B>> {
        vec![self.weight.clone()]
    }
}

/// 2-D convolution `[n, c, h, w] → [n, o, h', w']` with a per-channel bias.
pub struct Conv2d<B: Backend> {
    /// The kernels, `[outputs, inputs, k, k]`.
    pub weight: Param<B>,
    /// One value per output channel, `[outputs]`.
    pub bias: Param<B>,
    /// Stride and padding.
    pub window: Window2d,
}

impl<B: Backend> Conv2d<B> {
    /// A `k × k` kernel with the given stride and `k / 2` padding ("same" at stride 1).
    pub fn new(
        session: &Session<B>,
        inputs: usize,
        outputs: usize,
        k: usize,
        stride: usize,
        rng: &mut StdRng,
    ) -> Result<Self> {
        let fan_in = inputs * k * k;
        let bound = (6.0 / fan_in.max(1) as f32).sqrt();
        Ok(Conv2d {
            weight: session.param(
                &uniform(rng, outputs * fan_in, bound),
                &[outputs, inputs, k, k],
            )?,
            bias: session.param(&vec![0.0; outputs], &[outputs])?,
            window: Window2d {
                stride: [stride, stride],
                padding: [k / 2, k / 2],
            },
        })
    }

    /// `x [n, inputs, h, w]` → `[n, outputs, h', w']`.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let channels = self.bias.dims()[0];
        let bias = self.bias.value().reshape(&[1, channels, 1, 1])?;
        x.conv2d(&self.weight.value(), self.window)?.add(&bias)
    }

    /// The layer's parameters, for an optimiser.
    pub fn params(&self) -> Vec<Param<B>> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

/// Multi-head causal self-attention over `[batch, time, dim]`.
pub struct CausalSelfAttention<B: Backend> {
    /// The query projection, `dim → dim`.
    pub query: Linear<B>,
    /// The key projection, `dim → dim`.
    pub key: Linear<B>,
    /// The value projection, `dim → dim`.
    pub value: Linear<B>,
    /// The projection of the merged heads, `dim → dim`.
    pub output: Linear<B>,
    /// Number of heads; each attends over `dim / heads` features.
    pub heads: usize,
}

impl<B: Backend> CausalSelfAttention<B> {
    /// Attention over `dim` features in `heads` heads; an error unless
    /// `heads` divides `dim`.
    pub fn new(session: &Session<B>, dim: usize, heads: usize, rng: &mut StdRng) -> Result<Self> {
        if heads == 0 || dim % heads != 0 {
            return Err(Error::InvalidArgument(format!(
                "attention: {dim} features do not split into {heads} heads"
            )));
        }
        Ok(CausalSelfAttention {
            query: Linear::new(session, dim, dim, rng)?,
            key: Linear::new(session, dim, dim, rng)?,
            value: Linear::new(session, dim, dim, rng)?,
            output: Linear::new(session, dim, dim, rng)?,
            heads,
        })
    }

    /// `mask` is `[time, time]`: 0 where a position may attend, a large
    /// negative number where it may not (see [`causal_mask`]).
    pub fn forward(&self, x: &Tensor<B>, mask: &Tensor<B>) -> Result<Tensor<B>> {
        let (b, t, d) = match x.dims() {
            &[b, t, d] => (b, t, d),
            dims => {
                return Err(Error::InvalidArgument(format!(
                    "attention input of dims {dims:?}: expected [batch, time, dim]"
                )))
            }
        };
        let h = self.heads;
        let split = |y: Tensor<B>| y.reshape(&[b, t, h, d / h])?.transpose(1, 2);
        let q = split(self.query.forward(x)?)?;
        let k = split(self.key.forward(x)?)?;
        let v = split(self.value.forward(x)?)?;
        let scores = q
            .matmul(&k.transpose(-1, -2)?)?
            .mul_scalar(1.0 / ((d / h) as f32).sqrt())?
            .add(mask)?;
        let attended = scores.softmax(-1)?.matmul(&v)?;
        let merged = attended.transpose(1, 2)?.reshape(&[b, t, d])?;
        self.output.forward(&merged)
    }

    /// The layer's parameters, for an optimiser.
    pub fn params(&self) -> Vec<Param<B>> {
        [&self.query, &self.key, &self.value, &self.output]
            .into_iter()
            .flat_map(Linear::params)
            .collect()
    }
}

/// `[time, time]`: 0 on and below the diagonal, −10⁹ above (no attending ahead).
pub fn causal_mask<B: Backend>(session: &Session<B>, time: usize) -> Result<Tensor<B>> {
    let data: Vec<f32> = (0..time * time)
        .map(|i| if i % time > i / time { -1e9 } else { 0.0 })
        .collect();
    session.tensor(&data, &[time, time])
}

/// A pre-norm decoder block: `x + attn(ln(x))`, then `x + mlp(ln(x))`.
pub struct DecoderBlock<B: Backend> {
    /// The norm before attention.
    pub norm1: LayerNorm<B>,
    /// The attention sublayer.
    pub attention: CausalSelfAttention<B>,
    /// The norm before the MLP.
    pub norm2: LayerNorm<B>,
    /// The MLP's expansion, `dim → 4·dim` (GELU follows).
    pub up: Linear<B>,
    /// The MLP's projection back, `4·dim → dim`.
    pub down: Linear<B>,
}

impl<B: Backend> DecoderBlock<B> {
    /// A block over `dim` features with `heads` attention heads.
    pub fn new(session: &Session<B>, dim: usize, heads: usize, rng: &mut StdRng) -> Result<Self> {
        Ok(DecoderBlock {
            norm1: LayerNorm::new(session, dim)?,
            attention: CausalSelfAttention::new(session, dim, heads, rng)?,
            norm2: LayerNorm::new(session, dim)?,
            up: Linear::new(session, dim, 4 * dim, rng)?,
            down: Linear::new(session, 4 * dim, dim, rng)?,
        })
    }

    /// `x [batch, time, dim]` → the same shape; `mask` as for
    /// [`CausalSelfAttention::forward`].
    pub fn forward(&self, x: &Tensor<B>, mask: &Tensor<B>) -> Result<Tensor<B>> {
        let x = x.add(&self.attention.forward(&self.norm1.forward(x)?, mask)?)?;
        let hidden = self.up.forward(&self.norm2.forward(&x)?)?.gelu()?;
        x.add(&self.down.forward(&hidden)?)
    }

    /// The layer's parameters, for an optimiser.
    pub fn params(&self) -> Vec<Param<B>> {
        let mut params = self.norm1.params();
        params.extend(self.attention.params());
        params.extend(self.norm2.params());
        params.extend(self.up.params());
        params.extend(self.down.params());
        params
    }
}
