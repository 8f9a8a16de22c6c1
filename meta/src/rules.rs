//! The per-op rules that derive a computed tensor's split state from its sources', and the
//! mapping of views onto the slices of the tensor they view.
//!
//! A rule sees the sources' states as the node will read them. A PARTIAL source is first
//! summed across the parts (all-reduced) unless the op is linear in it and keeps it partial
//! ([`keeps_partial`]); after the all-reduce it reads as MIRRORED. A MIRRORED source can be
//! read as any slice the op needs for free: each part takes a view of its own whole copy
//! ([`SrcUse::Narrow`]). What no rule covers is refused with an [`Error::Split`] that names the
//! tensor, its op and the reason.

use tessera_core::error::{Error, Result};
use tessera_core::graph::Graph;
use tessera_core::op::{BinaryOp, Op};
use tessera_core::tensor::{Tensor, TensorId, MAX_DIMS};

use crate::experts;
use crate::split::{AxisSplit, SplitState};

/// How a part reads one source of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SrcUse {
    /// As the part holds it.
    AsIs,
    /// A mirrored source, narrowed by a view of the part's whole copy to this split's slice.
    Narrow(AxisSplit),
    /// A mirrored source, narrowed by a view of the part's whole copy to `(start, len)` along
    /// `axis`, one stretch per part; unlike a split's slices, the stretches may overlap (parts
    /// whose query heads share a KV head each read that head).
    Stretch {
        /// The axis narrowed.
        axis: usize,
        /// Each part's stretch.
        ranges: Vec<(usize, usize)>,
    },
}

/// What a rule decided for a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The node's state and how each source is read.
    Done(SplitState, Vec<SrcUse>),
    /// These partial sources (by index) must be all-reduced first.
    Reduce(Vec<usize>),
}

/// Whether the op, linear in its partial sources, leaves its result partial.
fn keeps_partial(t: &Tensor, eff: &[SplitState]) -> bool {
    let p = |i: usize| matches!(eff.get(i), Some(SplitState::Partial));
    let m = |i: usize| matches!(eff.get(i), Some(SplitState::Mirrored));
    match &t.op {
        Op::Scale { bias, .. } => *bias == 0.0,
        Op::Cont | Op::Dup => true,
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => p(0) && p(1),
        Op::Binary(BinaryOp::Mul | BinaryOp::Div) => p(0) && m(1),
        Op::MulMat => m(0) && p(1),
        Op::GetRows => p(0) && m(1),
        Op::Sum | Op::SumRows => p(0),
        _ => false,
    }
}

/// How source `src` in state `s` can be read as `want`: as is when it already has that split,
/// narrowed when it is mirrored and the split is one stretch per part (`longer`: the source may
/// be longer along the axis, its tail unread).
fn fit(g: &Graph, src: TensorId, s: &SplitState, want: &AxisSplit, longer: bool) -> Option<SrcUse> {
    match s {
        SplitState::Split(x) if x == want => Some(SrcUse::AsIs),
        SplitState::Mirrored => {
            let t = g.get(src);
            let n = t.ne[want.axis];
            if !(n == want.len() || (longer && n > want.len())) {
                return None;
            }
            want.single_range(0)?;
            let bs = t.dtype.block_size();
            if want.axis == 0
                && bs > 1
                && want
                    .segments
                    .iter()
                    .any(|s| s.counts.iter().any(|c| !c.is_multiple_of(bs)))
            {
                return None;
            }
            Some(SrcUse::Narrow(want.clone()))
        }
        _ => None,
    }
}

/// Maps a split of a tensor of shape `from` onto the same elements seen with shape `to` (a
/// reshape: element order kept), when the split stretches stay whole stretches of one axis.
pub(crate) fn reshape_split(
    from: [usize; MAX_DIMS],
    x: &AxisSplit,
    to: [usize; MAX_DIMS],
) -> Option<AxisSplit> {
    let a = x.axis;
    let inner_src: usize = from[..a].iter().product();
    let outer_src = inner_src * from[a];
    let mut inner_v = 1usize;
    for (b, &n) in to.iter().enumerate() {
        let next = inner_v * n;
        if next == outer_src && n > 0 {
            return x.scaled(inner_src, inner_v).map(|s| s.on_axis(b));
        }
        if next > outer_src {
            return None;
        }
        inner_v = next;
    }
    None
}

/// A view of a split root, expressed in the root's coordinates: what each view axis steps
/// along, where the view starts, and the view's own split.
#[derive(Clone, Debug)]
pub(crate) struct Strided {
    /// For each view axis with more than one unit: (root axis, step in root units).
    map: [Option<(usize, usize)>; MAX_DIMS],
    /// The view's first element in root units along each root axis.
    origin: [usize; MAX_DIMS],
    /// The split root axis.
    root_axis: usize,
    /// Where the view's range starts in each part's slice of the root axis (root units).
    starts: Vec<usize>,
    /// The view's split.
    pub split: AxisSplit,
}

