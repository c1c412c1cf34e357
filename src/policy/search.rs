//! Finding the lowest score among the candidates: a full scan, or √N of
//! them drawn at random (the DTR prototype's search), seeded.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::CandidatePool;
use crate::graph::StorageId;

/// Which candidates a victim search scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Sampling {
    /// Every candidate.
    #[default]
    All,
    /// ⌈√N⌉ candidates drawn uniformly (with replacement), ignoring those
    /// under 1% of the average candidate size.
    Sqrt,
}

impl std::fmt::Display for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sampling::All => "all",
            Sampling::Sqrt => "sqrt",
        })
    }
}

/// The victim search with its own seeded generator.
#[derive(Debug, Clone)]
pub struct CandidateSearch {
    sampling: Sampling,
    rng: StdRng,
}

impl CandidateSearch {
    pub fn new(sampling: Sampling, seed: u64) -> CandidateSearch {
        CandidateSearch {
            sampling,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The candidate with the lowest score: the last one on ties, and a
    /// score of 0 ends the search (nothing can be lower). `score` gets the
    /// lowest score so far and may answer `None` for a candidate whose
    /// score it knows to be above it (it could not be chosen); the
    /// candidates drawn, and so the choice, are the same either way.
    pub fn lowest(
        &mut self,
        pool: &CandidatePool,
        mut score: impl FnMut(StorageId, Option<f64>) -> Option<f64>,
    ) -> Option<StorageId> {
        let mut best: Option<(f64, StorageId)> = None;
        let mut consider = |storage: StorageId| {
            let Some(s) = score(storage, best.map(|(b, _)| b)) else {
                return false;
            };
            if best.is_none_or(|(b, _)| s <= b) {
                best = Some((s, storage));
            }
            s <= 0.0
        };
        match self.sampling {
            Sampling::All => {
                for storage in pool.iter() {
                    if consider(storage) {
                        break;
                    }
                }
            }
            Sampling::Sqrt => {
                let n = pool.len();
                if n == 0 {
                    return None;
                }
                let wanted = (n as f64).sqrt().ceil() as usize;
                let threshold = pool.bytes() / n as u64 / 100;
                // Small candidates are skipped; bounded draws keep this O(√N).
                let mut taken = 0;
                let mut fallback = None;
                for _ in 0..4 * wanted {
                    let Some((storage, bytes)) = pool.random_member(&mut self.rng) else {
                        break;
                    };
                    if bytes < threshold {
                        fallback.get_or_insert(storage);
                        continue;
                    }
                    taken += 1;
                    if consider(storage) || taken == wanted {
                        break;
                    }
                }
                if taken == 0 {
                    if let Some(storage) = fallback {
                        consider(storage);
                    }
                }
            }
        }
        best.map(|(_, storage)| storage)
    }
}
