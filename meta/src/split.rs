//! Split states: how one tensor is spread over the parts of a meta device, the arithmetic of
//! slices along an axis, and the rounding of split ratios to whole units (quantization blocks,
//! attention heads with their GQA group).

use std::fmt;

use tessera_core::dtype::DType;
use tessera_core::error::{Error, Result};
use tessera_core::tensor::{Tensor, MAX_DIMS};

/// How a tensor is spread over the parts of a meta device (ggml's split axis, MIRRORED and
/// PARTIAL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitState {
    /// Every part holds the whole tensor, with the same values.
    Mirrored,
    /// Every part holds a tensor of the whole shape; the value is the sum over the parts.
    Partial,
    /// Every part holds a slice along one axis.
    Split(AxisSplit),
}

impl SplitState {
    /// A split along `axis` in one segment, part `j` holding `counts[j]` elements.
    pub fn split(axis: usize, counts: Vec<usize>) -> SplitState {
        SplitState::Split(AxisSplit::new(axis, counts))
    }

    /// The axis split, when the state is one.
    pub fn as_split(&self) -> Option<&AxisSplit> {
        match self {
            SplitState::Split(x) => Some(x),
            _ => None,
        }
    }

    /// Checks that the state fits a tensor of type `dtype` and shape `ne` over `parts` parts:
    /// the slices add up to the axis and never cut a quantization block.
    pub fn check_fits(
        &self,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        parts: usize,
    ) -> std::result::Result<(), String> {
        let Some(x) = self.as_split() else {
            return Ok(());
        };
        if x.axis >= MAX_DIMS {
            return Err(format!("split axis {} is not 0-3", x.axis));
        }
        if x.parts() != parts {
            return Err(format!(
                "the split names {} parts, the meta device has {parts}",
                x.parts()
            ));
        }
        if x.len() != ne[x.axis] {
            return Err(format!(
                "slices add up to {} along axis {}, the tensor has {}",
                x.len(),
                x.axis,
                ne[x.axis]
            ));
        }
        let bs = dtype.block_size();
        if x.axis == 0
            && bs > 1
            && x.segments
                .iter()
                .any(|s| s.counts.iter().any(|c| !c.is_multiple_of(bs)))
        {
            return Err(format!("{x} would cut {dtype} blocks of {bs} elements"));
        }
        Ok(())
    }
}

impl fmt::Display for SplitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitState::Mirrored => f.write_str("mirrored"),
            SplitState::Partial => f.write_str("partial"),
            SplitState::Split(x) => write!(f, "{x}"),
        }
    }
}

/// One segment of an axis split: a stretch of the axis that is split on its own, repeated
/// `repeat` times back to back (a fused QKV weight is three segments, or a Q segment and a K/V
/// segment repeated twice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Elements along the axis each part holds of one repetition, in part order.
    pub counts: Vec<usize>,
    /// How many times the segment repeats.
    pub repeat: usize,
}

/// A split along one axis. Along the axis the full tensor is laid out segment after segment,
/// repetition after repetition, and within each repetition part 0's elements, then part 1's,
/// and so on; each part stores its own elements in the same order, packed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisSplit {
    /// The axis (0-3).
    pub axis: usize,
    /// The segments, in order along the axis.
    pub segments: Vec<Segment>,
}

/// A stretch of the axis that one part holds: where it starts in the full tensor and in the
/// part's slice, and how many elements it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Start along the axis in the full tensor.
    pub full: usize,
    /// Start along the axis in the part's slice.
    pub part: usize,
    /// Elements.
    pub len: usize,
}

impl AxisSplit {
    /// A split along `axis` in one segment, part `j` holding `counts[j]` elements.
    pub fn new(axis: usize, counts: Vec<usize>) -> AxisSplit {
        AxisSplit {
            axis,
            segments: vec![Segment { counts, repeat: 1 }],
        }
    }

    /// A split along `axis` in several segments; every segment must name the same number of
    /// parts and repeat at least once.
    pub fn with_segments(axis: usize, segments: Vec<Segment>) -> Result<AxisSplit> {
        let Some(first) = segments.first() else {
            return Err(Error::Invalid("a split needs at least one segment".into()));
        };
        let n = first.counts.len();
        if segments
            .iter()
            .any(|s| s.counts.len() != n || s.repeat == 0)
        {
            return Err(Error::Invalid(
                "every segment of a split needs one count per part and a repeat of at least 1"
                    .into(),
            ));
        }
        Ok(AxisSplit { axis, segments })
    }