impl Strided {
    /// Part `j`'s view: shape, strides and byte offset into the part's packed root, whose
    /// contiguous strides are `part_nb`.
    pub fn part_layout(
        &self,
        view: &Tensor,
        part_nb: [usize; MAX_DIMS],
        j: usize,
    ) -> ([usize; MAX_DIMS], [usize; MAX_DIMS], usize) {
        let mut ne = view.ne;
        ne[self.split.axis] = self.split.part_len(j);
        // An axis of one element keeps its stride: it is never stepped along.
        let nb: [usize; MAX_DIMS] =
            std::array::from_fn(|k| self.map[k].map_or(view.nb[k], |(m, c)| c * part_nb[m]));
        let mut offset = 0;
        for (m, &pnb) in part_nb.iter().enumerate() {
            let o = if m == self.root_axis {
                self.starts.get(j).copied().unwrap_or(0)
            } else {
                self.origin[m]
            };
            offset += o * pnb;
        }
        (ne, nb, offset)
    }
}

/// Units along a root axis (blocks along axis 0 of a quantized type, elements otherwise).
fn units(t: &Tensor, m: usize) -> usize {
    if m == 0 {
        t.ne[0] / t.dtype.block_size()
    } else {
        t.ne[m]
    }
}

/// Expresses `view` (of contiguous `root`, split as `x`) in root coordinates.
pub(crate) fn decompose(
    root: &Tensor,
    view: &Tensor,
    x: &AxisSplit,
) -> std::result::Result<Strided, String> {
    if !root.is_contiguous() || root.nelements() == 0 {
        return Err("the viewed tensor is empty or not contiguous".into());
    }
    let bs = root.dtype.block_size();
    let u = root.nb;
    let live: Vec<usize> = (0..MAX_DIMS).filter(|&m| units(root, m) > 1).collect();
    let mut map = [None; MAX_DIMS];
    for (k, slot) in map.iter_mut().enumerate() {
        if units(view, k) <= 1 {
            continue;
        }
        let sigma = view.nb[k];
        let m = live
            .iter()
            .copied()
            .filter(|&m| u[m] > 0 && u[m] <= sigma)
            .max()
            .ok_or_else(|| format!("view axis {k} steps {sigma} bytes, less than one element"))?;
        if !sigma.is_multiple_of(u[m]) {
            return Err(format!(
                "view axis {k} steps {sigma} bytes, not a whole number of steps of axis {m}"
            ));
        }
        *slot = Some((m, sigma / u[m]));
    }
    let mut origin = [0; MAX_DIMS];
    let mut rem = view.view_offset;
    for m in live.iter().rev().copied() {
        origin[m] = rem / u[m];
        rem %= u[m];
    }
    if rem != 0 {
        return Err(format!(
            "the view starts at byte {} inside an element",
            view.view_offset
        ));
    }
    for (m, &o) in origin.iter().enumerate() {
        let reach: usize = (0..MAX_DIMS)
            .filter_map(|k| match map[k] {
                Some((mm, c)) if mm == m => Some((units(view, k) - 1) * c),
                _ => None,
            })
            .sum();
        if o + reach >= units(root, m).max(1) {
            return Err(format!(
                "the view runs past axis {m} of the viewed tensor (it steps across axes)"
            ));
        }
    }
    let a = x.axis;
    let mut along: Vec<(usize, usize)> = (0..MAX_DIMS)
        .filter_map(|k| map[k].filter(|&(m, _)| m == a).map(|(_, c)| (k, c)))
        .collect();
    along.sort_by_key(|&(_, c)| c);
    let Some(&(b, cb)) = along.last() else {
        return Err(format!("the view takes a single index of split axis {a}"));
    };
    let mut dense = 1;
    for &(k, c) in &along[..along.len() - 1] {
        if c != dense {
            return Err(format!(
                "view axes along split axis {a} do not tile it densely"
            ));
        }
        dense *= units(view, k);
    }
    if cb != dense {
        return Err(format!(
            "view axes along split axis {a} do not tile it densely"
        ));
    }
    let per = if a == 0 { bs } else { 1 };
    let xu = x
        .scaled(1, per)
        .ok_or_else(|| format!("{x} cuts blocks of {bs}"))?;
    let lo = origin[a];
    let hi = lo + cb * units(view, b);
    let (sub, starts) = xu.restrict(lo, hi).ok_or_else(|| {
        format!("the view covers {lo}..{hi} of split axis {a}, not whole slices ({x})")
    })?;
    let vper = if b == 0 { view.dtype.block_size() } else { 1 };
    let split = sub
        .scaled(vper, cb)
        .ok_or_else(|| format!("the slices of {x} are not whole steps of view axis {b}"))?
        .on_axis(b);
    Ok(Strided {
        map,
        origin,
        root_axis: a,
        starts,
        split,
    })
}

