//! Planning a graph for a meta device: deriving every tensor's split state, then building one
//! graph per part with sliced shapes, cut into stages at the all-reduces, and the transfers
//! that move graph inputs in and results out.
//!
//! The steps, for graph `g` and the nodes to compute:
//!
//! 1. **Inputs.** Every tensor the nodes read that they do not compute (leaves, and results of
//!    earlier runs) is an input. One bound in a sharded meta buffer has the state it was
//!    registered with and each part reads its slice in place. Any other is *staged*: read from
//!    its buffer before each run and uploaded, sliced, to every part; its state comes from the
//!    device's [`InputPolicy`].
//! 2. **States.** Walking the nodes in order, views get theirs from their source
//!    ([`crate::rules::view_rule`]) and computed nodes from the per-op rules
//!    ([`crate::rules::node_rule`]). When a node needs a partial source summed, that source's
//!    memory is all-reduced just before the node, and from there on it reads as mirrored. A
//!    node no rule covers stops planning with an error naming it.
//! 3. **Part graphs.** Each part gets a graph with the same nodes at their sliced shapes:
//!    sharded inputs bound to the part's slices, staged inputs as fresh inputs, views laid out
//!    on the part's slices, narrowing views where a mirrored source is read as a slice, and a
//!    zero fill instead of a partial node whose slice of the reduced axis is empty.
//! 4. **Stages.** The node list is cut before each node that needs an all-reduce; the
//!    all-reduces run between the stages. Where the parts' backends joined a communicator
//!    group that sums inside their graphs ([`tessera_core::Communicator::attach`]), small f32
//!    all-reduces are instead [`Op::AllReduce`] nodes in each part's graph, and no cut is made.
//! 5. **Outputs.** Results the caller can see (outputs, the last node, tensors read outside the
//!    computed nodes, staged inputs written in place) are gathered into their own memory after
//!    the run: slices joined, partial sums added, mirrored ones read from part 0.
//! 6. **Memory.** Each part's graph is allocated by that part's graph allocator, so compute
//!    memory on a part is sized to its slices.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::Buffer;
use tessera_core::dtype::DType;
use tessera_core::error::{Error, Result};
use tessera_core::graph::Graph;
use tessera_core::op::Op;
use tessera_core::tensor::{Tensor, TensorFlags, TensorId, MAX_DIMS};

use crate::buffer::MetaBuffer;
use crate::rules::{node_rule, view_rule, Rule, SrcUse, ViewMap};
use crate::split::{part_shape, partition_units, AxisSplit, SplitState};

/// How the states of staged inputs (graph inputs not in a sharded buffer) are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InputPolicy {
    /// Every staged input is mirrored: each part gets all of it (model inputs: tokens,
    /// positions, masks). Work is split by the weights' and caches' states.
    #[default]
    Mirrored,
    /// Try split states for the staged inputs and keep the assignment that splits the most
    /// nodes (the conformance suite: op graphs whose only tensors are staged inputs). A graph
    /// that cannot be split at all is refused as unsupported.
    MostSplit,
}

/// What one part does in a stage.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// Compute these nodes of the part graph.
    Compute(Vec<TensorId>),
    /// Fill this tensor with zeros (a partial result the part has no share of).
    Zero(TensorId),
}

/// One part's graph and its work per stage.
pub(crate) struct PartPlan {
    pub graph: Graph,
    pub stages: Vec<Vec<Action>>,
}

/// A tensor moved between the caller's memory and the parts.
pub(crate) struct Transfer {
    /// The tensor in the caller's graph.
    pub tensor: TensorId,
    /// Its state.
    pub state: SplitState,
    /// Its tensor in each part's graph (None where the part holds no bytes of it).
    pub part: Vec<Option<TensorId>>,
}

/// A partial tensor to all-reduce: its tensor in each part's graph.
pub(crate) struct ReduceItem {
    pub part: Vec<TensorId>,
    pub count: usize,
    /// The values move and add as bf16 (cast from f32 before, back after).
    pub bf16: bool,
}

/// A planned graph.
pub(crate) struct Plan {
    pub parts: Vec<PartPlan>,
    pub uploads: Vec<Transfer>,
    /// All-reduces after each stage but the last.
    pub reduces: Vec<Vec<ReduceItem>>,
    pub gathers: Vec<Transfer>,
}

