//! The random stream each sequence owns, so a seeded request is reproducible whatever it is
//! batched with.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// A per-sequence ChaCha20 random stream.
///
/// The sampler draws exactly one uniform number per sampled token (greedy steps included), so the
/// stream's position always equals the number of tokens sampled; a sequence that is preempted and
/// resumed keeps its `SequenceRng` and continues where it stopped.
#[derive(Debug, Clone)]
pub struct SequenceRng {
    stream: ChaCha20Rng,
}

impl SequenceRng {
    /// A stream fully determined by `seed` (use the request's `seed`).
    pub fn from_seed(seed: u64) -> Self {
        SequenceRng {
            stream: ChaCha20Rng::seed_from_u64(seed),
        }
    }

    /// A stream seeded from the operating system, for requests without a seed.
    pub fn from_entropy() -> Self {
        SequenceRng {
            stream: ChaCha20Rng::from_entropy(),
        }
    }

    /// The next uniform draw in `[0, 1)`.
    pub fn next_uniform(&mut self) -> f64 {
        self.stream.gen::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_different_seed_differs() {
        let mut first = SequenceRng::from_seed(42);
        let mut second = SequenceRng::from_seed(42);
        let mut other = SequenceRng::from_seed(43);
        let a: Vec<f64> = (0..8).map(|_| first.next_uniform()).collect();
        let b: Vec<f64> = (0..8).map(|_| second.next_uniform()).collect();
        let c: Vec<f64> = (0..8).map(|_| other.next_uniform()).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|u| (0.0..1.0).contains(u)));
    }
}