/// How a view tensor is laid out on each part, given its source's and root's states.
#[derive(Clone, Debug)]
pub(crate) enum ViewMap {
    /// Every part holds the whole source: the view is the same on every part.
    Same,
    /// The part view permutes the part source's axes (axis i moves to `axes[i]`).
    Permute([usize; MAX_DIMS]),
    /// The part view is the contiguous part source with the split axis scaled.
    Reshape,
    /// The part view is found in root coordinates.
    Strided(Box<Strided>),
}

/// The state of view `id` (a view op: view, reshape, permute, transpose) and how to lay it out.
pub(crate) fn view_rule(
    g: &Graph,
    id: TensorId,
    src_state: &SplitState,
    root_state: &SplitState,
) -> Result<(SplitState, ViewMap)> {
    let t = g.get(id);
    let err = |reason: String| Error::Split {
        tensor: g.label(id),
        op: t.op.name(),
        reason,
    };
    let x = match src_state {
        SplitState::Split(x) => x,
        other => return Ok((other.clone(), ViewMap::Same)),
    };
    let src = g.get(
        *t.src
            .first()
            .ok_or_else(|| err("a view without a source".into()))?,
    );
    match &t.op {
        Op::Permute(axes) => Ok((
            SplitState::Split(x.on_axis(axes[x.axis])),
            ViewMap::Permute(*axes),
        )),
        Op::Transpose => Ok((
            SplitState::Split(x.on_axis([1, 0, 2, 3][x.axis])),
            ViewMap::Permute([1, 0, 2, 3]),
        )),
        Op::Reshape => reshape_split(src.ne, x, t.ne)
            .map(|s| (SplitState::Split(s), ViewMap::Reshape))
            .ok_or_else(|| {
                err(format!(
                    "{x} of {:?} is not a whole stretch of one axis of {:?}",
                    src.ne, t.ne
                ))
            }),
        _ => {
            let src_offset = if src.view_src.is_some() {
                src.view_offset
            } else {
                0
            };
            if t.is_contiguous()
                && src.is_contiguous()
                && t.nelements() == src.nelements()
                && t.view_offset == src_offset
            {
                if let Some(s) = reshape_split(src.ne, x, t.ne) {
                    return Ok((SplitState::Split(s), ViewMap::Reshape));
                }
            }
            let root_split = root_state
                .as_split()
                .ok_or_else(|| err(format!("its source is {x} but its root is {root_state}")))?;
            let (root, _) = g.root(id);
            let s = decompose(g.get(root), t, root_split).map_err(err)?;
            Ok((
                SplitState::Split(s.split.clone()),
                ViewMap::Strided(Box::new(s)),
            ))
        }
    }
}