/// Where an input's bytes are.
#[derive(Clone)]
enum Source {
    /// Part `j` reads its slice at `slices[j]`.
    Sharded(Vec<(Arc<dyn Buffer>, usize)>),
    /// Uploaded before each run.
    Staged,
}

/// The derived states of a graph.
pub(crate) struct Derived {
    states: Vec<Option<SplitState>>,
    views: Vec<Option<ViewMap>>,
    uses: Vec<Option<Vec<SrcUse>>>,
    reduce_before: Vec<Vec<TensorId>>,
    reduced: Vec<bool>,
}

impl Derived {
    fn state(&self, id: TensorId) -> Option<&SplitState> {
        self.states.get(id.index()).and_then(Option::as_ref)
    }

    /// The state a reader sees after the whole graph (a reduced partial reads as mirrored).
    fn final_state(&self, g: &Graph, id: TensorId) -> SplitState {
        match self.state(id) {
            Some(SplitState::Partial) if self.reduced[g.root(id).0.index()] => SplitState::Mirrored,
            Some(s) => s.clone(),
            None => SplitState::Mirrored,
        }
    }

    /// Computed nodes (not mirrored) and whether anything is partial, for the input search.
    fn score(&self, g: &Graph, nodes: &[TensorId]) -> usize {
        let mut split = 0;
        let mut partial = false;
        for &id in nodes {
            let t = g.get(id);
            if t.op == Op::None || t.op.is_view() {
                continue;
            }
            match self.state(id) {
                Some(SplitState::Mirrored) | None => {}
                Some(SplitState::Partial) => {
                    split += 1;
                    partial = true;
                }
                Some(SplitState::Split(_)) => split += 1,
            }
        }
        2 * split + partial as usize
    }
}

struct Deriver<'a> {
    g: &'a Graph,
    inputs: &'a HashMap<TensorId, SplitState>,
    d: Derived,
}

impl Deriver<'_> {
    fn state_of(&mut self, id: TensorId) -> Result<SplitState> {
        if let Some(s) = self.d.state(id) {
            return Ok(s.clone());
        }
        let t = self.g.get(id);
        let s = if t.op.is_view() {
            let src = *t
                .src
                .first()
                .ok_or_else(|| split_err(self.g, id, "a view without a source"))?;
            let ss = self.state_of(src)?;
            let (root, _) = self.g.root(id);
            let rs = self.state_of(root)?;
            let (s, map) = view_rule(self.g, id, &ss, &rs)?;
            self.d.views[id.index()] = Some(map);
            s
        } else if let Some(s) = self.inputs.get(&id) {
            s.clone()
        } else {
            return Err(split_err(self.g, id, "it is read before it is computed"));
        };
        self.d.states[id.index()] = Some(s.clone());
        Ok(s)
    }

    fn effective(&mut self, id: TensorId) -> Result<SplitState> {
        let s = self.state_of(id)?;
        if s == SplitState::Partial && self.d.reduced[self.g.root(id).0.index()] {
            return Ok(SplitState::Mirrored);
        }
        Ok(s)
    }

    fn node(&mut self, id: TensorId) -> Result<()> {
        let g = self.g;
        let t = g.get(id);
        if t.op == Op::None || t.op.is_view() {
            self.state_of(id)?;
            return Ok(());
        }
        let srcs = t.src.clone();
        let mut reduced_here = Vec::new();
        loop {
            let eff = srcs
                .iter()
                .map(|&s| self.effective(s))
                .collect::<Result<Vec<_>>>()?;
            match node_rule(g, id, &eff)? {
                Rule::Done(state, uses) => {
                    self.d.states[id.index()] = Some(state);
                    self.d.uses[id.index()] = Some(uses);
                    self.d.reduce_before[id.index()] = reduced_here;
                    return Ok(());
                }
                Rule::Reduce(idx) => {
                    let mut progress = false;
                    for i in idx {
                        let root = g.root(srcs[i]).0;
                        if self.d.reduced[root.index()] {
                            continue;
                        }
                        if self.inputs.contains_key(&root)
                            || self.d.state(root) != Some(&SplitState::Partial)
                        {
                            return Err(split_err(
                                g,
                                id,
                                &format!(
                                    "its source '{}' is partial but cannot be summed",
                                    g.label(root)
                                ),
                            ));
                        }
                        if g.get(root).dtype != DType::F32 {
                            return Err(split_err(
                                g,
                                root,
                                "a partial result must be f32 to be summed across parts",
                            ));
                        }
                        self.d.reduced[root.index()] = true;
                        reduced_here.push(root);
                        progress = true;
                    }
                    if !progress {
                        return Err(split_err(g, id, "its partial sources cannot be summed"));
                    }
                }
            }
        }
    }
}

