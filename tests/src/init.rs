//! How the runner fills a leaf tensor before a run: random values, never zeros.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tessera_core::quant::{fit_random_block, is_lattice};
use tessera_core::{DType, Result, Tensor};

use crate::tensor_io::encode_row;

/// What a leaf tensor holds before the run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform floats in `[lo, hi)`, converted (quantized) to the tensor's type; integer types
    /// get uniform integers in `[lo, hi)`.
    Uniform(f32, f32),
    /// Integers in `[0, n)` (row indices, positions).
    Indices(usize),
    /// Integers in `[0, n)`, distinct within each row (set_rows: no row written twice).
    UniqueIndices(usize),
    /// A mask: uniform in `[-1, 1)` with this fraction of `-inf`, never in column 0 (so no row is
    /// masked out entirely).
    Mask(f64),
    /// [`Init::Mask`] with every column in `[from, to)` also `-inf` (a run of keys that a split
    /// of the keys may lie wholly inside).
    MaskSpan(f64, usize, usize),
    /// A sliding-window causal mask `[keys, queries]` (Gemma 2 and 3, Mistral): query i, at
    /// position `n_past + i`, sees the keys `n_past + i + 1 - window ..= n_past + i` (uniform in
    /// `[-1, 1)`); the keys before and after those are `-inf`.
    Window {
        /// The position of query 0 (keys before the queries' own).
        n_past: usize,
        /// How many keys each query sees.
        window: usize,
    },
    /// A block-sparse mask `[keys, ...]`, as a KV cache shared by several sequences in pages
    /// gives: the keys are pages of `page` keys, page p belonging to sequence p % `seqs` (the
    /// last page may be shorter); row r (counted over every dim above 0) is a token of sequence
    /// (r / `run`) % `seqs` and sees its sequence's keys (uniform in `[-1, 1)`, a tenth of them
    /// `-inf`, never a page's first), every other key being `-inf`.
    Pages {
        /// Keys per page.
        page: usize,
        /// Sequences.
        seqs: usize,
        /// Consecutive rows of one sequence.
        run: usize,
    },
    /// NaN bytes (0xFF): a destination the op overwrites entirely.
    Poison,
}

/// The byte every poisoned tensor is filled with: NaN in every float type.
pub(crate) const POISON: u8 = 0xFF;

impl Init {
    /// The contiguous bytes of a leaf `t` under this init, drawn from `rng`.
    pub(crate) fn bytes(self, t: &Tensor, rng: &mut StdRng) -> Result<Vec<u8>> {
        let row_bytes = t.dtype.row_size(t.ne[0])?;
        let rows = t.nrows();
        if self == Init::Poison {
            return Ok(vec![POISON; row_bytes * rows]);
        }
        let mut out = vec![0u8; row_bytes * rows];
        if let Init::Uniform(lo, hi) = self {
            if is_lattice(t.dtype) {
                // Random lattice blocks, each with the RMS of a uniform draw from the range
                // asked for (its half-width over sqrt(3)) times a random factor: they reach
                // every grid point and sign pattern (a quantizer's output favours a few), and
                // cost nothing to make (the grid searches of the types tessera writes take
                // tens of microseconds a block, seconds for a perf case's weights).
                for dst in out.chunks_exact_mut(t.dtype.type_size()) {
                    rng.fill(dst);
                    let rms = (hi - lo).abs() / 2.0 / 3f32.sqrt() * rng.gen_range(0.5f32..1.0);
                    fit_random_block(t.dtype, dst, rms)?;
                }
                return Ok(out);
            }
        }
        let mut row = vec![0f64; t.ne[0]];
        for (r, dst) in out.chunks_exact_mut(row_bytes).enumerate() {
            self.fill_row(t.dtype, [r % t.ne[1].max(1), r], &mut row, rng);
            encode_row(t.dtype, &row, dst)?;
        }
        Ok(out)
    }

    /// Fills `row`: row `i1` along dim 1 (a mask's query), row `r` counted over every dim
    /// above 0.
    fn fill_row(self, dtype: DType, [i1, r]: [usize; 2], row: &mut [f64], rng: &mut StdRng) {
        let integer = matches!(dtype, DType::I32 | DType::I64);
        match self {
            Init::Uniform(lo, hi) if integer => {
                let (lo, hi) = (
                    lo.floor() as i64,
                    (hi.ceil() as i64).max(lo.floor() as i64 + 1),
                );
                row.iter_mut()
                    .for_each(|v| *v = rng.gen_range(lo..hi) as f64);
            }
            Init::Uniform(lo, hi) => {
                let (lo, hi) = (lo as f64, (hi as f64).max(lo as f64 + f64::EPSILON));
                row.iter_mut().for_each(|v| *v = rng.gen_range(lo..hi));
            }
            Init::Indices(n) => row
                .iter_mut()
                .for_each(|v| *v = rng.gen_range(0..n.max(1)) as f64),
            Init::UniqueIndices(n) => {
                let mut all: Vec<usize> = (0..n.max(row.len())).collect();
                all.shuffle(rng);
                // Values past n only appear when the row is longer than n: a table bug that
                // the graph's own checks (or the reference) then report.
                row.iter_mut().zip(all).for_each(|(v, i)| *v = i as f64);
            }
            Init::Mask(p) | Init::MaskSpan(p, ..) => {
                let span = match self {
                    Init::MaskSpan(_, from, to) => from.max(1)..to,
                    _ => 0..0,
                };
                for (i, v) in row.iter_mut().enumerate() {
                    *v = if span.contains(&i) || (i > 0 && rng.gen_bool(p.clamp(0.0, 1.0))) {
                        f64::NEG_INFINITY
                    } else {
                        rng.gen_range(-1.0..1.0)
                    };
                }
            }
            Init::Window { n_past, window } => {
                let last = n_past + i1;
                for (j, v) in row.iter_mut().enumerate() {
                    *v = if j > last || j + window <= last {
                        f64::NEG_INFINITY
                    } else {
                        rng.gen_range(-1.0..1.0)
                    };
                }
            }
            Init::Pages { page, seqs, run } => {
                let (page, seqs) = (page.max(1), seqs.max(1));
                let seq = (r / run.max(1)) % seqs;
                for (j, v) in row.iter_mut().enumerate() {
                    let own = (j / page) % seqs == seq;
                    *v = if own && (j % page == 0 || !rng.gen_bool(0.1)) {
                        rng.gen_range(-1.0..1.0)
                    } else {
                        f64::NEG_INFINITY
                    };
                }
            }
            Init::Poison => row.iter_mut().for_each(|v| *v = f64::NAN),
        }
    }
}