    /// Number of parts.
    pub fn parts(&self) -> usize {
        self.segments.first().map_or(0, |s| s.counts.len())
    }

    /// Elements along the axis in the full tensor.
    pub fn len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.repeat * s.counts.iter().sum::<usize>())
            .sum()
    }

    /// Whether the axis is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements along the axis that part `j` holds.
    pub fn part_len(&self, j: usize) -> usize {
        self.segments
            .iter()
            .map(|s| s.repeat * s.counts.get(j).copied().unwrap_or(0))
            .sum()
    }

    /// Every stretch part `j` holds, in order.
    pub fn intervals(&self, j: usize) -> Vec<Interval> {
        let mut out = Vec::new();
        let (mut full, mut part) = (0, 0);
        for s in &self.segments {
            let total: usize = s.counts.iter().sum();
            let before: usize = s.counts.iter().take(j).sum();
            let len = s.counts.get(j).copied().unwrap_or(0);
            for _ in 0..s.repeat {
                if len > 0 {
                    out.push(Interval {
                        full: full + before,
                        part,
                        len,
                    });
                }
                full += total;
                part += len;
            }
        }
        out
    }

    /// Where part `j`'s one stretch starts in the full tensor, when the split is one segment
    /// that does not repeat (what a view of a mirrored tensor can select).
    pub fn single_range(&self, j: usize) -> Option<usize> {
        match self.segments.as_slice() {
            [s] if s.repeat == 1 => Some(s.counts.iter().take(j).sum()),
            _ => None,
        }
    }

    /// The same split along another axis.
    pub fn on_axis(&self, axis: usize) -> AxisSplit {
        AxisSplit {
            axis,
            segments: self.segments.clone(),
        }
    }

    /// Every count times `num / den`, when every product divides exactly.
    pub fn scaled(&self, num: usize, den: usize) -> Option<AxisSplit> {
        if den == 0 {
            return None;
        }
        let mut segments = Vec::with_capacity(self.segments.len());
        for s in &self.segments {
            let mut counts = Vec::with_capacity(s.counts.len());
            for &c in &s.counts {
                let p = c.checked_mul(num)?;
                if !p.is_multiple_of(den) {
                    return None;
                }
                counts.push(p / den);
            }
            segments.push(Segment {
                counts,
                repeat: s.repeat,
            });
        }
        Some(AxisSplit {
            axis: self.axis,
            segments,
        })
    }

    /// The part of the split covering `lo..hi` along the axis, when that range is a run of
    /// whole segment repetitions; with it, where the range starts in each part's slice.
    pub fn restrict(&self, lo: usize, hi: usize) -> Option<(AxisSplit, Vec<usize>)> {
        let n = self.parts();
        let mut segments: Vec<Segment> = Vec::new();
        let mut starts = vec![0; n];
        let mut full = 0;
        let mut started = false;
        for s in &self.segments {
            let total: usize = s.counts.iter().sum();
            let mut taken = 0;
            for _ in 0..s.repeat {
                if full == lo {
                    started = true;
                }
                if full >= hi {
                    break;
                }
                if started {
                    taken += 1;
                } else {
                    for (st, &c) in starts.iter_mut().zip(&s.counts) {
                        *st += c;
                    }
                }
                full += total;
            }
            if taken > 0 {
                segments.push(Segment {
                    counts: s.counts.clone(),
                    repeat: taken,
                });
            }
        }
        let covered: usize = segments
            .iter()
            .map(|s| s.repeat * s.counts.iter().sum::<usize>())
            .sum();
        if !started || lo + covered != hi {
            return None;
        }
        if segments.is_empty() {
            segments.push(Segment {
                counts: vec![0; n],
                repeat: 1,
            });
        }
        Some((
            AxisSplit {
                axis: self.axis,
                segments,
            },
            starts,
        ))
    }
}

impl fmt::Display for AxisSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "split along axis {} (", self.axis)?;
        for (i, s) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            let c: Vec<String> = s.counts.iter().map(|c| c.to_string()).collect();
            f.write_str(&c.join("+"))?;
            if s.repeat > 1 {
                write!(f, " x{}", s.repeat)?;
            }
        }
        f.write_str(")")
    }
}

