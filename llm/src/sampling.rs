//! Token sampling: turn one position's logits into the next token id.
//!
//! The filters run in llama.cpp's default order (its `common` sampler chain, less the stages
//! that are off by default: DRY, top-n-sigma, typical-p and XTC):
//!
//! 1. **repetition penalty** over the last `repeat_last_n` tokens of the history: each distinct
//!    token seen there has its logit divided by `repeat_penalty` when positive and multiplied by
//!    it when not (so a penalty > 1 always makes the token less likely);
//! 2. **top-k**: keep the `top_k` highest logits;
//! 3. **top-p** (nucleus): softmax over what is left, keep the smallest prefix (by falling
//!    probability) whose mass reaches `top_p`;
//! 4. **min-p**: keep tokens whose probability is at least `min_p` times the top one's;
//! 5. **temperature**: divide the logits by `temperature`;
//! 6. **draw** one token from the softmax of what is left, with a seeded [`StdRng`].
//!
//! As in llama.cpp, top-p and min-p see the distribution *before* temperature. Each filter keeps
//! at least one token. With `temperature <= 0` sampling is greedy: the penalty still applies,
//! then the highest logit wins and the lowest id wins a tie.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;

/// The settings of a [`Sampler`]. `Default` gives llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` samples greedily (argmax). Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` turns the filter off. Default 40.
    pub top_k: usize,
    /// Nucleus sampling mass; `>= 1` turns the filter off. Default 0.95.
    pub top_p: f32,
    /// Minimum probability relative to the most likely token; `<= 0` turns the filter off.
    /// Default 0.05.
    pub min_p: f32,
    /// Repetition penalty; `1` turns it off. Default 1.0 (off, as in llama.cpp).
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalty looks at; `0` turns it off.
    /// Default 64.
    pub repeat_last_n: usize,
    /// Seed of the random draw: the same seed, logits and history give the same tokens.
    /// Default 0.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: always the most likely token, no penalty.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        }
    }
}

/// One candidate token: its id and its current logit.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Picks tokens from logits according to a [`SamplerConfig`]; holds the seeded random state.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: StdRng,
}

impl Sampler {
    /// A sampler whose random state starts from `config.seed`.
    pub fn new(config: SamplerConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Sampler { config, rng }
    }

    /// The settings this sampler was made with.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks the next token from `logits` (one per vocabulary entry) given the tokens so far
    /// (`history`, oldest first, used by the repetition penalty).
    ///
    /// NaN logits count as impossible tokens. An empty `logits` slice gives token 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if logits.is_empty() {
            return 0;
        }
        // A copy only where the repetition penalty changes some values.
        let penalized;
        let vals: &[f32] = if penalizes(
            history,
            self.config.repeat_last_n,
            self.config.repeat_penalty,
        ) {
            let mut v: Vec<f32> = logits.iter().map(|&l| possible(l)).collect();
            apply_repeat_penalty(
                &mut v,
                history,
                self.config.repeat_last_n,
                self.config.repeat_penalty,
            );
            penalized = v;
            &penalized
        } else {
            logits
        };
        if self.config.temperature <= 0.0 {
            return argmax(vals);
        }
        let mut cands = top_k(vals, self.config.top_k);
        apply_top_p(&mut cands, self.config.top_p);
        apply_min_p(&mut cands, self.config.min_p);
        apply_temperature(&mut cands, self.config.temperature);
        let probs = softmax(&cands);
        let r: f64 = self.rng.gen::<f64>();
        draw(&cands, &probs, r)
    }
}

/// The log-probability of token `id` under the softmax of `logits` (the model's own
/// distribution, before any sampling filter, as OpenAI's `logprobs` reports it), and the `top`
/// most likely tokens with theirs, most likely first.
pub fn logprobs(logits: &[f32], id: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(possible(v)));
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from(possible(l) - max).exp())
        .sum();
    let log_z = max + sum.ln() as f32;
    let lp = |l: f32| possible(l) - log_z;
    let chosen = logits
        .get(id as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    let best = if top == 0 {
        Vec::new()
    } else {
        top_k(logits, top.min(logits.len()))
    };
    (
        chosen,
        best.into_iter().map(|c| (c.id, lp(c.logit))).collect(),
    )
}

