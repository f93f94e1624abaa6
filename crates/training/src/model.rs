//! The model: a byte-level language model, bytes in, next byte out. The last `context` bytes are
//! looked up in an embedding table and laid side by side, two hidden layers with tanh follow,
//! and 256 logits, one per possible next byte, are scored by cross-entropy:
//!
//! ```text
//! x [B, context] ─ emb ─► e [B, context·embed] ─ w1,b1,tanh ─► h1 [B, hidden]
//!   ─ w2,b2,tanh ─► h2 [B, hidden] ─ w3,b3 ─► logits [B, 256] ─ cross-entropy ─► loss
//! ```
//!
//! All parameters live in one flat vector (PyTorch's `parameters()` order: emb, w1, b1, w2, b2,
//! w3, b3); weights are `[in, out]`, row-major, so a layer is `x @ w + b`. The matrix products are
//! `matrixmultiply`'s sgemm. [`Model::backward`] produces the gradients a layer at a time, last
//! layer first, and tells its caller after each layer: what DDP's autograd hooks hear.

use comm_core::trace::Span;

use crate::rng::Rng;

/// The model's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Bytes of context the model sees.
    pub context: usize,
    /// Floats per byte in the embedding table.
    pub embed: usize,
    /// Width of both hidden layers.
    pub hidden: usize,
}

/// Possible bytes: the vocabulary and the logits.
pub const VOCAB: usize = 256;

/// The parameters' names, in `parameters()` order.
pub const NAMES: [&str; 7] = ["emb", "w1", "b1", "w2", "b2", "w3", "b3"];

impl Shape {
    /// Each parameter's length, in `parameters()` order.
    pub fn lengths(&self) -> [usize; 7] {
        let (c, e, h) = (self.context, self.embed, self.hidden);
        [VOCAB * e, c * e * h, h, h * h, h, h * VOCAB, VOCAB]
    }

    /// Each parameter's length on a rank that holds `width` of the hidden units (Megatron's
    /// split, `crate::tensor_parallel`): w1's and b1's columns, w2's rows; the rest whole.
    /// `width` = hidden: [`lengths`](Self::lengths).
    pub fn shard_lengths(&self, width: usize) -> [usize; 7] {
        let (c, e, h) = (self.context, self.embed, self.hidden);
        [
            VOCAB * e,
            c * e * width,
            width,
            width * h,
            h,
            h * VOCAB,
            VOCAB,
        ]
    }

    /// Where each parameter starts in the flat vector, and the total.
    pub fn offsets(&self) -> ([usize; 7], usize) {
        let mut offsets = [0; 7];
        let mut at = 0;
        for (o, len) in offsets.iter_mut().zip(self.lengths()) {
            *o = at;
            at += len;
        }
        (offsets, at)
    }

    /// Parameters in all.
    pub fn parameters(&self) -> usize {
        self.offsets().1
    }

    /// Fresh parameters: uniform in ±1/√fan_in for the layers (PyTorch's `nn.Linear`), ±1 for
    /// the embedding, from `seed`.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        let fan_in = [1, self.context * self.embed, self.context * self.embed];
        let fan_in = [
            fan_in[0],
            fan_in[1],
            fan_in[2],
            self.hidden,
            self.hidden,
            self.hidden,
            self.hidden,
        ];
        let mut params = Vec::with_capacity(self.parameters());
        for (len, fan) in self.lengths().into_iter().zip(fan_in) {
            let bound = 1.0 / (fan as f32).sqrt();
            params.extend((0..len).map(|_| bound * (2.0 * rng.unit() - 1.0)));
        }
        params
    }
}

/// What forward keeps for backward; the whole model, or one rank's shard of it (`width` of the
/// hidden units: Megatron's split, see `crate::tensor_parallel`).
pub struct Model {
    shape: Shape,
    batch: usize,
    /// Hidden units this rank holds: all of them, or its slice.
    width: usize,
    x: Vec<u8>,
    y: Vec<u8>,
    e: Vec<f32>,
    h1: Vec<f32>,
    h2: Vec<f32>,
    probs: Vec<f32>,
}

/// Sums a partial result over the ranks that share the model (an all-reduce over a
/// tensor-parallel group); nothing to do for a whole model.
pub type Sum<'a> = &'a mut dyn FnMut(&mut [f32]) -> comm_core::Result<()>;

