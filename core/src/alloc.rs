//! The graph allocator: plans byte offsets for the tensors a graph computes, from their
//! lifetimes, so that memory is reused once a tensor's last reader has run; ops that may run
//! in place take over their first source's memory when nothing reads it afterwards.
//!
//! Backends must accept `dst == src0` for the ops [`runs_in_place`] names.

use std::sync::Arc;

use crate::backend::{Buffer, BufferType};
use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::TensorId;

/// Ops that may write their result over their first source.
pub fn runs_in_place(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Scale { .. }
            | Op::Clamp { .. }
            | Op::RmsNorm { .. }
            | Op::Norm { .. }
            | Op::SoftMax { .. }
            | Op::Rope(_)
    )
}

/// Offsets chosen for one graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// (root tensor, byte offset) for every tensor that needs memory.
    pub offsets: Vec<(TensorId, usize)>,
    /// Bytes the buffer must have.
    pub size: usize,
}

/// `x` rounded up to a multiple of `a`.
pub(crate) fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Free-list of byte ranges with best-fit allocation.
#[derive(Default)]
struct FreeList {
    blocks: Vec<(usize, usize)>, // (offset, size), sorted by offset
    end: usize,
}

impl FreeList {
    fn alloc(&mut self, size: usize) -> usize {
        let best = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.1 >= size)
            .min_by_key(|(_, b)| b.1)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let (off, sz) = self.blocks[i];
            if sz == size {
                self.blocks.remove(i);
            } else {
                self.blocks[i] = (off + size, sz - size);
            }
            return off;
        }
        // Grow, absorbing a free block at the end.
        if let Some(&(off, sz)) = self.blocks.last() {
            if off + sz == self.end {
                self.blocks.pop();
                self.end = off + size;
                return off;
            }
        }
        let off = self.end;
        self.end += size;
        off
    }

    fn free(&mut self, off: usize, size: usize) {
        let pos = self.blocks.partition_point(|b| b.0 < off);
        self.blocks.insert(pos, (off, size));
        // Merge neighbours.
        if pos + 1 < self.blocks.len()
            && self.blocks[pos].0 + self.blocks[pos].1 == self.blocks[pos + 1].0
        {
            self.blocks[pos].1 += self.blocks[pos + 1].1;
            self.blocks.remove(pos + 1);
        }
        if pos > 0 && self.blocks[pos - 1].0 + self.blocks[pos - 1].1 == self.blocks[pos].0 {
            self.blocks[pos - 1].1 += self.blocks[pos].1;
            self.blocks.remove(pos);
        }
    }
}

/// Whether a root tensor needs memory from the allocator: it has none bound and is either
/// computed or an input.
fn needs_memory(graph: &Graph, id: TensorId) -> bool {
    let t = graph.get(id);
    t.view_src.is_none() && t.data.is_none() && t.nbytes() > 0
}

/// Plans offsets for the tensors among `nodes` (and the roots they read) that have no memory.
pub fn plan(graph: &Graph, nodes: &[TensorId], alignment: usize) -> Plan {
    let alignment = alignment.max(1);
    let n = graph.len();
    let mut in_set = vec![false; n];
    for &id in nodes {
        in_set[id.index()] = true;
    }
    // last use of each root, by position in `nodes`
    let mut last_use: Vec<Option<usize>> = vec![None; n];
    let mut first_def: Vec<Option<usize>> = vec![None; n];
    for (pos, &id) in nodes.iter().enumerate() {
        let (root, _) = graph.root(id);
        first_def[root.index()].get_or_insert(pos);
        last_use[root.index()] = Some(pos);
        for &s in &graph.get(id).src {
            let (r, _) = graph.root(s);
            first_def[r.index()].get_or_insert(pos);
            last_use[r.index()] = Some(pos);
        }
    }
    // A root is pinned (never freed or reused) when it, or any view of it, is an input or an
    // output: a copy into a view marked as output must keep the root's memory.
    let mut pinned_root = vec![false; n];
    for id in graph.ids() {
        let f = graph.get(id).flags;
        if f.input || f.output {
            pinned_root[graph.root(id).0.index()] = true;
        }
    }
    let pinned = |id: TensorId| pinned_root[id.index()];

    let mut free = FreeList::default();
    let mut offset_of: Vec<Option<usize>> = vec![None; n];
    let mut size_of = vec![0usize; n];
    let mut offsets = Vec::new();

    // Inputs first: they are written before the run starts, so they live throughout.
    for (i, t) in (0..n).map(|i| (i, graph.get(TensorId(i as u32)))) {
        let id = TensorId(i as u32);
        if t.flags.input && first_def[i].is_some() && needs_memory(graph, id) {
            let sz = align_up(t.nbytes(), alignment);
            let off = free.alloc(sz);
            offset_of[i] = Some(off);
            size_of[i] = sz;
            offsets.push((id, off));
        }
    }

    for (pos, &id) in nodes.iter().enumerate() {
        let mut candidates = vec![];
        for &s in &graph.get(id).src {
            candidates.push(graph.root(s).0);
        }
        let (root, _) = graph.root(id);
        let i = root.index();
        if offset_of[i].is_none() && needs_memory(graph, root) {
            let t = graph.get(root);
            let sz = align_up(t.nbytes(), alignment);
            // In place: take over src0's block when this is its last reader.
            let mut reused = None;
            if root == id && runs_in_place(&t.op) && t.is_contiguous() {
                if let Some(&s0) = t.src.first() {
                    let (r0, off0) = graph.root(s0);
                    let st = graph.get(s0);
                    if off0 == 0
                        && r0 == s0
                        && offset_of[r0.index()].is_some()
                        && last_use[r0.index()] == Some(pos)
                        && !pinned(r0)
                        && graph.get(r0).data.is_none()
                        && size_of[r0.index()] == sz
                        && st.dtype == t.dtype
                        && st.is_contiguous()
                        && st.nbytes() == t.nbytes()
                    {
                        reused = offset_of[r0.index()];
                        // The block now belongs to the result.
                        size_of[r0.index()] = 0;
                    }
                }
            }
            let off = reused.unwrap_or_else(|| free.alloc(sz));
            offset_of[i] = Some(off);
            size_of[i] = sz;
            offsets.push((root, off));
        }
        // Free the sources whose last reader this was.
        candidates.push(root);
        candidates.sort();
        candidates.dedup();
        for r in candidates {
            let ri = r.index();
            if last_use[ri] == Some(pos) && !pinned(r) && size_of[ri] > 0 {
                if let Some(off) = offset_of[ri] {
                    // A result nothing reads is still freed: its value is not wanted.
                    free.free(off, size_of[ri]);
                    size_of[ri] = 0;
                }
            }
        }
    }
    Plan {
        offsets,
        size: free.end,
    }
}