/// A logit as the samplers see it: NaN is an impossible token.
fn possible(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l
    }
}

/// The id of the highest value (NaN counting as -inf); the lowest id wins a tie. Two plain
/// passes (the maximum, then where it first is) that the compiler vectorizes.
fn argmax(vals: &[f32]) -> u32 {
    // f32::max passes over NaN.
    let max = vals.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    vals.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Whether [`apply_repeat_penalty`] changes anything.
fn penalizes(history: &[u32], last_n: usize, penalty: f32) -> bool {
    last_n != 0 && penalty != 1.0 && !history.is_empty()
}

/// Repetition penalty over the last `last_n` tokens of `history`, on the values indexed by
/// id; each distinct token once.
fn apply_repeat_penalty(vals: &mut [f32], history: &[u32], last_n: usize, penalty: f32) {
    if !penalizes(history, last_n, penalty) {
        return;
    }
    let recent = &history[history.len().saturating_sub(last_n)..];
    let seen: HashSet<u32> = recent.iter().copied().collect();
    for &t in &seen {
        if let Some(v) = vals.get_mut(t as usize) {
            if *v <= 0.0 {
                *v *= penalty;
            } else {
                *v /= penalty;
            }
        }
    }
}

/// The order of falling logit, the lower id first among equals.
fn falling(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A candidate ordered by [`falling`] (greater: less likely), for the top-k heap.
#[derive(Clone, Copy, PartialEq)]
struct Ranked(Candidate);

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        falling(&self.0, &other.0)
    }
}

/// The `k` highest of `vals` (indexed by id) as candidates sorted by falling logit; all of them,
/// sorted, when `k` is 0 or not smaller than the count. One pass keeps the k best in a heap
/// whose top is the worst kept, so nearly every value costs one comparison and a whole
/// vocabulary (128,256 entries for Llama 3) is never sorted.
fn top_k(vals: &[f32], k: usize) -> Vec<Candidate> {
    let cand = |i: usize| Candidate {
        id: i as u32,
        logit: possible(vals[i]),
    };
    if k == 0 || k >= vals.len() {
        let mut all: Vec<Candidate> = (0..vals.len()).map(cand).collect();
        sort_desc(&mut all);
        return all;
    }
    let mut heap: std::collections::BinaryHeap<Ranked> = (0..k).map(|i| Ranked(cand(i))).collect();
    // Later ids lose ties, so a value enters only when it is above the worst kept one.
    let mut floor = heap.peek().map_or(f32::NEG_INFINITY, |r| r.0.logit);
    for (i, &v) in vals.iter().enumerate().skip(k) {
        if possible(v).total_cmp(&floor) != std::cmp::Ordering::Greater {
            continue;
        }
        if let Some(mut worst) = heap.peek_mut() {
            *worst = Ranked(cand(i));
        }
        floor = heap.peek().map_or(f32::NEG_INFINITY, |r| r.0.logit);
    }
    heap.into_sorted_vec().into_iter().map(|r| r.0).collect()
}

/// Sorts by falling logit, the lower id first among equals.
fn sort_desc(cands: &mut [Candidate]) {
    cands.sort_by(falling);
}