fn split_err(g: &Graph, id: TensorId, reason: &str) -> Error {
    Error::Split {
        tensor: g.label(id),
        op: g.get(id).op.name(),
        reason: reason.to_string(),
    }
}

/// Derives every state for the given input states.
fn derive(
    g: &Graph,
    nodes: &[TensorId],
    inputs: &HashMap<TensorId, SplitState>,
    parts: usize,
) -> Result<Derived> {
    let n = g.len();
    let mut dv = Deriver {
        g,
        inputs,
        d: Derived {
            states: vec![None; n],
            views: vec![None; n],
            uses: vec![None; n],
            reduce_before: vec![Vec::new(); n],
            reduced: vec![false; n],
        },
    };
    for &id in nodes {
        dv.node(id)?;
    }
    for (i, s) in dv.d.states.iter().enumerate() {
        if let Some(s) = s {
            let id = TensorId(i as u32);
            let t = g.get(id);
            s.check_fits(t.dtype, t.ne, parts)
                .map_err(|r| split_err(g, id, &r))?;
        }
    }
    Ok(dv.d)
}

/// Which tensors the nodes compute, which they only read (inputs), and which of their results
/// tensors outside them read.
struct Shape {
    in_nodes: Vec<bool>,
    inputs: Vec<TensorId>,
    read_outside: Vec<bool>,
}

fn shape(g: &Graph, nodes: &[TensorId]) -> Result<Shape> {
    let n = g.len();
    let mut in_nodes = vec![false; n];
    for &id in nodes {
        if id.index() >= n {
            return Err(Error::Invalid(format!(
                "node #{} is not in the graph",
                id.0
            )));
        }
        let op = &g.get(id).op;
        if *op != Op::None && !op.is_view() {
            in_nodes[id.index()] = true;
        }
    }
    let mut seen = vec![false; n];
    let mut inputs = Vec::new();
    let mut stack: Vec<TensorId> = nodes.to_vec();
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut seen[id.index()], true) {
            continue;
        }
        let t = g.get(id);
        if t.op.is_view() || in_nodes[id.index()] {
            stack.extend(t.src.iter().copied());
            stack.push(g.root(id).0);
        } else {
            inputs.push(id);
        }
    }
    inputs.sort();
    let mut read_outside = vec![false; n];
    for id in g.ids() {
        let t = g.get(id);
        if t.op == Op::None || t.op.is_view() || in_nodes[id.index()] {
            continue;
        }
        for &s in &t.src {
            read_outside[g.root(s).0.index()] = true;
        }
    }
    Ok(Shape {
        in_nodes,
        inputs,
        read_outside,
    })
}

/// Where each input's bytes are, and the state of the sharded ones.
fn sources(
    g: &Graph,
    inputs: &[TensorId],
    parts: usize,
) -> Result<HashMap<TensorId, (Source, Option<SplitState>)>> {
    let mut out = HashMap::new();
    for &id in inputs {
        let t = g.get(id);
        let data = g
            .data(id)
            .ok_or_else(|| split_err(g, id, "an input has no memory bound"))?;
        let meta = data.buffer.as_any().downcast_ref::<MetaBuffer>();
        let entry = match meta.filter(|m| m.is_sharded()) {
            Some(m) => {
                let (reg, slices) = m.registered(data.offset).ok_or_else(|| {
                    split_err(
                        g,
                        id,
                        &format!(
                            "it is bound at byte {} of {}, where no tensor is registered",
                            data.offset,
                            m.name()
                        ),
                    )
                })?;
                if reg.dtype != t.dtype || reg.ne != t.ne || !t.is_contiguous() {
                    return Err(split_err(
                        g,
                        id,
                        &format!(
                            "it is {} {:?} but the bytes are registered as {} {:?}",
                            t.dtype, t.ne, reg.dtype, reg.ne
                        ),
                    ));
                }
                if slices.len() != parts {
                    return Err(split_err(
                        g,
                        id,
                        "its sharded buffer belongs to a meta device of another size",
                    ));
                }
                (Source::Sharded(slices), Some(reg.state.clone()))
            }
            None => (Source::Staged, None),
        };
        out.insert(id, entry);
    }
    Ok(out)
}