/// The split state of computed node `id` from its sources' states `eff` (as the node reads
/// them), and how each source is read.
pub(crate) fn node_rule(g: &Graph, id: TensorId, eff: &[SplitState]) -> Result<Rule> {
    let t = g.get(id);
    let n = eff.len();
    let partial: Vec<usize> = (0..n).filter(|&i| eff[i] == SplitState::Partial).collect();
    if !partial.is_empty() {
        if keeps_partial(t, eff) || experts::keeps_partial(g, id, eff) {
            return Ok(Rule::Done(SplitState::Partial, vec![SrcUse::AsIs; n]));
        }
        return Ok(Rule::Reduce(partial));
    }
    if eff.iter().all(|s| *s == SplitState::Mirrored) {
        return Ok(Rule::Done(SplitState::Mirrored, vec![SrcUse::AsIs; n]));
    }
    let err = |reason: String| Error::Split {
        tensor: g.label(id),
        op: t.op.name(),
        reason,
    };
    let src = |i: usize| {
        t.src
            .get(i)
            .copied()
            .ok_or_else(|| err(format!("source {i} is missing")))
    };
    let ts = |i: usize| src(i).map(|s| g.get(s));
    let split_of = |i: usize| eff.get(i).and_then(SplitState::as_split);
    let as_is = |k: usize| vec![SrcUse::AsIs; k];
    let done = |x: AxisSplit, uses: Vec<SrcUse>| Ok(Rule::Done(SplitState::Split(x), uses));
    let need_mirrored = |i: usize, why: &str| -> Result<SrcUse> {
        match eff.get(i) {
            None | Some(SplitState::Mirrored) => Ok(SrcUse::AsIs),
            Some(s) => Err(err(format!("source {i} is {s} but {why}"))),
        }
    };
    let fit_or = |i: usize, want: &AxisSplit, longer: bool| -> Result<SrcUse> {
        let s = eff
            .get(i)
            .ok_or_else(|| err(format!("source {i} is missing")))?;
        fit(g, src(i)?, s, want, longer)
            .ok_or_else(|| err(format!("source {i} is {s}, which cannot be read as {want}")))
    };
    match &t.op {
        Op::AllReduce => Err(err(
            "an all-reduce is placed by the meta device itself, not split".into(),
        )),
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } | Op::Cont | Op::Dup => {
            Ok(Rule::Done(eff[0].clone(), as_is(n)))
        }
        Op::Binary(_) => {
            let (ta, tb) = (ts(0)?, ts(1)?);
            if let Some(x) = split_of(0) {
                let k = x.axis;
                let ub = if tb.ne[k] == 1 {
                    need_mirrored(1, "src1 is broadcast along the split axis")?
                } else if tb.ne[k] == ta.ne[k] {
                    fit_or(1, x, false)?
                } else {
                    return Err(err(format!("src1 repeats along split axis {k}")));
                };
                done(x.clone(), vec![SrcUse::AsIs, ub])
            } else {
                let y = split_of(1).ok_or_else(|| err("no split source".into()))?;
                if ta.ne[y.axis] != tb.ne[y.axis] {
                    return Err(err(format!(
                        "src1 is {y} but src0 broadcasts it along that axis"
                    )));
                }
                done(y.clone(), vec![fit_or(0, y, false)?, SrcUse::AsIs])
            }
        }
        Op::Glu { .. } if n == 1 => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            if x.axis == 0 {
                return Err(err(
                    "a fused gate/up row must stay whole (split along another axis)".into(),
                ));
            }
            done(x.clone(), as_is(1))
        }
        Op::Glu { .. } | Op::SwigluOai { .. } | Op::Concat(_) => {
            let x = split_of(0)
                .or(split_of(1))
                .ok_or_else(|| err("no split source".into()))?
                .clone();
            if let Op::Concat(dim) = t.op {
                if dim == x.axis {
                    return Err(err(format!("joins along split axis {dim}")));
                }
            }
            done(
                x.clone(),
                vec![fit_or(0, &x, false)?, fit_or(1, &x, false)?],
            )
        }
        Op::Cpy => {
            let (ta, tb) = (ts(0)?, ts(1)?);
            let y = split_of(1).ok_or_else(|| {
                err(format!(
                    "copies a {} source into a mirrored destination (it would need gathering)",
                    eff[0]
                ))
            })?;
            let xa = reshape_split(tb.ne, y, ta.ne).ok_or_else(|| {
                err(format!(
                    "destination {y} of {:?} is no whole stretch of the source {:?}",
                    tb.ne, ta.ne
                ))
            })?;
            done(y.clone(), vec![fit_or(0, &xa, false)?, SrcUse::AsIs])
        }
        Op::GetRows => match (split_of(0), split_of(1)) {
            (Some(x), None) if x.axis == 0 => done(x.clone(), as_is(2)),
            (Some(x), _) if x.axis >= 2 => done(
                x.clone(),
                vec![SrcUse::AsIs, fit_or(1, &x.on_axis(x.axis - 1), false)?],
            ),
            (None, Some(y)) if y.axis == 0 => done(y.on_axis(1), as_is(2)),
            (None, Some(y)) if y.axis <= 2 => done(
                y.on_axis(y.axis + 1),
                vec![fit_or(0, &y.on_axis(y.axis + 1), false)?, SrcUse::AsIs],
            ),
            _ => Err(err(format!(
                "rows {} picked by indices {}: the rows cannot be split",
                eff[0], eff[1]
            ))),
        },
        Op::SetRows => {
            let x = split_of(0).ok_or_else(|| {
                err(
                    "writes split rows into a mirrored destination (it would need gathering)"
                        .into(),
                )
            })?;
            let (tb, ti) = (ts(1)?, ts(2)?);
            match x.axis {
                0 => done(
                    x.clone(),
                    vec![
                        SrcUse::AsIs,
                        fit_or(1, x, false)?,
                        need_mirrored(2, "every part writes every row")?,
                    ],
                ),
                1 => Err(err(
                    "the destination is split by rows, which are picked at run time".into(),
                )),
                k => {
                    let ui = if ti.ne[k - 1] == 1 {
                        need_mirrored(2, "the indices are broadcast")?
                    } else if ti.ne[k - 1] == tb.ne[k] {
                        fit_or(2, &x.on_axis(k - 1), false)?
                    } else {
                        return Err(err("the indices repeat along the split axis".into()));
                    };
                    done(x.clone(), vec![SrcUse::AsIs, fit_or(1, x, false)?, ui])
                }
            }
        }
        Op::MulMat => mul_mat(g, id, eff, &err, &fit_or),
        Op::Rope(_) => {
            // Every head and token rotates with all the frequency factors (the optional third
            // source): each part reads the whole, mirrored.
            let factors: Vec<SrcUse> = if n > 2 {
                vec![need_mirrored(
                    2,
                    "every head rotates with every frequency factor",
                )?]
            } else {
                Vec::new()
            };
            let (x, mut uses) = match split_of(0) {
                Some(x) if x.axis == 0 => {
                    return Err(err(
                        "rope rotates pairs inside each head: split by heads or tokens".into(),
                    ))
                }
                Some(x) if x.axis == 2 => (
                    x.clone(),
                    vec![SrcUse::AsIs, fit_or(1, &x.on_axis(0), false)?],
                ),
                Some(x) => (
                    x.clone(),
                    vec![SrcUse::AsIs, need_mirrored(1, "positions go with tokens")?],
                ),
                None => {
                    let y = split_of(1).ok_or_else(|| err("no split source".into()))?;
                    (
                        y.on_axis(2),
                        vec![fit_or(0, &y.on_axis(2), false)?, SrcUse::AsIs],
                    )
                }
            };
            uses.extend(factors);
            done(x, uses)
        }
        Op::FlashAttnExt { max_bias, .. } => flash_attn(g, id, eff, *max_bias, &err, &fit_or),
        Op::SoftMax { max_bias, .. } => {
            let x = split_of(0)
                .ok_or_else(|| err("the mask is split but the scores are not".into()))?;
            let k = x.axis;
            if k == 0 {
                return Err(err("soft_max needs whole rows".into()));
            }
            if k == 2 && *max_bias != 0.0 {
                return Err(err("ALiBi slopes depend on the head: split by rows".into()));
            }
            let mut uses = vec![SrcUse::AsIs];
            if n > 1 {
                let (ta, tm) = (ts(0)?, ts(1)?);
                uses.push(if tm.ne[k] == 1 {
                    need_mirrored(1, "the mask is broadcast")?
                } else if k == 1 || tm.ne[k] == ta.ne[k] {
                    fit_or(1, x, k == 1)?
                } else {
                    return Err(err("the mask repeats along the split axis".into()));
                });
            }
            done(x.clone(), uses)
        }
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::Mean => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            if x.axis == 0 {
                return Err(err(format!(
                    "{} needs whole rows: split by rows (axis 1-3), not along them",
                    t.op.name()
                )));
            }
            done(x.clone(), as_is(1))
        }
        Op::DiagMaskInf(_) => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            if x.axis < 2 {
                return Err(err(
                    "the mask depends on row and column: split along axis 2 or 3".into(),
                ));
            }
            done(x.clone(), as_is(1))
        }
        Op::Repeat | Op::Pad(_) => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            let ta = ts(0)?;
            let ok = match &t.op {
                Op::Pad(p) => p[x.axis] == 0,
                _ => t.ne[x.axis] == ta.ne[x.axis],
            };
            if !ok {
                return Err(err(format!("the result grows along split axis {}", x.axis)));
            }
            done(x.clone(), as_is(1))
        }
        Op::Sum => Ok(Rule::Done(SplitState::Partial, as_is(1))),
        Op::SumRows => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            if x.axis == 0 {
                Ok(Rule::Done(SplitState::Partial, as_is(1)))
            } else {
                done(x.clone(), as_is(1))
            }
        }
        Op::Argmax => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            if x.axis != 1 {
                return Err(err("argmax needs whole rows: split by rows".into()));
            }
            done(x.on_axis(0), as_is(1))
        }
        Op::MulMatId { .. }
            if split_of(0)
                .is_some_and(|x| x.axis == experts::EXPERT_AXIS && x.segments.len() == 1) =>
        {
            // Whole experts on each part (expert parallelism): see experts.rs.
            Ok(Rule::Done(
                SplitState::Partial,
                vec![
                    SrcUse::AsIs,
                    need_mirrored(1, "every part multiplies every routed row")?,
                    need_mirrored(2, "every part routes every row")?,
                ],
            ))
        }
        Op::MulMatId { .. } => {
            // Column-parallel experts: every expert's rows split alike, the routed rows and
            // ids whole on every part.
            let x = split_of(0).filter(|x| x.axis == 1).ok_or_else(|| {
                err(format!(
                    "experts {} with rows {} and ids {}: only experts split by their rows \
                     (axis 1) or whole (axis 2) are computed",
                    eff[0], eff[1], eff[2]
                ))
            })?;
            done(
                x.on_axis(0),
                vec![
                    SrcUse::AsIs,
                    need_mirrored(1, "every part multiplies every routed row")?,
                    need_mirrored(2, "every part routes every row")?,
                ],
            )
        }
        Op::AddId => {
            let x = split_of(0)
                .or(split_of(1).filter(|y| y.axis == 0))
                .ok_or_else(|| err("no split source".into()))?
                .clone();
            if x.axis != 0 {
                return Err(err(
                    "the per-expert rows are added whole: split along axis 0".into(),
                ));
            }
            done(
                x.clone(),
                vec![
                    fit_or(0, &x, false)?,
                    fit_or(1, &x, false)?,
                    need_mirrored(2, "every part reads every id")?,
                ],
            )
        }
        Op::Argsort { .. } | Op::TopK(_) => {
            let x = split_of(0).ok_or_else(|| err("no split source".into()))?;
            if x.axis == 0 {
                return Err(err(format!(
                    "{} orders whole rows: split by rows, not along them",
                    t.op.name()
                )));
            }
            done(x.clone(), as_is(1))
        }
        Op::None | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose | Op::Arange { .. } => {
            Err(err("not a computed node (no rule)".into()))
        }
    }
}

