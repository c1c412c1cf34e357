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
    /// The candidates of one √N sample, each with the number of draws
    /// made up to it (scratch, kept to reuse its allocation).
    drawn: Vec<(StorageId, usize)>,
}

impl CandidateSearch {
    /// A search scoring as `sampling` says, its draws seeded by `seed`.
    pub fn new(sampling: Sampling, seed: u64) -> CandidateSearch {
        CandidateSearch {
            sampling,
            rng: StdRng::seed_from_u64(seed),
            drawn: Vec::new(),
        }
    }

    /// The candidate with the lowest score, and that score: the last one on ties, and a
    /// score of 0 ends the search (nothing can be lower). `score` gets the
    /// lowest score so far and may answer `None` for a candidate whose
    /// score it knows to be above it (it could not be chosen); the
    /// candidates drawn, and so the choice, are the same either way.
    ///
    /// With √N sampling the whole sample is drawn first and handed to
    /// `warm` (which may touch what scoring will read, so that the memory
    /// accesses of all candidates overlap instead of following one
    /// another), then scored in the order drawn. The draws, the generator
    /// afterwards and the choice are exactly those of drawing and scoring
    /// one at a time.
    pub fn lowest(
        &mut self,
        pool: &CandidatePool,
        mut warm: impl FnMut(StorageId),
        mut score: impl FnMut(StorageId, Option<f64>) -> Option<f64>,
    ) -> Option<(StorageId, f64)> {
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
                let start = self.rng.clone();
                let mut drawn = std::mem::take(&mut self.drawn);
                drawn.clear();
                let mut fallback = None;
                let mut made = 0;
                for draw in 1..=4 * wanted {
                    let Some((storage, bytes)) = pool.random_member(&mut self.rng) else {
                        break;
                    };
                    made = draw;
                    if bytes < threshold {
                        fallback.get_or_insert(storage);
                        continue;
                    }
                    drawn.push((storage, draw));
                    if drawn.len() == wanted {
                        break;
                    }
                }
                for &(storage, _) in &drawn {
                    warm(storage);
                }
                for &(storage, draws) in &drawn {
                    if consider(storage) {
                        if draws < made {
                            // One at a time, the search would have stopped
                            // drawing here: leave the generator as it would be.
                            self.rng = start;
                            for _ in 0..draws {
                                pool.random_member(&mut self.rng);
                            }
                        }
                        break;
                    }
                }
                if drawn.is_empty() {
                    if let Some(storage) = fallback {
                        consider(storage);
                    }
                }
                self.drawn = drawn;
            }
        }
        best.map(|(score, storage)| (storage, score))
    }
}
