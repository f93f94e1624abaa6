//! Gradient buckets: the parameters in reverse order (the order backward produces their
//! gradients in a plain stack of layers, last layer first), each added to the open bucket, which
//! closes as soon as it holds `--bucket-mb` or more (DDP's `compute_bucket_assignment_by_size`).
//! DDP learns that order in its first iteration and rebuilds its buckets after it; ours know it
//! from the start, so they are fixed from step 0. A bucket is ready when all its parameters'
//! gradients are, and its all-reduce can start then, while backward goes on.

/// One bucket: which parameters (indices into the model's list), and how many floats.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Parameters, in the order their gradients are produced.
    pub params: Vec<usize>,
    /// Floats in all.
    pub len: usize,
}

/// Buckets of about `cap_bytes` over parameters of lengths `lengths` (in `parameters()` order),
/// filled from the last parameter; each closes once it reaches `cap_bytes`.
pub fn plan(lengths: &[usize], cap_bytes: usize) -> Vec<Bucket> {
    let mut buckets = Vec::new();
    let mut open = Bucket {
        params: vec![],
        len: 0,
    };
    for p in (0..lengths.len()).rev() {
        open.params.push(p);
        open.len += lengths[p];
        if open.len * 4 >= cap_bytes {
            let empty = Bucket {
                params: vec![],
                len: 0,
            };
            buckets.push(std::mem::replace(&mut open, empty));
        }
    }
    if !open.params.is_empty() {
        buckets.push(open);
    }
    buckets
}

impl Bucket {
    /// The bucket's gradients, one after the other, out of the flat gradient vector.
    pub fn gather(&self, grads: &[f32], offsets: &[usize], lengths: &[usize]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len);
        for &p in &self.params {
            out.extend_from_slice(&grads[offsets[p]..offsets[p] + lengths[p]]);
        }
        out
    }

    /// The reduced bucket back into the flat gradient vector.
    pub fn scatter(
        &self,
        reduced: &[f32],
        grads: &mut [f32],
        offsets: &[usize],
        lengths: &[usize],
    ) {
        let mut at = 0;
        for &p in &self.params {
            grads[offsets[p]..offsets[p] + lengths[p]]
                .copy_from_slice(&reduced[at..at + lengths[p]]);
            at += lengths[p];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_from_the_last_parameter_and_close_at_the_cap() {
        // 4 bytes a float: a cap of 40 bytes holds 10.
        let b = plan(&[3, 20, 2, 5, 1], 40);
        let params: Vec<Vec<usize>> = b.iter().map(|b| b.params.clone()).collect();
        assert_eq!(params, [vec![4, 3, 2, 1], vec![0]]);
        assert_eq!(b.iter().map(|b| b.len).sum::<usize>(), 31);
        let grads: Vec<f32> = (0..31).map(|v| v as f32).collect();
        let offsets = [0, 3, 23, 25, 30];
        let lengths = [3, 20, 2, 5, 1];
        let mut back = vec![0.0; 31];
        for bucket in &b {
            bucket.scatter(
                &bucket.gather(&grads, &offsets, &lengths),
                &mut back,
                &offsets,
                &lengths,
            );
        }
        assert_eq!(back, grads);
    }
}