impl Model {
    /// A model of `shape` for batches of `batch` samples.
    pub fn new(shape: Shape, batch: usize) -> Model {
        Model::shard(shape, batch, shape.hidden)
    }

    /// The shard of a model of `shape` that holds `width` hidden units (`shape.hidden` divides
    /// into them: the caller checks).
    pub fn shard(shape: Shape, batch: usize, width: usize) -> Model {
        let (c, e, h) = (shape.context, shape.embed, shape.hidden);
        Model {
            shape,
            batch,
            width,
            x: vec![0; batch * c],
            y: vec![0; batch],
            e: vec![0.0; batch * c * e],
            h1: vec![0.0; batch * width],
            h2: vec![0.0; batch * h],
            probs: vec![0.0; batch * VOCAB],
        }
    }

    /// The shape it was made for.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Each parameter's length on this rank.
    pub fn lengths(&self) -> [usize; 7] {
        self.shape.shard_lengths(self.width)
    }

    /// The mean cross-entropy of predicting `samples`' last byte from the ones before it (each
    /// sample `context + 1` bytes), keeping what backward needs.
    pub fn forward(&mut self, params: &[f32], samples: &[&[u8]]) -> f32 {
        self.forward_shard(params, samples, &mut |_| Ok(()))
            .expect("a whole model sums nothing")
    }

    /// [`forward`](Self::forward) on a shard: `sum` adds up the second layer's terms over the
    /// shards (Megatron's row-parallel layer) before its bias and tanh.
    pub fn forward_shard(
        &mut self,
        params: &[f32],
        samples: &[&[u8]],
        sum: Sum<'_>,
    ) -> comm_core::Result<f32> {
        let Shape {
            context: c,
            embed: d,
            hidden: h,
        } = self.shape;
        let (b, w) = (self.batch, self.width);
        assert_eq!(samples.len(), b, "a batch of {b} samples");
        let p = self.parts(params);
        embed(p[0], samples, (c, d), &mut self.x, &mut self.y, &mut self.e);
        // Layer 1 (column-parallel on a shard): this rank's units, from the whole input.
        dense(b, c * d, w, &self.e, p[1], p[2], &mut self.h1, true);
        // Layer 2 (row-parallel on a shard): this rank's term of h1 @ w2, summed, + b2, tanh.
        gemm(b, w, h, (&self.h1, w, 1), (p[3], h, 1), 0.0, &mut self.h2);
        sum(&mut self.h2)?;
        for row in self.h2.chunks_mut(h) {
            row.iter_mut()
                .zip(p[4])
                .for_each(|(v, b2)| *v = (*v + b2).tanh());
        }
        dense(b, h, VOCAB, &self.h2, p[5], p[6], &mut self.probs, false);
        Ok(softmax_cross_entropy(&mut self.probs, &self.y))
    }