/// Checks a ratio list for `parts` parts (as many entries, none negative or not finite, not all
/// zero) and scales it to sum to 1.
pub fn normalize_ratios(ratios: &[f64], parts: usize) -> Result<Vec<f64>> {
    if ratios.len() != parts {
        return Err(Error::Invalid(format!(
            "the split ratio list has {} entries but the meta device has {parts} parts",
            ratios.len()
        )));
    }
    if let Some(bad) = ratios.iter().find(|r| !r.is_finite() || **r < 0.0) {
        return Err(Error::Invalid(format!(
            "split ratio {bad} is negative or not a number; ratios are shares like 0.6,0.4"
        )));
    }
    let sum: f64 = ratios.iter().sum();
    if sum <= 0.0 {
        return Err(Error::Invalid(
            "every split ratio is zero: at least one part must take work".into(),
        ));
    }
    Ok(ratios.iter().map(|r| r / sum).collect())
}

/// Divides `total` whole units among parts in proportion to `ratios` (largest remainders; a
/// part with ratio 0 gets nothing; ties go to the lower index).
pub fn partition(total: usize, ratios: &[f64]) -> Vec<usize> {
    let n = ratios.len();
    let sum: f64 = ratios.iter().filter(|r| r.is_finite() && **r > 0.0).sum();
    if n == 0 {
        return Vec::new();
    }
    if sum <= 0.0 {
        let mut v = vec![0; n];
        v[0] = total;
        return v;
    }
    let share = |r: f64| {
        if r.is_finite() && r > 0.0 {
            total as f64 * r / sum
        } else {
            0.0
        }
    };
    let mut counts: Vec<usize> = ratios
        .iter()
        .map(|&r| (share(r).floor() as usize).min(total))
        .collect();
    let mut given: usize = counts.iter().sum();
    // Float noise can give one unit too many; take it back from the largest share.
    while given > total {
        if let Some(i) = (0..n).max_by_key(|&i| counts[i]) {
            counts[i] -= 1;
            given -= 1;
        }
    }
    let mut order: Vec<usize> = (0..n)
        .filter(|&i| ratios[i].is_finite() && ratios[i] > 0.0)
        .collect();
    order.sort_by(|&a, &b| {
        let fa = share(ratios[a]) - share(ratios[a]).floor();
        let fb = share(ratios[b]) - share(ratios[b]).floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let mut k = 0;
    while given < total && !order.is_empty() {
        counts[order[k % order.len()]] += 1;
        given += 1;
        k += 1;
    }
    counts
}

/// Divides `total` elements among parts by `ratios` in whole units of `unit` elements (a
/// quantization block, a head times its GQA group); an error when `total` is not a whole
/// number of units.
pub fn partition_units(
    total: usize,
    unit: usize,
    ratios: &[f64],
    what: &str,
) -> Result<Vec<usize>> {
    let unit = unit.max(1);
    if !total.is_multiple_of(unit) {
        return Err(Error::Invalid(format!(
            "{what}: {total} elements are not a whole number of {unit}-element units"
        )));
    }
    Ok(partition(total / unit, ratios)
        .into_iter()
        .map(|c| c * unit)
        .collect())
}

/// Byte stretches of a contiguous tensor of type `dtype` and shape `ne` that part `j` of split
/// `x` holds: `(byte offset in the full tensor, byte offset in the part's packed slice, bytes)`,
/// adjacent stretches merged.
pub fn byte_chunks(
    dtype: DType,
    ne: [usize; MAX_DIMS],
    x: &AxisSplit,
    j: usize,
) -> Vec<(usize, usize, usize)> {
    let a = x.axis.min(MAX_DIMS - 1);
    let nb = Tensor::contiguous_strides(dtype, ne);
    let (unit_bytes, per_unit) = if a == 0 {
        (dtype.type_size(), dtype.block_size())
    } else {
        (nb[a], 1)
    };
    let full_slab = unit_bytes * (ne[a] / per_unit);
    let part_slab = unit_bytes * (x.part_len(j) / per_unit);
    let outer: usize = ne[a + 1..].iter().product();
    let ivs = x.intervals(j);
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for o in 0..outer {
        for iv in &ivs {
            let f = o * full_slab + iv.full / per_unit * unit_bytes;
            let p = o * part_slab + iv.part / per_unit * unit_bytes;
            let len = iv.len / per_unit * unit_bytes;
            match out.last_mut() {
                Some(last) if last.0 + last.2 == f && last.1 + last.2 == p => last.2 += len,
                _ => out.push((f, p, len)),
            }
        }
    }
    out
}

/// The shape of part `j`'s slice of a tensor of shape `ne` in state `state`.
pub fn part_shape(ne: [usize; MAX_DIMS], state: &SplitState, j: usize) -> [usize; MAX_DIMS] {
    let mut out = ne;
    if let SplitState::Split(x) = state {
        out[x.axis] = x.part_len(j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_rounds_by_largest_remainder_and_keeps_zero_ratios_empty() {
        assert_eq!(partition(3, &[0.7, 0.3]), vec![2, 1]);
        assert_eq!(partition(48, &[0.5, 0.3, 0.2]), vec![24, 14, 10]);
        assert_eq!(partition(3, &[0.6, 0.4, 0.0]), vec![2, 1, 0]);
        assert_eq!(partition(3, &[0.25; 4]), vec![1, 1, 1, 0]);
        assert_eq!(partition(0, &[0.5, 0.5]), vec![0, 0]);
        assert_eq!(
            partition_units(1536, 32, &[0.7, 0.3], "ffn").unwrap(),
            vec![1088, 448]
        );
        assert!(partition_units(100, 32, &[0.5, 0.5], "x").is_err());
    }

    #[test]
    fn ratios_are_checked() {
        assert!(normalize_ratios(&[0.6, 0.4], 3).is_err());
        assert!(normalize_ratios(&[0.6, -0.4], 2).is_err());
        assert!(normalize_ratios(&[0.0, 0.0], 2).is_err());
        assert!(normalize_ratios(&[f64::NAN, 1.0], 2).is_err());
        assert_eq!(normalize_ratios(&[3.0, 1.0], 2).unwrap(), vec![0.75, 0.25]);
    }

    #[test]
    fn segments_give_each_part_a_slice_of_every_segment() {
        // A fused QKV: Q of 8 rows split 6+2, K and V of 4 rows split 3+1 (a segment repeated twice).
        let x = AxisSplit::with_segments(
            1,
            vec![
                Segment {
                    counts: vec![6, 2],
                    repeat: 1,
                },
                Segment {
                    counts: vec![3, 1],
                    repeat: 2,
                },
            ],
        )
        .unwrap();
        assert_eq!(x.len(), 16);
        assert_eq!(x.part_len(0), 12);
        assert_eq!(x.part_len(1), 4);
        let i1: Vec<(usize, usize, usize)> = x
            .intervals(1)
            .iter()
            .map(|i| (i.full, i.part, i.len))
            .collect();
        assert_eq!(i1, vec![(6, 0, 2), (11, 2, 1), (15, 3, 1)]);
        // The K segment alone.
        let (k, starts) = x.restrict(8, 12).unwrap();
        assert_eq!(
            k.segments,
            vec![Segment {
                counts: vec![3, 1],
                repeat: 1
            }]
        );
        assert_eq!(starts, vec![6, 2]);
        // K and V together.
        let (kv, starts) = x.restrict(8, 16).unwrap();
        assert_eq!(
            kv.segments,
            vec![Segment {
                counts: vec![3, 1],
                repeat: 2
            }]
        );
        assert_eq!(starts, vec![6, 2]);
        assert!(x.restrict(0, 9).is_none());
        assert!(x.restrict(3, 8).is_none());
        assert_eq!(x.restrict(0, 16).unwrap().0, x);
    }

    #[test]
    fn byte_chunks_cover_the_slices() {
        // [4, 3] f32 split along axis 0 as 3+1: part 1 holds column 3 of every row.
        let x = AxisSplit::new(0, vec![3, 1]);
        assert_eq!(
            byte_chunks(DType::F32, [4, 3, 1, 1], &x, 1),
            vec![(12, 0, 4), (28, 4, 4), (44, 8, 4)]
        );
        assert_eq!(
            byte_chunks(DType::F32, [4, 3, 1, 1], &x, 0),
            vec![(0, 0, 12), (16, 12, 12), (32, 24, 12)]
        );
        // Rows split: one stretch each.
        let y = AxisSplit::new(1, vec![2, 1]);
        assert_eq!(
            byte_chunks(DType::F32, [4, 3, 1, 1], &y, 1),
            vec![(32, 0, 16)]
        );
        // Quantized along axis 0: whole blocks.
        let q = AxisSplit::new(0, vec![32, 32]);
        assert_eq!(
            byte_chunks(DType::Q8_0, [64, 2, 1, 1], &q, 1),
            vec![(34, 0, 34), (102, 34, 34)]
        );
        let s = SplitState::split(0, vec![16, 48]);
        assert!(s.check_fits(DType::Q8_0, [64, 2, 1, 1], 2).is_err());
        assert!(s.check_fits(DType::F32, [64, 2, 1, 1], 2).is_ok());
    }
}