type ErrFn<'a> = dyn Fn(String) -> Error + 'a;
type FitFn<'a> = dyn Fn(usize, &AxisSplit, bool) -> Result<SrcUse> + 'a;

/// mul_mat: column-parallel (src0 split by rows: result split along axis 0), row-parallel
/// (both split along the inner axis: partial result), token- or batch-parallel.
fn mul_mat(
    g: &Graph,
    id: TensorId,
    eff: &[SplitState],
    err: &ErrFn,
    fit_or: &FitFn,
) -> Result<Rule> {
    let t = g.get(id);
    let (ta, tb) = (g.get(t.src[0]), g.get(t.src[1]));
    let split_of = |i: usize| eff.get(i).and_then(SplitState::as_split);
    match (split_of(0), split_of(1)) {
        (Some(x), None) if x.axis == 1 => Ok(Rule::Done(
            SplitState::Split(x.on_axis(0)),
            vec![SrcUse::AsIs; 2],
        )),
        (Some(x), _) if x.axis == 0 => Ok(Rule::Done(
            SplitState::Partial,
            vec![SrcUse::AsIs, fit_or(1, x, false)?],
        )),
        (None, Some(y)) if y.axis == 0 => Ok(Rule::Done(
            SplitState::Partial,
            vec![fit_or(0, y, false)?, SrcUse::AsIs],
        )),
        (None, Some(y)) if y.axis == 1 => Ok(Rule::Done(
            SplitState::Split(y.clone()),
            vec![SrcUse::AsIs; 2],
        )),
        (a, b) => {
            let k = b.or(a).map(|s| s.axis).unwrap_or(2);
            if k < 2 {
                return Err(err(format!(
                    "src0 is {} and src1 is {}: no rule splits both",
                    eff[0], eff[1]
                )));
            }
            let yb = match (a, b) {
                (_, Some(y)) if y.axis == k => y.clone(),
                (Some(x), _) if x.axis == k && ta.ne[k] > 1 => x
                    .scaled(tb.ne[k] / ta.ne[k], 1)
                    .ok_or_else(|| err(format!("src0 {x} does not map onto src1's batch")))?,
                _ => {
                    return Err(err(format!(
                        "src0 is {} and src1 is {}: no rule splits both",
                        eff[0], eff[1]
                    )))
                }
            };
            let ua = if ta.ne[k] == 1 {
                match &eff[0] {
                    SplitState::Mirrored => SrcUse::AsIs,
                    s => {
                        return Err(err(format!(
                            "src0 is broadcast along batch axis {k} but is {s}"
                        )))
                    }
                }
            } else {
                let r = tb.ne[k] / ta.ne[k];
                let xa = yb.scaled(1, r).ok_or_else(|| {
                    err(format!("{yb} cuts src0's broadcast batch groups of {r}"))
                })?;
                fit_or(0, &xa, false)?
            };
            Ok(Rule::Done(
                SplitState::Split(yb.clone()),
                vec![ua, fit_or(1, &yb, false)?],
            ))
        }
    }
}

