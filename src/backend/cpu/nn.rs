//! Neural-network kernels of the CPU backend, on packed row-major slices.

use crate::error::{Error, Result};
use crate::ops::Window2d;

/// Softmax (or log-softmax) over the middle axis of `(outer, len, inner)`.
pub fn softmax(x: &[f32], (outer, len, inner): (usize, usize, usize), log: bool) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| (o * len + l) * inner + i;
            let max = (0..len).map(|l| x[at(l)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = (0..len).map(|l| (x[at(l)] - max).exp()).sum();
            for l in 0..len {
                let shifted = x[at(l)] - max;
                out[at(l)] = if log {
                    shifted - sum.ln()
                } else {
                    shifted.exp() / sum
                };
            }
        }
    }
    out
}

/// Gradient of softmax (`y` its output) or log-softmax (`y` its output).
pub fn softmax_backward(
    grad: &[f32],
    y: &[f32],
    (outer, len, inner): (usize, usize, usize),
    log: bool,
) -> Vec<f32> {
    let mut out = vec![0.0; y.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| (o * len + l) * inner + i;
            if log {
                // d/dx log_softmax: g - softmax(x) * Σg
                let total: f32 = (0..len).map(|l| grad[at(l)]).sum();
                for l in 0..len {
                    out[at(l)] = grad[at(l)] - y[at(l)].exp() * total;
                }
            } else {
                // d/dx softmax: y * (g - Σ g·y)
                let dot: f32 = (0..len).map(|l| grad[at(l)] * y[at(l)]).sum();
                for l in 0..len {
                    out[at(l)] = y[at(l)] * (grad[at(l)] - dot);
                }
            }
        }
    }
    out
}

/// Layer norm over rows of length `d`: returns `(y, mean, rstd)`.
pub fn layer_norm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    d: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / d;
    let (mut y, mut means, mut rstds) = (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..d {
            y[r * d + j] = (row[j] - mean) * rstd * gamma[j] + beta[j];
        }
        means[r] = mean;
        rstds[r] = rstd;
    }
    (y, means, rstds)
}

/// Gradients of layer norm: `(dx, dgamma, dbeta)`.
pub fn layer_norm_backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    d: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / d;
    let (mut dx, mut dgamma, mut dbeta) = (vec![0.0; x.len()], vec![0.0; d], vec![0.0; d]);
    let mut xhat = vec![0.0; d];
    let mut dxhat = vec![0.0; d];
    for r in 0..rows {
        for j in 0..d {
            let i = r * d + j;
            xhat[j] = (x[i] - mean[r]) * rstd[r];
            dxhat[j] = dy[i] * gamma[j];
            dgamma[j] += dy[i] * xhat[j];
            dbeta[j] += dy[i];
        }
        let mean_dxhat = dxhat.iter().sum::<f32>() / d as f32;
        let mean_dxhat_xhat = dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f32>() / d as f32;
        for j in 0..d {
            dx[r * d + j] = rstd[r] * (dxhat[j] - mean_dxhat - xhat[j] * mean_dxhat_xhat);
        }
    }
    (dx, dgamma, dbeta)
}

/// Sizes of one convolution: input `[n, c, h, w]`, weight `[o, c, kh, kw]`,
/// output `[n, o, oh, ow]`.
pub struct ConvGeometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    window: Window2d,
}

impl ConvGeometry {
    pub fn new(
        input: &[usize],
        weight: &[usize],
        output: &[usize],
        window: &Window2d,
    ) -> ConvGeometry {
        ConvGeometry {
            n: input[0],
            c: input[1],
            h: input[2],
            w: input[3],
            o: weight[0],
            kh: weight[2],
            kw: weight[3],
            oh: output[2],
            ow: output[3],
            window: *window,
        }
    }

    /// Input coordinate read by output `(oy, ox)` at kernel tap `(ky, kx)`, if inside.
    fn source(&self, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
        let y = (oy * self.window.stride[0] + ky).checked_sub(self.window.padding[0])?;
        let x = (ox * self.window.stride[1] + kx).checked_sub(self.window.padding[1])?;
        (y < self.h && x < self.w).then_some((y, x))
    }

