//! The data: the course's own text (its five seed pages, shipped in `data/course.txt`), cut into
//! samples of `context + 1` bytes (every position of the text starts one), and PyTorch's
//! `DistributedSampler` rule for which rank reads which.
//!
//! The rule, per epoch: shuffle the sample indices with the seed plus the epoch (every rank the
//! same shuffle), pad them by repeating the first ones until the world size divides them, and
//! give rank r every world_size-th index from r. A rank's loader then cuts its share into batches
//! of `batch` (full batches only, `drop_last=True`). So step s of rank r reads
//! `shuffled[(s·batch + j)·world + r]` for j < batch: over the ranks, exactly the global batch
//! `shuffled[s·world·batch .. (s+1)·world·batch]` that one rank with batch world·batch reads.
//! (The shuffle is ours, not `torch.randperm`: the PyTorch twin reads the batches we wrote.)

use crate::rng::Rng;

/// The text every rank trains on: the course's seed pages.
pub const COURSE: &str = include_str!("../data/course.txt");

/// The samples of `text`: every window of `context + 1` bytes.
pub struct Dataset<'a> {
    text: &'a [u8],
    context: usize,
}

impl<'a> Dataset<'a> {
    /// `text`'s windows of `context + 1` bytes; None when the text is shorter than one.
    pub fn new(text: &'a [u8], context: usize) -> Option<Dataset<'a>> {
        (text.len() > context).then_some(Dataset { text, context })
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.text.len() - self.context
    }

    /// Never: a dataset has at least one sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i`: `context` bytes and the byte after them.
    pub fn sample(&self, i: usize) -> &'a [u8] {
        &self.text[i..i + self.context + 1]
    }
}

/// `DistributedSampler(shuffle=True, seed, drop_last=False)` with a loader of `drop_last=True`.
#[derive(Debug, Clone)]
pub struct Sampler {
    samples: usize,
    rank: usize,
    world: usize,
    batch: usize,
    seed: u64,
    epoch: Option<(u64, Vec<usize>)>,
}

impl Sampler {
    /// Rank `rank` of `world`, batches of `batch`, over `samples` samples.
    pub fn new(samples: usize, rank: usize, world: usize, batch: usize, seed: u64) -> Sampler {
        Sampler {
            samples,
            rank,
            world,
            batch,
            seed,
            epoch: None,
        }
    }

    /// Full batches each rank reads in an epoch (at least one is needed to train).
    pub fn steps_per_epoch(&self) -> usize {
        self.samples.div_ceil(self.world) / self.batch
    }

    /// This rank's sample indices for global step `step` (epochs follow each other).
    pub fn batch(&mut self, step: usize) -> Vec<usize> {
        let per_epoch = self.steps_per_epoch().max(1);
        let (epoch, s) = ((step / per_epoch) as u64, step % per_epoch);
        if self.epoch.as_ref().is_none_or(|(e, _)| *e != epoch) {
            self.epoch = Some((epoch, self.shard(epoch)));
        }
        let shard = &self.epoch.as_ref().expect("just set").1;
        shard[s * self.batch..(s + 1) * self.batch].to_vec()
    }

    /// This rank's share of epoch `epoch`: the shuffle, padded, every world-th from rank.
    fn shard(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.samples).collect();
        let mut rng = Rng::new(self.seed.wrapping_add(epoch));
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let total = self.samples.div_ceil(self.world) * self.world;
        let padding: Vec<usize> = order
            .iter()
            .copied()
            .cycle()
            .take(total - self.samples)
            .collect();
        order.extend(padding);
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.world)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranks' batches of a step are, together, the one batch of a single rank with world
    /// times the batch: the premise of the equivalence check.
    #[test]
    fn the_ranks_batches_make_the_single_ranks_batch() {
        for world in [2, 3, 4] {
            let mut one = Sampler::new(1001, 0, 1, 8 * world, 5);
            let mut ranks: Vec<Sampler> = (0..world)
                .map(|r| Sampler::new(1001, r, world, 8, 5))
                .collect();
            for step in 0..1001 / (8 * world) {
                let mut together: Vec<usize> =
                    ranks.iter_mut().flat_map(|s| s.batch(step)).collect();
                let mut single = one.batch(step);
                together.sort();
                single.sort();
                assert_eq!(together, single, "world {world} step {step}");
            }
        }
    }

    #[test]
    fn every_sample_once_per_epoch_and_a_new_order_the_next() {
        let mut s = Sampler::new(100, 0, 1, 10, 0);
        let mut seen: Vec<usize> = (0..10).flat_map(|step| s.batch(step)).collect();
        let next = s.batch(10);
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        let mut again = Sampler::new(100, 0, 1, 10, 0);
        assert_ne!(next, again.batch(0), "epoch 1 reshuffles");
    }
}
