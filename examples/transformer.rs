//! Trains a GPT-style decoder (token and position embeddings, pre-norm
//! causal attention blocks, Adam) on a synthetic token stream, unbounded
//! and then under a fraction of its peak memory.
//!
//! ```text
//! cargo run --release --example transformer -- --budget-ratio 0.3
//! ```

mod common;

use std::process::ExitCode;

use dtr::eager::{nn, optim, Session};
use dtr::Backend;
use rand::Rng;

#[derive(clap::Parser, Debug)]
#[command(about = "Train a GPT-style decoder under a memory budget with DTR")]
struct Cli {
    #[command(flatten)]
    run: common::RunArgs,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 64)]
    context: usize,
    #[arg(long, default_value_t = 64)]
    vocab: usize,
    #[arg(long, default_value_t = 32)]
    dim: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
}

impl common::Model for Cli {
    fn name(&self) -> &'static str {
        "transformer"
    }

    fn run_args(&self) -> &common::RunArgs {
        &self.run
    }

    fn validate(&self) -> Result<(), String> {
        if self.heads == 0 || self.dim % self.heads != 0 || self.context == 0 || self.vocab == 0 {
            return Err(
                "--dim must split into --heads, and --context and --vocab be positive".into(),
            );
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
        let (b, t, v) = (self.batch, self.context, self.vocab);
        let mut rng = s.rng(seed);
        let tokens = nn::Embedding::new(s, v, self.dim, &mut rng)?;
        let positions = nn::Embedding::new(s, t, self.dim, &mut rng)?;
        let blocks = (0..self.blocks)
            .map(|_| nn::DecoderBlock::new(s, self.dim, self.heads, &mut rng))
            .collect::<dtr::Result<Vec<_>>>()?;
        let norm = nn::LayerNorm::new(s, self.dim)?;
        let head = nn::Linear::new(s, self.dim, v, &mut rng)?;
        let mut params = tokens.params();
        params.extend(positions.params());
        params.extend(blocks.iter().flat_map(nn::DecoderBlock::params));
        params.extend(norm.params());
        params.extend(head.params());
        let mut adam = optim::Adam::new(self.lr);
        let mask = nn::causal_mask(s, t)?;
        let position_ids: Vec<f32> = (0..b * t).map(|i| (i % t) as f32).collect();
        let position_ids = s.tensor(&position_ids, &[b, t])?;
        let mut losses = Vec::new();
        for _ in 0..steps {
            // A stream with structure to learn: each sequence counts up by a
            // random stride from a random start, modulo the vocabulary.
            let mut inputs = Vec::with_capacity(b * t);
            let mut targets = Vec::with_capacity(b * t);
            for _ in 0..b {
                let (start, stride) = (rng.gen_range(0..v), rng.gen_range(1..4));
                for i in 0..t {
                    inputs.push(((start + i * stride) % v) as f32);
                    targets.push(((start + (i + 1) * stride) % v) as f32);
                }
            }
            let x = s.tensor(&inputs, &[b, t])?;
            let y = s.tensor(&targets, &[b * t])?;
            let mut h = tokens
                .forward(&x)?
                .add(&positions.forward(&position_ids)?)?;
            for block in &blocks {
                h = block.forward(&h, &mask)?;
            }
            let logits = head.forward(&norm.forward(&h)?)?.reshape(&[b * t, v])?;
            let loss = logits.cross_entropy(&y)?;
            losses.push(loss.item()?);
            loss.backward()?;
            adam.step(&params)?;
            laps.lap();
        }
        Ok(losses)
    }
}

fn main() -> ExitCode {
    common::main::<Cli>()
}
