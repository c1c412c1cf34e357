//! `h_random`: evict a candidate chosen uniformly at random (seeded).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Heuristic, PolicyView};
use crate::graph::StorageId;

pub struct Random {
    rng: StdRng,
}

impl Random {
    pub fn new(seed: u64) -> Random {
        Random {
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl Heuristic for Random {
    /// Independent uniform scores: the lowest is a uniform choice.
    fn score(&mut self, _storage: StorageId, _view: &PolicyView<'_>) -> f64 {
        self.rng.gen::<f64>()
    }
}
