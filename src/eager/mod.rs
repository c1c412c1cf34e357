//! Eager-mode scripting: a [`Session`] owns an interpreter under a budget,
//! [`Tensor`]s are cheap handles to its tensors (the last clone dropped
//! releases it), and reverse-mode autograd runs the backward ops through
//! the same interpreter, so saved activations are evicted and recomputed
//! like anything else.
//!
//! ```
//! use dtr::eager::{nn, optim, Session};
//! use dtr::{Config, CpuBackend};
//!
//! let session = Session::new(CpuBackend::new(), Config::default().with_budget_bytes(1 << 20))?;
//! let mut rng = session.rng(0);
//! let layer = nn::Linear::new(&session, 4, 2, &mut rng)?;
//! let x = session.tensor(&[1.0, 2.0, 3.0, 4.0], &[1, 4])?;
//! let target = session.tensor(&[1.0], &[1])?;
//! let loss = layer.forward(&x)?.relu()?.cross_entropy(&target)?;
//! loss.backward()?;
//! optim::Sgd::new(0.1).step(&layer.params())?;
//! println!("loss {}", loss.item()?);
//! # Ok::<(), dtr::Error>(())
//! ```

mod autograd;
pub mod nn;
pub mod optim;
mod session;
mod tensor;

pub use session::Session;
pub use tensor::{Param, Tensor};
