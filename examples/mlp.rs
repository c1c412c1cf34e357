//! Trains a multi-layer perceptron with the eager API (autograd, SGD),
//! first unbounded to measure its peak memory, then under a fraction of
//! that peak. DTR evicts and recomputes activations so the budgeted run
//! fits; the losses must be bitwise identical to the unbounded run.
//!
//! ```text
//! cargo run --release --example mlp -- --budget-ratio 0.5
//! ```

mod common;

use std::process::ExitCode;

use dtr::eager::{nn, optim, Session};
use dtr::Backend;
use rand::Rng;

#[derive(clap::Parser, Debug)]
#[command(about = "Train an MLP under a memory budget with DTR")]
struct Cli {
    #[command(flatten)]
    run: common::RunArgs,
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    features: usize,
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Number of linear layers (hidden layers + 1).
    #[arg(long, default_value_t = 12)]
    layers: usize,
    #[arg(long, default_value_t = 10)]
    classes: usize,
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
}

impl common::Model for Cli {
    fn name(&self) -> &'static str {
        "mlp"
    }

    fn run_args(&self) -> &common::RunArgs {
        &self.run
    }

    fn validate(&self) -> Result<(), String> {
        if self.layers == 0 {
            return Err("--layers must be at least 1".into());
        }
        Ok(())
    }

    fn train<B: Backend>(
        &self,
        s: &Session<B>,
        steps: usize,
        seed: u64,
        laps: &mut common::Laps,
    ) -> dtr::Result<Vec<f32>> {
        let mut rng = s.rng(seed);
        // Labels from a fixed random linear teacher, so the task is learnable.
        let x: Vec<f32> = (0..self.batch * self.features)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let teacher: Vec<f32> = (0..self.features * self.classes)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let labels: Vec<f32> = x
            .chunks(self.features)
            .map(|row| {
                let score = |c: usize| -> f32 {
                    row.iter()
                        .enumerate()
                        .map(|(f, v)| v * teacher[f * self.classes + c])
                        .sum()
                };
                (0..self.classes)
                    .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                    .unwrap_or(0) as f32
            })
            .collect();
        let x = s.tensor(&x, &[self.batch, self.features])?;
        let y = s.tensor(&labels, &[self.batch])?;
        let widths: Vec<usize> = std::iter::once(self.features)
            .chain(std::iter::repeat_n(
                self.hidden,
                self.layers.saturating_sub(1),
            ))
            .chain(std::iter::once(self.classes))
            .collect();
        let layers = widths
            .windows(2)
            .map(|w| nn::Linear::new(s, w[0], w[1], &mut rng))
            .collect::<dtr::Result<Vec<_>>>()?;
        let params: Vec<_> = layers.iter().flat_map(nn::Linear::params).collect();
        let sgd = optim::Sgd::new(self.lr);
        let mut losses = Vec::new();
        for _ in 0..steps {
            let mut h = x.clone();
            for (i, layer) in layers.iter().enumerate() {
                h = layer.forward(&h)?;
                if i + 1 < layers.len() {
                    h = h.relu()?;
                }
            }
            let loss = h.cross_entropy(&y)?;
            losses.push(loss.item()?);
            loss.backward()?;
            sgd.step(&params)?;
            laps.lap();
        }
        Ok(losses)
    }
}

fn main() -> ExitCode {
    common::main::<Cli>()
}