/// Candidate states of a staged input for the search: a split along each axis that has room,
/// highest axis first, then mirrored.
fn candidates(t: &Tensor, ratios: &[f64]) -> Vec<SplitState> {
    let mut out = Vec::new();
    for a in (0..MAX_DIMS).rev() {
        let unit = if a == 0 { t.dtype.block_size() } else { 1 };
        if t.ne[a] / unit < 2 {
            continue;
        }
        if let Ok(c) = partition_units(t.ne[a], unit, ratios, "input") {
            out.push(SplitState::Split(AxisSplit::new(a, c)));
        }
    }
    out.push(SplitState::Mirrored);
    out
}

/// The most assignments the input search tries.
const SEARCH_LIMIT: usize = 2048;

/// Derives states, choosing staged inputs' states by `policy`.
fn derive_with_policy(
    g: &Graph,
    nodes: &[TensorId],
    srcs: &HashMap<TensorId, (Source, Option<SplitState>)>,
    policy: InputPolicy,
    ratios: &[f64],
    device: &str,
) -> Result<(Derived, HashMap<TensorId, SplitState>)> {
    let mut fixed = HashMap::new();
    let mut staged = Vec::new();
    for (&id, (_, s)) in srcs {
        match s {
            Some(s) => {
                fixed.insert(id, s.clone());
            }
            None => staged.push(id),
        }
    }
    staged.sort();
    if policy == InputPolicy::Mirrored || staged.is_empty() {
        for &id in &staged {
            fixed.insert(id, SplitState::Mirrored);
        }
        let d = derive(g, nodes, &fixed, ratios.len())?;
        return Ok((d, fixed));
    }
    let cands: Vec<Vec<SplitState>> = staged
        .iter()
        .map(|&id| candidates(g.get(id), ratios))
        .collect();
    let mut pick = vec![0usize; staged.len()];
    let mut best: Option<(usize, Derived, HashMap<TensorId, SplitState>)> = None;
    let mut first_err: Option<Error> = None;
    for _ in 0..SEARCH_LIMIT {
        let mut states = fixed.clone();
        for (k, &id) in staged.iter().enumerate() {
            states.insert(id, cands[k][pick[k]].clone());
        }
        match derive(g, nodes, &states, ratios.len()) {
            Ok(d) => {
                let score = d.score(g, nodes);
                if best.as_ref().is_none_or(|b| score > b.0) {
                    best = Some((score, d, states));
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        // Next assignment (the last input varies fastest).
        let mut wrapped = true;
        for k in (0..staged.len()).rev() {
            pick[k] += 1;
            if pick[k] < cands[k].len() {
                wrapped = false;
                break;
            }
            pick[k] = 0;
        }
        if wrapped {
            break;
        }
    }
    match best {
        Some((score, d, states)) if score > 0 => Ok((d, states)),
        _ => {
            let why = first_err
                .map(|e| e.to_string())
                .unwrap_or_else(|| "no input can be split".into());
            Err(Error::Unsupported {
                backend: device.to_string(),
                what: format!("a split of this graph: {why}"),
            })
        }
    }
}

/// Checks that the nodes of `g` can be split over `parts` parts: every state derives.
pub(crate) fn check(
    g: &Graph,
    nodes: &[TensorId],
    parts: usize,
    policy: InputPolicy,
    ratios: &[f64],
    device: &str,
) -> Result<()> {
    let sh = shape(g, nodes)?;
    let srcs = sources(g, &sh.inputs, parts)?;
    derive_with_policy(g, nodes, &srcs, policy, ratios, device).map(|_| ())
}

/// Builds one part's graph.
struct PartBuilder<'a> {
    g: &'a Graph,
    d: &'a Derived,
    srcs: &'a HashMap<TensorId, (Source, Option<SplitState>)>,
    inputs: &'a HashMap<TensorId, SplitState>,
    j: usize,
    pg: Graph,
    map: Vec<Option<TensorId>>,
    /// Views narrowing a mirrored source, by (source, axis, start, length).
    narrowed: HashMap<(TensorId, usize, usize, usize), TensorId>,
}

impl PartBuilder<'_> {
    fn state(&self, id: TensorId) -> SplitState {
        self.d
            .state(id)
            .cloned()
            .or_else(|| self.inputs.get(&id).cloned())
            .unwrap_or(SplitState::Mirrored)
    }

    fn push(&mut self, t: Tensor) -> TensorId {
        self.pg.push_raw(t)
    }

    fn part(&mut self, id: TensorId) -> Result<TensorId> {
        if let Some(p) = self.map[id.index()] {
            return Ok(p);
        }
        let g = self.g;
        let t = g.get(id);
        let state = self.state(id);
        let p = if let Some((src, _)) = self.srcs.get(&id) {
            let ne = part_shape(t.ne, &state, self.j);
            let leaf = self.push(Tensor {
                dtype: t.dtype,
                ne,
                nb: Tensor::contiguous_strides(t.dtype, ne),
                op: Op::None,
                src: vec![],
                view_src: None,
                view_offset: 0,
                name: t.name.clone(),
                flags: TensorFlags {
                    input: matches!(src, Source::Staged),
                    output: false,
                    weight: t.flags.weight,
                },
                data: None,
            });
            if let Source::Sharded(slices) = src {
                let (buf, off) = slices[self.j].clone();
                self.pg.bind(leaf, buf, off)?;
            }
            leaf
        } else if t.op.is_view() {
            self.view(id, &state)?
        } else {
            self.computed(id, &state)?
        };
        self.map[id.index()] = Some(p);
        Ok(p)
    }

    /// For partial f32 root `p`: a bf16 copy of it (`to`, what is all-reduced) and the copy
    /// back into `p` after the all-reduce (`back`).
    fn bf16_pair(&mut self, p: TensorId) -> (TensorId, TensorId) {
        let t = self.pg.get(p).clone();
        let nb = Tensor::contiguous_strides(DType::BF16, t.ne);
        let node = |dtype, nb, op, src, view_src, name: String| Tensor {
            dtype,
            ne: t.ne,
            nb,
            op,
            src,
            view_src,
            view_offset: 0,
            name,
            flags: TensorFlags::default(),
            data: None,
        };
        let leaf = self.push(node(
            DType::BF16,
            nb,
            Op::None,
            vec![],
            None,
            format!("{}#bf16", t.name),
        ));
        let to = self.push(node(
            DType::BF16,
            nb,
            Op::Cpy,
            vec![p, leaf],
            Some(leaf),
            format!("{}#to_bf16", t.name),
        ));
        let back = self.push(node(
            t.dtype,
            t.nb,
            Op::Cpy,
            vec![to, p],
            Some(p),
            format!("{}#summed", t.name),
        ));
        (to, back)
    }

    /// For partial f32 root `p`: the node that all-reduces it in place inside the part's graph.
    fn all_reduce_node(&mut self, p: TensorId) -> TensorId {
        let t = self.pg.get(p).clone();
        self.push(Tensor {
            dtype: t.dtype,
            ne: t.ne,
            nb: t.nb,
            op: Op::AllReduce,
            src: vec![p],
            view_src: Some(p),
            view_offset: 0,
            name: format!("{}#all_reduce", t.name),
            flags: TensorFlags::default(),
            data: None,
        })
    }

    /// The part tensor's root and its byte offset in it.
    fn root_of(&self, p: TensorId) -> (TensorId, usize) {
        self.pg.root(p)
    }

    fn view(&mut self, id: TensorId, state: &SplitState) -> Result<TensorId> {
        let g = self.g;
        let t = g.get(id);
        let src = t.src[0];
        let ps = self.part(src)?;
        let (root, _) = g.root(id);
        let pr = self.part(root)?;
        let (pr_root, pr_off) = self.root_of(pr);
        let map = self.d.views[id.index()].clone().unwrap_or(ViewMap::Same);
        let (ne, nb, offset) = match &map {
            ViewMap::Same => (t.ne, t.nb, pr_off + t.view_offset),
            ViewMap::Permute(axes) => {
                let st = self.pg.get(ps);
                let mut ne = [0; MAX_DIMS];
                let mut nb = [0; MAX_DIMS];
                for i in 0..MAX_DIMS {
                    ne[axes[i]] = st.ne[i];
                    nb[axes[i]] = st.nb[i];
                }
                (ne, nb, self.root_of(ps).1)
            }
            ViewMap::Reshape => {
                let st = self.pg.get(ps);
                if !st.is_contiguous() {
                    return Err(split_err(
                        g,
                        id,
                        &format!("part {}'s slice of its source is not contiguous", self.j),
                    ));
                }
                let ne = part_shape(t.ne, state, self.j);
                (
                    ne,
                    Tensor::contiguous_strides(t.dtype, ne),
                    self.root_of(ps).1,
                )
            }
            ViewMap::Strided(s) => {
                let (ne, nb, off) = s.part_layout(t, self.pg.get(pr_root).nb, self.j);
                (ne, nb, pr_off + off)
            }
        };
        Ok(self.push(Tensor {
            dtype: t.dtype,
            ne,
            nb,
            op: t.op.clone(),
            src: vec![ps],
            view_src: Some(pr_root),
            view_offset: offset,
            name: t.name.clone(),
            flags: TensorFlags::default(),
            data: None,
        }))
    }

    /// A view of a mirrored source's whole copy on this part selecting part `j`'s slice of
    /// split `x`.
    fn narrow(&mut self, src: TensorId, x: &AxisSplit) -> Result<TensorId> {
        let start = x.single_range(self.j).ok_or_else(|| {
            split_err(
                self.g,
                src,
                "a mirrored source narrowed by a split in segments",
            )
        })?;
        self.narrow_to(src, x.axis, start, x.part_len(self.j))
    }

    /// A view of a mirrored source's whole copy on this part selecting elements
    /// `start..start + len` along `axis`.
    fn narrow_to(&mut self, src: TensorId, a: usize, start: usize, len: usize) -> Result<TensorId> {
        let key = (src, a, start, len);
        if let Some(&v) = self.narrowed.get(&key) {
            return Ok(v);
        }
        let p = self.part(src)?;
        let (root, base) = self.root_of(p);
        let st = self.pg.get(p).clone();
        let per = if a == 0 { st.dtype.block_size() } else { 1 };
        let mut ne = st.ne;
        ne[a] = len;
        let v = self.push(Tensor {
            dtype: st.dtype,
            ne,
            nb: st.nb,
            op: Op::View,
            src: vec![p],
            view_src: Some(root),
            view_offset: base + start / per * st.nb[a],
            name: format!("{}#slice", st.name),
            flags: TensorFlags::default(),
            data: None,
        });
        self.narrowed.insert(key, v);
        Ok(v)
    }

    fn computed(&mut self, id: TensorId, state: &SplitState) -> Result<TensorId> {
        let g = self.g;
        let t = g.get(id);
        let uses = self.d.uses[id.index()]
            .clone()
            .unwrap_or_else(|| vec![SrcUse::AsIs; t.src.len()]);
        let mut src = Vec::with_capacity(t.src.len());
        for (i, &s) in t.src.iter().enumerate() {
            src.push(match uses.get(i) {
                Some(SrcUse::Narrow(x)) => self.narrow(s, x)?,
                Some(SrcUse::Stretch { axis, ranges }) => {
                    let (start, len) = ranges.get(self.j).copied().ok_or_else(|| {
                        split_err(
                            g,
                            id,
                            &format!("no stretch of source {i} for part {}", self.j),
                        )
                    })?;
                    self.narrow_to(s, *axis, start, len)?
                }
                _ => self.part(s)?,
            });
        }
        let ne = part_shape(t.ne, state, self.j);
        let (nb, view_src, view_offset) = if t.view_src.is_some() {
            // Written in place into its destination: the result is laid out as the part's
            // destination is.
            let dest = match t.op {
                Op::Cpy => src.get(1),
                _ => src.first(),
            }
            .copied()
            .ok_or_else(|| split_err(g, id, "an in-place result without a destination"))?;
            let dt = self.pg.get(dest);
            if dt.ne != ne {
                return Err(split_err(
                    g,
                    id,
                    &format!(
                        "part {} destination {:?} differs from the result {:?}",
                        self.j, dt.ne, ne
                    ),
                ));
            }
            let (r, off) = self.root_of(dest);
            (dt.nb, Some(r), off)
        } else {
            (Tensor::contiguous_strides(t.dtype, ne), None, 0)
        };
        let op = crate::experts::part_op(t, t.src.first().and_then(|&s| self.d.state(s)), self.j);
        Ok(self.push(Tensor {
            dtype: t.dtype,
            ne,
            nb,
            op,
            src,
            view_src,
            view_offset,
            name: t.name.clone(),
            flags: TensorFlags::default(),
            data: None,
        }))
    }
}

/// Appends node `p` to the stage's last compute action (or starts one).
fn push_compute(stage: &mut Vec<Action>, p: TensorId) {
    match stage.last_mut() {
        Some(Action::Compute(list)) => list.push(p),
        _ => stage.push(Action::Compute(vec![p])),
    }
}

/// How a plan sums its partial results.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReducePlan {
    /// Partial results of at least this many bytes move as bf16.
    pub bf16_above: Option<usize>,
    /// Partial f32 results of at most this many elements are summed by an
    /// [`Op::AllReduce`] node inside each part's graph (the parts' backends joined a
    /// communicator group); 0: every all-reduce runs between stages.
    pub in_graph_max: usize,
}