    /// The gradient of the last forward's loss into `grads` (as long as the parameters), a layer
    /// at a time from the last: after each, `ready` is told which parameters' gradients are now
    /// complete (indices into [`NAMES`], in the order autograd produces them), and may start
    /// their all-reduce while the next layer is computed.
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        mut ready: impl FnMut(&[usize], &[f32]),
    ) {
        self.backward_shard(params, grads, &mut ready, &mut |_| Ok(()))
            .expect("a whole model sums nothing")
    }

    /// [`backward`](Self::backward) on a shard: `sum` adds up the shards' terms of the gradient
    /// at the first layer's input (Megatron's column-parallel layer, backward).
    pub fn backward_shard(
        &self,
        params: &[f32],
        grads: &mut [f32],
        ready: &mut dyn FnMut(&[usize], &[f32]),
        sum: Sum<'_>,
    ) -> comm_core::Result<()> {
        let Shape {
            context: c,
            embed: d,
            hidden: h,
        } = self.shape;
        let (b, w) = (self.batch, self.width);
        let p = self.parts(params);
        let lens = self.lengths();
        let mut offsets = [0; 7];
        (1..7).for_each(|i| offsets[i] = offsets[i - 1] + lens[i - 1]);
        let range = |i: usize| offsets[i]..offsets[i] + lens[i];
        let dlogits = logits_gradient(&self.probs, &self.y);
        // Layer 3: logits = h2 @ w3 + b3.
        let span = Span::slice("compute", "backward layer 3 (w3, b3)");
        let (h2, w3) = (&self.h2, p[5]);
        let dh2 = dense_backward(b, h, VOCAB, h2, w3, &dlogits, grads, range(5), range(6));
        drop(span);
        ready(&[6, 5], grads);
        // Layer 2: h2 = tanh(h1 @ w2 + b2) (a shard: its rows of w2, its slice of dh1).
        let span = Span::slice("compute", "backward layer 2 (w2, b2)");
        let da2 = tanh_backward(dh2, &self.h2);
        let dh1 = dense_backward(b, w, h, &self.h1, p[3], &da2, grads, range(3), range(4));
        drop(span);
        ready(&[4, 3], grads);
        // Layer 1: h1 = tanh(e @ w1 + b1) (a shard: its columns of w1, and its term of de,
        // summed), then the embedding rows each sample looked up.
        let span = Span::slice("compute", "backward layer 1 (w1, b1, emb)");
        let da1 = tanh_backward(dh1, &self.h1);
        let mut de = dense_backward(b, c * d, w, &self.e, p[1], &da1, grads, range(1), range(2));
        sum(&mut de)?;
        embedding_backward(&self.x, &de, (c, d), &mut grads[range(0)]);
        drop(span);
        ready(&[2, 1, 0], grads);
        Ok(())
    }

    /// The parameters' slices, in [`NAMES`] order.
    fn parts<'a>(&self, params: &'a [f32]) -> Vec<&'a [f32]> {
        let lens = self.lengths();
        assert_eq!(
            params.len(),
            lens.iter().sum::<usize>(),
            "parameters of this shard"
        );
        let mut at = 0;
        lens.iter()
            .map(|&len| {
                at += len;
                &params[at - len..at]
            })
            .collect()
    }
}

/// Each sample's context bytes into `x` and its next byte into `y`, and the bytes' rows of the
/// embedding table `emb` side by side into `e` (`c` bytes of context, `d` floats a byte).
fn embed(
    emb: &[f32],
    samples: &[&[u8]],
    (c, d): (usize, usize),
    x: &mut [u8],
    y: &mut [u8],
    e: &mut [f32],
) {
    for (i, s) in samples.iter().enumerate() {
        x[i * c..(i + 1) * c].copy_from_slice(&s[..c]);
        y[i] = s[c];
        for (k, &byte) in s[..c].iter().enumerate() {
            let row = &emb[byte as usize * d..(byte as usize + 1) * d];
            e[i * c * d + k * d..i * c * d + (k + 1) * d].copy_from_slice(row);
        }
    }
}

/// The logits in `probs` become probabilities (softmax, row by row); returns the mean
/// cross-entropy of the right bytes `y`.
fn softmax_cross_entropy(probs: &mut [f32], y: &[u8]) -> f32 {
    let mut loss = 0.0f64;
    for (row, &y) in probs.chunks_mut(VOCAB).zip(y) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in row.iter_mut() {
            *v /= sum;
        }
        loss -= f64::from(row[y as usize].max(f32::MIN_POSITIVE).ln());
    }
    (loss / y.len() as f64) as f32
}

/// Softmax minus one-hot, over the batch: the gradient of the mean loss at the logits.
fn logits_gradient(probs: &[f32], y: &[u8]) -> Vec<f32> {
    let mut dlogits = probs.to_vec();
    for (row, &y_i) in dlogits.chunks_mut(VOCAB).zip(y) {
        row[y_i as usize] -= 1.0;
        row.iter_mut().for_each(|v| *v /= y.len() as f32);
    }
    dlogits
}

/// The embedding table's gradient `demb` from the gradient `de` at the looked-up rows: each
/// byte of context `x` adds its row of `de` to its byte's row.
fn embedding_backward(x: &[u8], de: &[f32], (c, d): (usize, usize), demb: &mut [f32]) {
    demb.fill(0.0);
    for (i, bytes) in x.chunks(c).enumerate() {
        for (k, &byte) in bytes.iter().enumerate() {
            let from = &de[i * c * d + k * d..i * c * d + (k + 1) * d];
            let to = &mut demb[byte as usize * d..(byte as usize + 1) * d];
            to.iter_mut().zip(from).for_each(|(t, f)| *t += f);
        }
    }
}