/// Softmax of the candidates' logits, in f64; impossible (-inf) tokens get 0.
fn softmax(cands: &[Candidate]) -> Vec<f64> {
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // Every token is impossible: spread evenly so a draw still returns one of them.
        return vec![1.0 / cands.len() as f64; cands.len()];
    }
    let exps: Vec<f64> = cands
        .iter()
        .map(|c| f64::from(c.logit - max).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Keeps the smallest prefix (by falling probability) whose probability mass reaches `p`.
fn apply_top_p(cands: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    sort_desc(cands);
    let probs = softmax(cands);
    let mut cum = 0.0f64;
    let mut keep = cands.len();
    for (i, pr) in probs.iter().enumerate() {
        cum += pr;
        if cum >= f64::from(p) {
            keep = i + 1;
            break;
        }
    }
    cands.truncate(keep.max(1));
}

/// Keeps tokens whose probability is at least `p` times the most likely token's.
fn apply_min_p(cands: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 {
        return;
    }
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    // p_i >= p * p_max  <=>  logit_i >= max + ln(p)
    let threshold = max + p.ln();
    let kept: Vec<Candidate> = cands
        .iter()
        .copied()
        .filter(|c| c.logit >= threshold)
        .collect();
    if !kept.is_empty() {
        *cands = kept;
    }
}

/// Divides every logit by `t` (> 0).
fn apply_temperature(cands: &mut [Candidate], t: f32) {
    for c in cands.iter_mut() {
        c.logit /= t;
    }
}

/// The candidate where the cumulative probability first exceeds `r` in [0, 1).
fn draw(cands: &[Candidate], probs: &[f64], r: f64) -> u32 {
    let mut cum = 0.0f64;
    for (c, p) in cands.iter().zip(probs) {
        cum += p;
        if r < cum {
            return c.id;
        }
    }
    // Rounding left `r` above the total: the last token with any probability.
    cands
        .iter()
        .zip(probs)
        .rev()
        .find(|(_, p)| **p > 0.0)
        .map_or(cands[cands.len() - 1].id, |(c, _)| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Candidate> {
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l,
            })
            .collect()
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        let mut v: Vec<u32> = c.iter().map(|c| c.id).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn greedy_takes_argmax_and_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]), 1);
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 5.0], &[]), 1);
        assert_eq!(s.sample(&[f32::NAN, 0.5, f32::NAN], &[]), 1);
        assert_eq!(s.sample(&[], &[]), 0);
        let mut s = Sampler::new(SamplerConfig {
            temperature: -1.0,
            ..SamplerConfig::default()
        });
        assert_eq!(s.sample(&[0.0, 0.0, 7.0], &[]), 2);
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative() {
        let mut v = vec![2.0, -2.0, 2.0, 1.0];
        // token 0 appears twice, token 1 once; token 2 is outside the last-3 window.
        apply_repeat_penalty(&mut v, &[2, 0, 1, 0], 3, 2.0);
        assert_eq!(v, [1.0, -4.0, 2.0, 1.0]);
        // Penalty 1 or window 0: no change; ids past the vocabulary are ignored.
        let mut v = vec![2.0, -2.0];
        apply_repeat_penalty(&mut v, &[0, 1, 99], 0, 2.0);
        apply_repeat_penalty(&mut v, &[0, 1, 99], 8, 1.0);
        apply_repeat_penalty(&mut v, &[99], 8, 2.0);
        assert_eq!(v, [2.0, -2.0]);
    }

    #[test]
    fn repeat_penalty_changes_greedy_choice() {
        let cfg = SamplerConfig {
            repeat_penalty: 1.5,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg);
        assert_eq!(s.sample(&[3.0, 2.5], &[]), 0);
        assert_eq!(s.sample(&[3.0, 2.5], &[0]), 1);
    }

    #[test]
    fn top_k_selects_what_a_full_sort_keeps() {
        // Logits with many ties (ids break them) and a NaN-free spread of values.
        let mut rng = StdRng::seed_from_u64(7);
        for k in [1, 2, 40, 999, 1000, 1001, 5000] {
            let logits: Vec<f32> = (0..1000)
                .map(|_| rng.gen_range(0..50) as f32 * 0.5)
                .collect();
            let fast = top_k(&logits, k);
            let mut full = cands(&logits);
            sort_desc(&mut full);
            full.truncate(k.min(full.len()));
            assert_eq!(fast, full, "k = {k}");
        }
    }

    #[test]
    fn top_k_keeps_the_k_highest() {
        let c = top_k(&[0.5, 3.0, 1.0, 2.0, -1.0], 2);
        assert_eq!(ids(&c), vec![1, 3]);
        let c = top_k(&[0.5, 3.0, 1.0], 0);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].id, 1, "sorted by falling logit");
        let c = top_k(&[0.5, 3.0], 10);
        assert_eq!(c.len(), 2);
        // NaN is an impossible token, never one of the k, even where it comes first.
        let c = top_k(&[f32::NAN, 1.0, f32::NAN, 0.5, -2.0], 2);
        assert_eq!(ids(&c), vec![1, 3]);
        let c = top_k(&[f32::NAN, f32::NAN, 0.5], 1);
        assert_eq!(ids(&c), vec![2]);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        // probabilities 0.5, 0.25, 0.125, 0.125
        let l = [2f32.ln() + 1.0, 1.0, 0.5f32.ln() + 1.0, 0.5f32.ln() + 1.0];
        let mut c = cands(&l);
        apply_top_p(&mut c, 0.7);
        assert_eq!(ids(&c), vec![0, 1]);
        let mut c = cands(&l);
        apply_top_p(&mut c, 0.5);
        assert_eq!(ids(&c), vec![0]);
        let mut c = cands(&l);
        apply_top_p(&mut c, 0.1);
        assert_eq!(ids(&c), vec![0], "keeps at least one");
        let mut c = cands(&l);
        apply_top_p(&mut c, 1.0);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn min_p_drops_tokens_below_the_relative_threshold() {
        // probabilities relative to the top: 1, 0.5, 0.1, 0.01
        let l = [0.0, 0.5f32.ln(), 0.1f32.ln(), 0.01f32.ln()];
        let mut c = cands(&l);
        apply_min_p(&mut c, 0.05);
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        apply_min_p(&mut c, 0.6);
        assert_eq!(ids(&c), vec![0]);
        let mut c = cands(&l);
        apply_min_p(&mut c, 0.0);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn temperature_scales_logits() {
        let mut c = cands(&[2.0, -4.0]);
        apply_temperature(&mut c, 0.5);
        assert_eq!(c[0].logit, 4.0);
        assert_eq!(c[1].logit, -8.0);
    }

    #[test]
    fn draw_follows_cumulative_probability() {
        let c = cands(&[0.0, 0.0, 0.0, 0.0]);
        let p = softmax(&c);
        assert_eq!(draw(&c, &p, 0.0), 0);
        assert_eq!(draw(&c, &p, 0.3), 1);
        assert_eq!(draw(&c, &p, 0.99), 3);
        assert_eq!(draw(&c, &p, 1.5), 3);
        let c = cands(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
        let p = softmax(&c);
        assert_eq!(draw(&c, &p, 0.999_999), 1);
    }

    #[test]
    fn seeded_sampling_reproduces_and_follows_the_distribution() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7) % 13) as f32 * 0.3).collect();
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: 42,
            ..SamplerConfig::default()
        };
        let run = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone());
            (0..200)
                .map(|_| s.sample(&logits, &[]))
                .collect::<Vec<u32>>()
        };
        let a = run(&cfg);
        assert_eq!(a, run(&cfg), "same seed, same tokens");
        assert_ne!(
            a,
            run(&SamplerConfig {
                seed: 43,
                ..cfg.clone()
            })
        );
        // Every draw survives top-k 40 and min-p: none of the lowest logits appear.
        let min = logits.iter().copied().fold(f32::INFINITY, f32::min);
        assert!(a.iter().all(|&t| logits[t as usize] > min));
        // Only one token can survive top-k 1: the sampler is then greedy.
        let mut s = Sampler::new(SamplerConfig { top_k: 1, ..cfg });
        let best = Sampler::new(SamplerConfig::greedy()).sample(&logits, &[]);
        assert!((0..20).all(|_| s.sample(&logits, &[]) == best));
    }
}
