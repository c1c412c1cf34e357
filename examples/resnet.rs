//! Trains a narrow ResNet-32 (3×3 convolutions, five residual blocks per
//! stage as in He et al.'s CIFAR networks, strided downsampling, average
//! pooling) on synthetic CIFAR-sized images (3 × 32 × 32, 10 classes),
//! unbounded and then under a fraction of its peak memory.
//!
//! ```text
//! cargo run --release --example resnet -- --budget-ratio 0.5
//! ```

mod common;

use std::process::ExitCode;

use dtr::eager::{nn, optim, Session, Tensor};
use dtr::{Backend, Window2d};
use rand::Rng;

#[derive(clap::Parser, Debug)]
#[command(about = "Train a ResNet under a memory budget with DTR")]
struct Cli {
    #[command(flatten)]
    run: common::RunArgs,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Channels of the first stage (doubled at each later stage).
    #[arg(long, default_value_t = 8)]
    width: usize,
    /// Residual blocks per stage (three stages, at 32², 16² and 8²); 5 is
    /// ResNet-32, the model of the DTR authors' ResNet log.
    #[arg(long, default_value_t = 5)]
    blocks: usize,
    /// Image side (CIFAR: 32).
    #[arg(long, default_value_t = 32)]
    image: usize,
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
}

/// `relu(x + conv(relu(conv(x))))`, or with a strided 1×1-free shortcut:
/// when the block downsamples, the shortcut is an average pool and the
/// extra channels come from a 1×1-equivalent 3×3 projection.
struct Block<B: Backend> {
    first: nn::Conv2d<B>,
    second: nn::Conv2d<B>,
    shortcut: Option<nn::Conv2d<B>>,
}

impl<B: Backend> Block<B> {
    fn forward(&self, x: &Tensor<B>) -> dtr::Result<Tensor<B>> {
        let h = self.first.forward(x)?.relu()?;
        let h = self.second.forward(&h)?.mul_scalar(0.5)?;
        let skip = match &self.shortcut {
            Some(projection) => projection.forward(x)?,
            None => x.clone(),
        };
        h.add(&skip)?.relu()
    }
}

impl common::Model for Cli {
    fn name(&self) -> &'static str {
        "resnet"
    }

    fn run_args(&self) -> &common::RunArgs {
        &self.run
    }

    fn validate(&self) -> Result<(), String> {
        if self.batch == 0 || self.width == 0 || self.image < 4 {
            return Err("--batch and --width must be positive and --image at least 4".into());
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
        let (n, side, classes) = (self.batch, self.image, 10);
        let mut rng = s.rng(seed);
        let stem = nn::Conv2d::new(s, 3, self.width, 3, 1, &mut rng)?;
        let mut blocks = Vec::new();
        let mut channels = self.width;
        for stage in 0..3 {
            for i in 0..self.blocks {
                let down = stage > 0 && i == 0;
                let (inputs, stride) = if down { (channels, 2) } else { (channels, 1) };
                let outputs = if down { channels * 2 } else { channels };
                blocks.push(Block {
                    first: nn::Conv2d::new(s, inputs, outputs, 3, stride, &mut rng)?,
                    second: nn::Conv2d::new(s, outputs, outputs, 3, 1, &mut rng)?,
                    shortcut: if down {
                        Some(nn::Conv2d::new(s, inputs, outputs, 3, 2, &mut rng)?)
                    } else {
                        None
                    },
                });
                channels = outputs;
            }
        }
        let head = nn::Linear::new(s, channels, classes, &mut rng)?;
        let mut params = stem.params();
        for b in &blocks {
            params.extend(b.first.params());
            params.extend(b.second.params());
            params.extend(b.shortcut.iter().flat_map(nn::Conv2d::params));
        }
        params.extend(head.params());
        let sgd = optim::Sgd::new(self.lr);
        // Each class is a noisy copy of its own random template image.
        let templates: Vec<Vec<f32>> = (0..classes)
            .map(|_| {
                (0..3 * side * side)
                    .map(|_| rng.gen_range(-1.0..1.0))
                    .collect()
            })
            .collect();
        let final_side = side.div_ceil(4);
        let mut losses = Vec::new();
        for _ in 0..steps {
            let labels: Vec<usize> = (0..n).map(|_| rng.gen_range(0..classes)).collect();
            let images: Vec<f32> = labels
                .iter()
                .flat_map(|&c| {
                    templates[c]
                        .iter()
                        .map(|v| v + rng.gen_range(-0.5..0.5))
                        .collect::<Vec<_>>()
                })
                .collect();
            let x = s.tensor(&images, &[n, 3, side, side])?;
            let y = s.tensor(&labels.iter().map(|&c| c as f32).collect::<Vec<_>>(), &[n])?;
            let mut h = stem.forward(&x)?.relu()?;
            for block in &blocks {
                h = block.forward(&h)?;
            }
            let pool = Window2d {
                stride: [final_side, final_side],
                padding: [0, 0],
            };
            let pooled = h
                .avg_pool2d([final_side, final_side], pool)?
                .reshape(&[n, channels])?;
            let loss = head.forward(&pooled)?.cross_entropy(&y)?;
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