/// flash_attn_ext: by heads (KV heads with their GQA group of query heads), by query rows, or by
/// batch. Sinks (one per query head) split with the query heads, and are whole otherwise.
fn flash_attn(
    g: &Graph,
    id: TensorId,
    eff: &[SplitState],
    max_bias: f32,
    err: &ErrFn,
    fit_or: &FitFn,
) -> Result<Rule> {
    let t = g.get(id);
    let (tq, tk) = (g.get(t.src[0]), g.get(t.src[1]));
    let split_of = |i: usize| eff.get(i).and_then(SplitState::as_split);
    let first = (0..3)
        .find_map(split_of)
        .ok_or_else(|| err("the mask is split but q, k and v are not".into()))?;
    let sinks = matches!(t.op, Op::FlashAttnExt { sinks: true, .. });
    let has_mask = t.src.len() > 3 + usize::from(sinks);
    let sinks_at = 3 + usize::from(has_mask);
    let whole_sinks = |uses: &mut Vec<SrcUse>| -> Result<()> {
        if sinks {
            uses.push(match &eff[sinks_at] {
                SplitState::Mirrored => SrcUse::AsIs,
                s => {
                    return Err(err(format!(
                        "the sinks are {s}, but every part attends with every head's"
                    )))
                }
            });
        }
        Ok(())
    };
    let mask_use = |x: &AxisSplit, longer: bool| -> Result<SrcUse> {
        if !has_mask {
            return Ok(SrcUse::AsIs);
        }
        let tm = g.get(t.src[3]);
        if tm.ne[x.axis] == 1 {
            return match &eff[3] {
                SplitState::Mirrored => Ok(SrcUse::AsIs),
                s => Err(err(format!(
                    "the mask is broadcast along axis {} but is {s}",
                    x.axis
                ))),
            };
        }
        fit_or(3, x, longer)
    };
    match first.axis {
        2 => {
            if max_bias != 0.0 {
                return Err(err(
                    "ALiBi slopes depend on the head: split by query rows".into()
                ));
            }
            let group = tq.ne[2] / tk.ne[2].max(1);
            let xq = match split_of(0) {
                Some(x) => x.clone(),
                None => first
                    .scaled(group, 1)
                    .ok_or_else(|| err("kv heads overflow".into()))?,
            };
            let kv_mirrored = eff[1] == SplitState::Mirrored && eff[2] == SplitState::Mirrored;
            let mut uses = vec![fit_or(0, &xq, false)?];
            match xq.scaled(1, group) {
                Some(xkv) => {
                    uses.push(fit_or(1, &xkv, false)?);
                    uses.push(fit_or(2, &xkv, false)?);
                }
                None if kv_mirrored => {
                    let ranges = shared_kv_heads(&xq, group).map_err(&err)?;
                    for _ in 0..2 {
                        uses.push(SrcUse::Stretch {
                            axis: 2,
                            ranges: ranges.clone(),
                        });
                    }
                }
                None => {
                    return Err(err(format!(
                        "{xq} of the query heads cuts a GQA group of {group}"
                    )))
                }
            }
            if has_mask {
                uses.push(mask_use(&xq, false)?);
            }
            if sinks {
                uses.push(fit_or(sinks_at, &xq.on_axis(0), false)?);
            }
            Ok(Rule::Done(SplitState::Split(xq.on_axis(1)), uses))
        }
        1 => {
            let x = split_of(0)
                .ok_or_else(|| err("k and v split by cells: attention needs every cell".into()))?
                .clone();
            let mut uses = vec![SrcUse::AsIs];
            for (i, s) in eff.iter().enumerate().take(3).skip(1) {
                uses.push(match s {
                    SplitState::Mirrored => SrcUse::AsIs,
                    s => {
                        return Err(err(format!(
                        "q is split by rows, so every part needs all of source {i}, which is {s}"
                    )))
                    }
                });
            }
            if has_mask {
                uses.push(mask_use(&x, true)?);
            }
            whole_sinks(&mut uses)?;
            Ok(Rule::Done(SplitState::Split(x.on_axis(2)), uses))
        }
        3 => {
            let x = first.clone();
            let mut uses = vec![
                fit_or(0, &x, false)?,
                fit_or(1, &x, false)?,
                fit_or(2, &x, false)?,
            ];
            if has_mask {
                uses.push(mask_use(&x, false)?);
            }
            whole_sinks(&mut uses)?;
            Ok(Rule::Done(SplitState::Split(x), uses))
        }
        _ => Err(err(
            "attention needs whole head rows and every key: split by heads, query rows or batch"
                .into(),
        )),
    }
}