/// `out [m, n] = x [m, k] @ w [k, n] + bias`, then tanh where `tanh`.
#[allow(clippy::too_many_arguments)]
fn dense(
    m: usize,
    k: usize,
    n: usize,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    out: &mut [f32],
    tanh: bool,
) {
    for row in out.chunks_mut(n) {
        row.copy_from_slice(bias);
    }
    gemm(m, k, n, (x, k, 1), (w, n, 1), 1.0, out);
    if tanh {
        out.iter_mut().for_each(|v| *v = v.tanh());
    }
}

/// The gradients of `out = x @ w + b` given `dout` [m, n]: dw = xᵀ @ dout and db = the column
/// sums of dout into `grads` (their ranges), and dx = dout @ wᵀ, returned.
#[allow(clippy::too_many_arguments)]
fn dense_backward(
    m: usize,
    k: usize,
    n: usize,
    x: &[f32],
    w: &[f32],
    dout: &[f32],
    grads: &mut [f32],
    dw: std::ops::Range<usize>,
    db: std::ops::Range<usize>,
) -> Vec<f32> {
    // xᵀ: x is [m, k] row-major, read as [k, m] with strides (1, k).
    gemm(k, m, n, (x, 1, k), (dout, n, 1), 0.0, &mut grads[dw]);
    let dbias = &mut grads[db];
    dbias.fill(0.0);
    for row in dout.chunks(n) {
        dbias.iter_mut().zip(row).for_each(|(g, v)| *g += v);
    }
    // wᵀ: w is [k, n] row-major, read as [n, k] with strides (1, n).
    let mut dx = vec![0.0; m * k];
    gemm(m, n, k, (dout, n, 1), (w, 1, n), 0.0, &mut dx);
    dx
}

/// The gradient through tanh: d · (1 − out²).
fn tanh_backward(mut d: Vec<f32>, out: &[f32]) -> Vec<f32> {
    d.iter_mut().zip(out).for_each(|(g, y)| *g *= 1.0 - y * y);
    d
}

/// `c [m, n] = a [m, k] @ b [k, n] + beta · c`, `a` and `b` given with their row and column
/// strides (a transposed matrix is its stored one with the strides swapped); `c` row-major.
fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    beta: f32,
    c: &mut [f32],
) {
    assert!(a.0.len() >= m * k && b.0.len() >= k * n && c.len() >= m * n);
    // SAFETY: the asserts above bound every index sgemm reads and writes: a's last element is
    // at (m−1)·rsa + (k−1)·csa < m·k for both stride orders used here, likewise b and c.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.0.as_ptr(),
            a.1 as isize,
            a.2 as isize,
            b.0.as_ptr(),
            b.1 as isize,
            b.2 as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backward agrees with the loss's finite differences, parameter by parameter.
    #[test]
    fn backward_is_the_gradient_of_forward() {
        let shape = Shape {
            context: 3,
            embed: 4,
            hidden: 5,
        };
        let params = shape.init(7);
        let text = b"hello, world: all-reduce";
        let samples: Vec<&[u8]> = (0..4).map(|i| &text[i * 5..i * 5 + 4]).collect();
        let mut model = Model::new(shape, 4);
        model.forward(&params, &samples);
        let mut grads = vec![0.0; params.len()];
        let mut order = Vec::new();
        model.backward(&params, &mut grads, |ready, _| {
            order.extend_from_slice(ready)
        });
        assert_eq!(order, [6, 5, 4, 3, 2, 1, 0], "last layer first");
        let (offsets, _) = shape.offsets();
        // A few entries of every parameter; emb: a row a sample used (byte 'h' at offset 0).
        let mut checked = 0;
        for (p, &o) in offsets.iter().enumerate() {
            let first = if p == 0 { b'h' as usize * 4 } else { o };
            for i in first..first + 3 {
                let eps = 1e-2;
                let mut plus = params.clone();
                plus[i] += eps;
                let mut minus = params.clone();
                minus[i] -= eps;
                let numeric = (model.forward(&plus, &samples) - model.forward(&minus, &samples))
                    / (2.0 * eps);
                assert!(
                    (numeric - grads[i]).abs() < 2e-3,
                    "{} [{i}]: backward {} vs numeric {numeric}",
                    NAMES[p],
                    grads[i]
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 21);
    }
}