/// Plans `nodes` of `g` over the parts (`allocators[j]` gives part `j`'s compute memory).
pub(crate) fn build(
    g: &Graph,
    nodes: &[TensorId],
    allocators: &mut [GraphAllocator],
    policy: InputPolicy,
    ratios: &[f64],
    reduce: ReducePlan,
    device: &str,
) -> Result<Plan> {
    let bf16 = |r: TensorId| {
        reduce
            .bf16_above
            .is_some_and(|min| g.get(r).nbytes() >= min)
    };

    let n_parts = allocators.len();
    let sh = shape(g, nodes)?;
    let srcs = sources(g, &sh.inputs, n_parts)?;
    let (d, inputs) = derive_with_policy(g, nodes, &srcs, policy, ratios, device)?;
    // A single part holds whole sums already: its partial results need no all-reduce, so its
    // graph is neither cut into stages nor given all-reduce nodes.
    let single = n_parts == 1;
    // Whether the all-reduces before node `id` run inside the part graphs.
    let in_graph = |id: TensorId| {
        let before = &d.reduce_before[id.index()];
        !before.is_empty()
            && !single
            && before.iter().all(|&r| {
                let t = g.get(r);
                !bf16(r) && t.dtype == DType::F32 && t.nelements() <= reduce.in_graph_max
            })
    };

    // The caller-visible results gathered after the run.
    let computed: Vec<TensorId> = nodes
        .iter()
        .copied()
        .filter(|&id| sh.in_nodes[id.index()])
        .collect();
    let mut visible: Vec<TensorId> = Vec::new();
    for &id in &computed {
        let root = g.root(id).0;
        let written_input = root != id && matches!(srcs.get(&root), Some((Source::Staged, _)));
        let own_root = root == id && (g.get(id).flags.output || sh.read_outside[id.index()]);
        if written_input || own_root {
            visible.push(root);
        }
    }
    if let Some(&last) = computed.last() {
        let root = g.root(last).0;
        if !matches!(srcs.get(&root), Some((Source::Sharded(_), _))) {
            visible.push(root);
        }
    }
    visible.sort();
    visible.dedup();

    let mut parts = Vec::with_capacity(n_parts);
    let mut part_maps = Vec::with_capacity(n_parts);
    let mut bf16_maps: Vec<HashMap<TensorId, TensorId>> = Vec::with_capacity(n_parts);
    for (j, alloc) in allocators.iter_mut().enumerate() {
        let mut b = PartBuilder {
            g,
            d: &d,
            srcs: &srcs,
            inputs: &inputs,
            j,
            pg: Graph::new(),
            map: vec![None; g.len()],
            narrowed: HashMap::new(),
        };
        let mut stages: Vec<Vec<Action>> = vec![Vec::new()];
        let mut order: Vec<TensorId> = Vec::new();
        let mut bf16_of: HashMap<TensorId, TensorId> = HashMap::new();
        for &id in &computed {
            let before = &d.reduce_before[id.index()];
            if in_graph(id) {
                for &r in before {
                    let pr = b.part(r)?;
                    let ar = b.all_reduce_node(pr);
                    push_compute(stages.last_mut().expect("never empty"), ar);
                    order.push(ar);
                }
            } else if !before.is_empty() && !single {
                let mut backs = Vec::new();
                for &r in before.iter().filter(|&&r| bf16(r)) {
                    let pr = b.part(r)?;
                    let (to, back) = b.bf16_pair(pr);
                    push_compute(stages.last_mut().expect("never empty"), to);
                    order.push(to);
                    bf16_of.insert(r, to);
                    backs.push(back);
                }
                stages.push(Vec::new());
                for back in backs {
                    push_compute(stages.last_mut().expect("pushed above"), back);
                    order.push(back);
                }
            }
            let p = b.part(id)?;
            order.push(p);
            let pt = b.pg.get(p);
            if pt.nelements() == 0 {
                continue;
            }
            let empty_src = pt.src.iter().any(|&s| b.pg.get(s).nelements() == 0);
            let action = if empty_src {
                if d.state(id) != Some(&SplitState::Partial) {
                    return Err(split_err(
                        g,
                        id,
                        &format!("part {j} would compute it from an empty slice"),
                    ));
                }
                Action::Zero(p)
            } else {
                Action::Compute(vec![p])
            };
            match action {
                Action::Compute(_) => push_compute(stages.last_mut().expect("never empty"), p),
                zero => stages.last_mut().expect("never empty").push(zero),
            }
        }
        for &r in &visible {
            let p = b.part(r)?;
            b.pg.get_mut(p).flags.output = true;
        }
        // Staged inputs first (they live throughout), then the nodes in order.
        let mut alloc_list: Vec<TensorId> = Vec::new();
        for (&id, (src, _)) in &srcs {
            if matches!(src, Source::Staged) {
                if let Some(p) = b.map[id.index()] {
                    alloc_list.push(p);
                }
            }
        }
        alloc_list.sort();
        alloc_list.extend(order);
        alloc.alloc(&mut b.pg, &alloc_list)?;
        part_maps.push(b.map);
        bf16_maps.push(bf16_of);
        parts.push(PartPlan {
            graph: b.pg,
            stages,
        });
    }

    let part_ids = |id: TensorId| -> Vec<Option<TensorId>> {
        (0..n_parts)
            .map(|j| part_maps[j][id.index()].filter(|&p| parts[j].graph.data(p).is_some()))
            .collect()
    };
    let mut uploads = Vec::new();
    let mut staged: Vec<TensorId> = srcs
        .iter()
        .filter(|(_, (s, _))| matches!(s, Source::Staged))
        .map(|(&id, _)| id)
        .collect();
    staged.sort();
    for id in staged {
        let state = inputs.get(&id).cloned().unwrap_or(SplitState::Mirrored);
        uploads.push(Transfer {
            tensor: id,
            state,
            part: part_ids(id),
        });
    }
    let mut reduces: Vec<Vec<ReduceItem>> = Vec::new();
    for &id in &computed {
        let before = &d.reduce_before[id.index()];
        if before.is_empty() || single || in_graph(id) {
            continue;
        }
        let mut items = Vec::new();
        for &r in before {
            let part: Vec<TensorId> = if bf16(r) {
                bf16_maps
                    .iter()
                    .filter_map(|m| m.get(&r).copied())
                    .collect()
            } else {
                part_ids(r).into_iter().flatten().collect()
            };
            if part.len() != n_parts {
                return Err(split_err(
                    g,
                    r,
                    "a partial result has no memory on some part",
                ));
            }
            items.push(ReduceItem {
                part,
                count: g.get(r).nelements(),
                bf16: bf16(r),
            });
        }
        reduces.push(items);
    }
    let mut gathers = Vec::new();
    for &r in &visible {
        if g.data(r).is_none() {
            return Err(split_err(g, r, "a result read back has no memory bound"));
        }
        gathers.push(Transfer {
            tensor: r,
            state: d.final_state(g, r),
            part: part_ids(r),
        });
    }
    Ok(Plan {
        parts,
        uploads,
        reduces,
        gathers,
    })
}