/// Plans and allocates compute memory for graphs, keeping one buffer and growing it only when
/// a graph needs more.
pub struct GraphAllocator {
    buffer_type: Arc<dyn BufferType>,
    buffer: Option<Arc<dyn Buffer>>,
}

impl GraphAllocator {
    /// An allocator drawing from a buffer type.
    pub fn new(buffer_type: Arc<dyn BufferType>) -> Self {
        GraphAllocator {
            buffer_type,
            buffer: None,
        }
    }

    /// The buffer currently held, if any.
    pub fn buffer(&self) -> Option<&Arc<dyn Buffer>> {
        self.buffer.as_ref()
    }

    /// Binds memory to every tensor among `nodes` that needs it; returns the bytes used.
    pub fn alloc(&mut self, graph: &mut Graph, nodes: &[TensorId]) -> Result<usize> {
        let p = plan(graph, nodes, self.buffer_type.alignment());
        let need = p.size.max(1);
        let reuse = matches!(&self.buffer, Some(b) if b.size() >= need);
        if !reuse {
            self.buffer = None; // free the old one first
            self.buffer = Some(self.buffer_type.alloc(need)?);
            log::debug!(
                "graph allocator: {} bytes of {}",
                need,
                self.buffer_type.name()
            );
        }
        let buf = self.buffer.clone().expect("allocated above");
        for (id, off) in p.offsets {
            graph.bind(id, buf.clone(), off)?;
        }
        Ok(p.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// The offset the plan gives `id`, if it gives it one.
    fn offset(p: &Plan, id: TensorId) -> Option<usize> {
        p.offsets.iter().find(|(i, _)| *i == id).map(|(_, o)| *o)
    }

    #[test]
    fn memory_is_reused_after_the_last_reader() {
        // x -> a -> b -> c -> d, each 4 KiB: a chain needs only two live blocks at a time.
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[1024]).unwrap();
        let a = g.unary(x, crate::UnaryOp::Exp).unwrap();
        let w = g.input("w", DType::F32, &[1024]).unwrap();
        let b = g.mul(a, w).unwrap(); // in place over a
        let c = g.sum_rows(b).unwrap();
        let d = g.scale(c, 2.0).unwrap(); // in place over c
        g.set_output(d);
        let nodes: Vec<TensorId> = g.ids().collect();
        let p = plan(&g, &nodes, 64);
        let off = |id: TensorId| offset(&p, id);
        assert_eq!(off(b), off(a), "mul runs in place over exp");
        assert_eq!(off(d), off(c), "scale runs in place over sum_rows");
        // x and w are inputs (live throughout), a/b one block, c/d one small block.
        assert!(p.size <= 3 * 4096 + 64, "planned {} bytes", p.size);
        // The inputs never overlap anything.
        let ranges: Vec<(usize, usize)> = [x, w, a]
            .iter()
            .map(|&i| (off(i).unwrap(), off(i).unwrap() + 4096))
            .collect();
        for (i, r) in ranges.iter().enumerate() {
            for s in &ranges[i + 1..] {
                assert!(r.1 <= s.0 || s.1 <= r.0, "{r:?} overlaps {s:?}");
            }
        }
    }

    #[test]
    fn outputs_are_never_overwritten() {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[256]).unwrap();
        let a = g.unary(x, crate::UnaryOp::Neg).unwrap();
        g.set_output(a);
        let b = g.unary(a, crate::UnaryOp::Exp).unwrap();
        let c = g.unary(b, crate::UnaryOp::Sqr).unwrap();
        let nodes: Vec<TensorId> = g.ids().collect();
        let p = plan(&g, &nodes, 64);
        let off = |id: TensorId| offset(&p, id).unwrap();
        assert_ne!(off(b), off(a), "exp must not run in place over an output");
        assert_ne!(
            off(c),
            off(a),
            "later tensors must not reuse an output's block"
        );
    }

    #[test]
    fn a_copy_into_a_view_marked_output_keeps_its_root() {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[256]).unwrap();
        let dst = g.new_tensor(DType::F32, &[256]).unwrap();
        let y = g.unary(x, crate::UnaryOp::Neg).unwrap();
        let c = g.cpy(y, dst).unwrap();
        g.set_output(c);
        let z = g.unary(x, crate::UnaryOp::Exp).unwrap();
        let w = g.unary(z, crate::UnaryOp::Sqr).unwrap();
        let nodes: Vec<TensorId> = g.ids().collect();
        let p = plan(&g, &nodes, 64);
        let off = |id: TensorId| offset(&p, id).unwrap();
        for later in [z, w] {
            assert_ne!(
                off(later),
                off(dst),
                "the copy's destination is an output: keep it"
            );
        }
    }
}