    /// Calls `f(input_index, weight_index, output_index)` for every multiply-add.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        for n in 0..self.n {
            for o in 0..self.o {
                for oy in 0..self.oh {
                    for ox in 0..self.ow {
                        let out = ((n * self.o + o) * self.oh + oy) * self.ow + ox;
                        for c in 0..self.c {
                            for ky in 0..self.kh {
                                for kx in 0..self.kw {
                                    if let Some((y, x)) = self.source(oy, ox, ky, kx) {
                                        let input = ((n * self.c + c) * self.h + y) * self.w + x;
                                        let weight =
                                            ((o * self.c + c) * self.kh + ky) * self.kw + kx;
                                        f(input, weight, out);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn conv2d(x: &[f32], weight: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let mut out = vec![0.0; g.n * g.o * g.oh * g.ow];
    g.for_each_tap(|i, w, o| out[o] += x[i] * weight[w]);
    out
}

pub fn conv2d_backward_data(dy: &[f32], weight: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let mut dx = vec![0.0; g.n * g.c * g.h * g.w];
    g.for_each_tap(|i, w, o| dx[i] += dy[o] * weight[w]);
    dx
}

pub fn conv2d_backward_weight(dy: &[f32], x: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let mut dw = vec![0.0; g.o * g.c * g.kh * g.kw];
    g.for_each_tap(|i, w, o| dw[w] += dy[o] * x[i]);
    dw
}

/// Sizes of one pooling: input `[n, c, h, w]`, output `[n, c, oh, ow]`.
pub struct PoolGeometry {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kernel: [usize; 2],
    window: Window2d,
}

impl PoolGeometry {
    pub fn new(
        input: &[usize],
        output: &[usize],
        kernel: [usize; 2],
        window: &Window2d,
    ) -> PoolGeometry {
        PoolGeometry {
            planes: input[0] * input[1],
            h: input[2],
            w: input[3],
            oh: output[2],
            ow: output[3],
            kernel,
            window: *window,
        }
    }

    /// Calls `f(output_index, inside)` per output with the input indices of its window that lie inside.
    fn for_each_window(&self, mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>)) {
        for p in 0..self.planes {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let y0 =
                        (oy * self.window.stride[0]) as isize - self.window.padding[0] as isize;
                    let x0 =
                        (ox * self.window.stride[1]) as isize - self.window.padding[1] as isize;
                    let mut inside = (0..self.kernel[0]).flat_map(move |ky| {
                        (0..self.kernel[1]).filter_map(move |kx| {
                            let (y, x) = (y0 + ky as isize, x0 + kx as isize);
                            let ok =
                                y >= 0 && x >= 0 && (y as usize) < self.h && (x as usize) < self.w;
                            ok.then(|| (p * self.h + y as usize) * self.w + x as usize)
                        })
                    });
                    f((p * self.oh + oy) * self.ow + ox, &mut inside);
                }
            }
        }
    }

    fn window_area(&self) -> f32 {
        (self.kernel[0] * self.kernel[1]) as f32
    }
}

pub fn max_pool2d(x: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut out = vec![0.0; g.planes * g.oh * g.ow];
    g.for_each_window(|o, inside| out[o] = inside.map(|i| x[i]).fold(f32::NEG_INFINITY, f32::max));
    out
}

pub fn max_pool2d_backward(dy: &[f32], x: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut dx = vec![0.0; x.len()];
    g.for_each_window(|o, inside| {
        // The first maximum in window order receives the gradient.
        let mut best: Option<usize> = None;
        for i in inside {
            if best.is_none_or(|b| x[i] > x[b]) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            dx[b] += dy[o];
        }
    });
    dx
}

pub fn avg_pool2d(x: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut out = vec![0.0; g.planes * g.oh * g.ow];
    let area = g.window_area();
    g.for_each_window(|o, inside| out[o] = inside.map(|i| x[i]).sum::<f32>() / area);
    out
}

pub fn avg_pool2d_backward(dy: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut dx = vec![0.0; g.planes * g.h * g.w];
    let area = g.window_area();
    g.for_each_window(|o, inside| inside.for_each(|i| dx[i] += dy[o] / area));
    dx
}

/// Converts an f32 that should hold a class or row index.
fn index(value: f32, limit: usize, what: &str) -> Result<usize> {
    if value.fract() != 0.0 || value < 0.0 || value >= limit as f32 {
        return Err(Error::backend(
            "cpu",
            format!("{what} {value} is not an integer in 0..{limit}"),
        ));
    }
    Ok(value as usize)
}

pub fn embedding(weight: &[f32], indices: &[f32], d: usize) -> Result<Vec<f32>> {
    let vocab = weight.len() / d.max(1);
    let mut out = Vec::with_capacity(indices.len() * d);
    for &v in indices {
        let row = index(v, vocab, "embedding index")?;
        out.extend_from_slice(&weight[row * d..(row + 1) * d]);
    }
    Ok(out)
}

pub fn embedding_backward(dy: &[f32], indices: &[f32], vocab: usize, d: usize) -> Result<Vec<f32>> {
    let mut dw = vec![0.0; vocab * d];
    for (k, &v) in indices.iter().enumerate() {
        let row = index(v, vocab, "embedding index")?;
        for j in 0..d {
            dw[row * d + j] += dy[k * d + j];
        }
    }
    Ok(dw)
}

fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

pub fn cross_entropy(logits: &[f32], targets: &[f32], classes: usize) -> Result<f32> {
    let n = targets.len();
    let mut total = 0.0f32;
    for (r, &t) in targets.iter().enumerate() {
        let row = &logits[r * classes..(r + 1) * classes];
        total += log_sum_exp(row) - row[index(t, classes, "target class")?];
    }
    Ok(total / n.max(1) as f32)
}

pub fn cross_entropy_backward(
    grad: f32,
    logits: &[f32],
    targets: &[f32],
    classes: usize,
) -> Result<Vec<f32>> {
    let n = targets.len().max(1) as f32;
    let mut out = vec![0.0; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        let row = &logits[r * classes..(r + 1) * classes];
        let lse = log_sum_exp(row);
        let target = index(t, classes, "target class")?;
        for j in 0..classes {
            let p = (row[j] - lse).exp();
            let onehot = if j == target { 1.0 } else { 0.0 };
            out[r * classes + j] = grad * (p - onehot) / n;
        }
    }
    Ok(out)
}