/// The KV heads (`(first, count)`) each part's attention reads when its query heads are the
/// slices of `xq` and every part holds all KV heads, `group` query heads to a KV head. A
/// backend maps a part's local query head `i` to local KV head `i / (local query heads / local
/// KV heads)`, so a part needs whole groups starting at a group boundary (their KV heads, in
/// order) or query heads all within one group (that group's KV head alone).
fn shared_kv_heads(
    xq: &AxisSplit,
    group: usize,
) -> std::result::Result<Vec<(usize, usize)>, String> {
    (0..xq.parts())
        .map(|j| {
            let first = xq
                .single_range(j)
                .ok_or_else(|| format!("{xq} of the query heads is not one stretch per part"))?;
            let len = xq.part_len(j);
            if len == 0 {
                Ok((0, 0))
            } else if first.is_multiple_of(group) && len.is_multiple_of(group) {
                Ok((first / group, len / group))
            } else if first / group == (first + len - 1) / group {
                Ok((first / group, 1))
            } else {
                Err(format!(
                    "part {j}'s query heads {first}..{} cut across the groups of two KV heads \
                     (groups of {group})",
                    first + len
                ))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::DType;

    #[test]
    fn reshape_maps_split_heads_both_ways() {
        // [576, n] split by heads of 64 -> [64, 9, n]: split along axis 1 by heads.
        let x = AxisSplit::new(0, vec![384, 192]);
        let y = reshape_split([576, 5, 1, 1], &x, [64, 9, 5, 1]).unwrap();
        assert_eq!(y, AxisSplit::new(1, vec![6, 3]));
        // And back.
        assert_eq!(reshape_split([64, 9, 5, 1], &y, [576, 5, 1, 1]).unwrap(), x);
        // A split of the inner axis cannot merge with the outer one.
        assert!(
            reshape_split([6, 4, 1, 1], &AxisSplit::new(0, vec![4, 2]), [2, 12, 1, 1]).is_none()
        );
        // Cutting inside a head is refused.
        assert!(reshape_split(
            [576, 5, 1, 1],
            &AxisSplit::new(0, vec![400, 176]),
            [64, 9, 5, 1]
        )
        .is_none());
    }

    #[test]
    fn query_heads_read_the_kv_heads_of_their_groups() {
        // 9 query heads in groups of 3: whole groups read their KV heads, heads within one
        // group read that group's KV head alone, an empty part reads none.
        let xq = AxisSplit::new(2, vec![3, 3, 2, 1, 0]);
        assert_eq!(
            shared_kv_heads(&xq, 3).unwrap(),
            vec![(0, 1), (1, 1), (2, 1), (2, 1), (0, 0)]
        );
        assert_eq!(
            shared_kv_heads(&AxisSplit::new(2, vec![6, 3]), 3).unwrap(),
            vec![(0, 2), (2, 1)]
        );
        // One KV head: every part reads it.
        assert_eq!(
            shared_kv_heads(&AxisSplit::new(2, vec![3, 1]), 4).unwrap(),
            vec![(0, 1), (0, 1)]
        );
        // Heads 3..5 straddle groups 1 and 2 (groups of 3 heads).
        assert!(shared_kv_heads(&AxisSplit::new(2, vec![3, 2, 4]), 3).is_err());
    }

    #[test]
    fn a_kv_cache_view_maps_onto_kv_heads() {
        let mut g = Graph::new();
        let (hd, nkv, ctx) = (64, 3, 16);
        let kc = g.new_tensor(DType::F16, &[hd * nkv, ctx]).unwrap();
        let v = g
            .view(kc, &[hd, nkv, 8], &[hd * 2, hd * nkv * 2], 0)
            .unwrap();
        let x = AxisSplit::new(0, vec![128, 64]);
        let s = decompose(g.get(kc), g.get(v), &x).unwrap();
        assert_eq!(s.split, AxisSplit::new(1, vec![2, 1]));
        // Part 1 holds one head: [64, 16] packed.
        let part_nb = Tensor::contiguous_strides(DType::F16, [64, ctx, 1, 1]);
        let (ne, nb, off) = s.part_layout(g.get(v), part_nb, 1);
        assert_eq!(ne, [64, 1, 8, 1]);
        assert_eq!(nb[0], 2);
        assert_eq!(nb[2], 128);
        assert_eq!(off, 0);
        // A view of one head is refused: it covers part of a slice.
        let h = g.view(kc, &[hd, 8], &[hd * nkv * 2], hd * 2).unwrap();
        assert!(decompose(g.get(kc), g.get(h), &x).is_err());
    }

    #[test]
    fn a_row_view_of_a_column_split_keeps_its_offset() {
        let mut g = Graph::new();
        let a = g.new_tensor(DType::F32, &[8, 6]).unwrap();
        let v = g.view(a, &[8, 4], &[32], 2 * 32).unwrap();
        let x = AxisSplit::new(0, vec![5, 3]);
        let s = decompose(g.get(a), g.get(v), &x).unwrap();
        assert_eq!(s.split, AxisSplit::new(0, vec![5, 3]));
        let part_nb = Tensor::contiguous_strides(DType::F32, [3, 6, 1, 1]);
        let (ne, nb, off) = s.part_layout(g.get(v), part_nb, 1);
        assert_eq!(ne, [3, 4, 1, 1]);
        assert_eq!(nb[1], 12);
        assert_eq!(off, 24);
    }

    #[test]
    fn a_rope_with_frequency_factors_follows_its_heads_and_reads_the_factors_whole() {
        use tessera_core::{RopeMode, RopeParams};
        let mut g = Graph::new();
        let (hd, heads, tokens) = (64, 6, 5);
        let x = g.new_tensor(DType::F32, &[hd, heads, tokens]).unwrap();
        let pos = g.new_tensor(DType::I32, &[tokens]).unwrap();
        let f = g.new_tensor(DType::F32, &[hd / 2]).unwrap();
        let p = RopeParams::new(hd, RopeMode::Normal, 10000.0, 1.0);
        let r = g.rope_ext(x, pos, Some(f), p).unwrap();
        let by_heads = AxisSplit::new(1, vec![4, 2]);
        let split = SplitState::Split(by_heads.clone());
        let eff = [split.clone(), SplitState::Mirrored, SplitState::Mirrored];
        assert_eq!(
            node_rule(&g, r, &eff).unwrap(),
            Rule::Done(split, vec![SrcUse::AsIs; 3])
        );
        // Factors split like the heads would rotate each part with half of them: refused.
        let halves = SplitState::Split(AxisSplit::new(0, vec![16, 16]));
        let eff = [eff[0].clone(), SplitState::Mirrored, halves];
        assert!(node_rule(&g, r, &eff).is_err());
    }
}
