//! A graph: tensors in an arena, referred to by [`TensorId`], in topological order (a tensor
//! is always created after its sources). Every builder method checks shapes, strides and
//! types and returns a [`Result`] whose error names the tensor and the reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{BinaryOp, GluOp, Op, RopeParams, UnaryOp};
use crate::tensor::{Tensor, TensorData, TensorFlags, TensorId, MAX_DIMS};

/// The source of [`Graph::stamp`] values, unique in the process.
static STAMPS: AtomicU64 = AtomicU64::new(1);

fn next_stamp() -> u64 {
    STAMPS.fetch_add(1, Ordering::Relaxed)
}

/// A computation graph and its tensors.
#[derive(Clone, Debug)]
pub struct Graph {
    tensors: Vec<Tensor>,
    stamp: u64,
}

impl Default for Graph {
    fn default() -> Self {
        Graph {
            tensors: Vec::new(),
            stamp: next_stamp(),
        }
    }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// A number that names this graph's present state: it changes whenever the graph does (a
    /// tensor added, changed through [`Graph::get_mut`], renamed, marked or bound) and no two
    /// graphs get the same one, except a clone and its original until either changes. A
    /// backend may keep what it derived from a graph (its encoded commands) while the stamp
    /// stays the same.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the graph has no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// A tensor by id.
    pub fn get(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    /// A tensor by id, mutable (for names, flags and data bindings).
    pub fn get_mut(&mut self, id: TensorId) -> &mut Tensor {
        self.stamp = next_stamp();
        &mut self.tensors[id.index()]
    }

    /// How many nodes read each tensor, by tensor index; a tensor marked as an output counts
    /// one more. A backend fuses away an intermediate result only when its count is one.
    pub fn reader_counts(&self) -> Vec<u32> {
        let mut counts = vec![0u32; self.len()];
        for t in &self.tensors {
            for &s in &t.src {
                counts[s.index()] += 1;
            }
        }
        for (c, t) in counts.iter_mut().zip(&self.tensors) {
            *c += u32::from(t.flags.output);
        }
        counts
    }

    /// Whether each tensor, by index, is a leaf set from outside the graph (a weight or an
    /// input) that no node writes into (CPY and SET_ROWS store into their destination's
    /// memory): its bytes are in place before the graph runs and stay as they are. A backend
    /// may read such a tensor before the kernels ahead of its reader finish.
    pub fn read_only_leaves(&self) -> Vec<bool> {
        let mut read_only: Vec<bool> = self
            .tensors
            .iter()
            .map(|t| t.flags.weight || t.flags.input)
            .collect();
        for t in &self.tensors {
            if matches!(t.op, Op::Cpy | Op::SetRows) {
                if let Some(root) = t.view_src {
                    read_only[root.index()] = false;
                }
            }
        }
        read_only
    }

    /// The first of `nodes[j..]`, looking at most `window` nodes ahead, that computes
    /// something, with its index in `nodes`: leaves and views compute nothing (a scheduler
    /// leaves them out of the lists it hands backends; other callers may not).
    pub fn next_computed(
        &self,
        nodes: &[TensorId],
        j: usize,
        window: usize,
    ) -> Option<(usize, TensorId)> {
        nodes
            .iter()
            .enumerate()
            .skip(j)
            .take(window)
            .find(|(_, &n)| {
                let t = self.get(n);
                !(t.op == Op::None || t.op.is_view())
            })
            .map(|(i, &n)| (i, n))
    }

    /// Every id, in topological order.
    pub fn ids(&self) -> impl Iterator<Item = TensorId> + '_ {
        (0..self.tensors.len() as u32).map(TensorId)
    }

    /// Looks a tensor up by name.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors
            .iter()
            .position(|t| t.name == name)
            .map(|i| TensorId(i as u32))
    }

    /// Sets a tensor's name; returns the id for chaining.
    pub fn set_name(&mut self, id: TensorId, name: impl Into<String>) -> TensorId {
        self.stamp = next_stamp();
        self.tensors[id.index()].name = name.into();
        id
    }

    /// Marks a tensor as an output (its memory is kept to the end of the run).
    pub fn set_output(&mut self, id: TensorId) {
        self.stamp = next_stamp();
        self.tensors[id.index()].flags.output = true;
    }

    /// Binds a root tensor (not a view) to bytes in a buffer, checking that it fits.
    pub fn bind(&mut self, id: TensorId, buffer: Arc<dyn Buffer>, offset: usize) -> Result<()> {
        let t = &self.tensors[id.index()];
        let label = t.label(id);
        if t.view_src.is_some() {
            return Err(Error::op(
                label,
                t.op.name(),
                "a view cannot be bound; bind its source",
            ));
        }
        let end = offset
            .checked_add(t.nbytes())
            .ok_or(Error::Overflow("tensor end"))?;
        if end > buffer.size() {
            return Err(Error::Buffer {
                buffer: buffer.name(),
                reason: format!(
                    "tensor '{label}' needs bytes {offset}..{end} but the buffer has {}",
                    buffer.size()
                ),
            });
        }
        self.stamp = next_stamp();
        self.tensors[id.index()].data = Some(TensorData { buffer, offset });
        Ok(())
    }

    /// The root tensor whose memory `id` uses, and the byte offset of `id` in it.
    pub fn root(&self, id: TensorId) -> (TensorId, usize) {
        let t = self.get(id);
        match t.view_src {
            Some(r) => (r, t.view_offset),
            None => (id, 0),
        }
    }

    /// Where a tensor's bytes are, resolving views; `None` when not yet bound or allocated.
    pub fn data(&self, id: TensorId) -> Option<TensorData> {
        let (root, off) = self.root(id);
        self.get(root).data.as_ref().map(|d| TensorData {
            buffer: d.buffer.clone(),
            offset: d.offset + off,
        })
    }

    /// Like [`Graph::data`], but an error naming the tensor when it has no memory.
    pub fn data_or_err(&self, id: TensorId) -> Result<TensorData> {
        self.data(id).ok_or_else(|| Error::Buffer {
            buffer: "(none)".into(),
            reason: format!(
                "tensor '{}' has no memory bound or allocated",
                self.label(id)
            ),
        })
    }

    /// The tensor's printable name.
    pub fn label(&self, id: TensorId) -> String {
        self.get(id).label(id)
    }

    /// Appends a tensor as it is, unchecked: for code that derives one graph from another (the
    /// scheduler's copies, the meta device's per-part graphs). The caller keeps it consistent:
    /// sources and `view_src` already in this graph, `view_src` a root, `ne` and `nb` valid for
    /// the type and the op's sources, as the builder methods would have made them.
    pub fn push_raw(&mut self, t: Tensor) -> TensorId {
        self.push(t)
    }

    fn push(&mut self, t: Tensor) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.stamp = next_stamp();
        self.tensors.push(t);
        id
    }

    fn check_id(&self, id: TensorId, op: &'static str) -> Result<()> {
        if id.index() >= self.tensors.len() {
            return Err(Error::op(
                format!("#{}", id.0),
                op,
                "no such tensor in this graph",
            ));
        }
        Ok(())
    }

    fn node(
        &mut self,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        op: Op,
        src: Vec<TensorId>,
    ) -> Result<TensorId> {
        let name = op.name();
        if dtype.is_quantized() && !ne[0].is_multiple_of(dtype.block_size()) {
            return Err(Error::op(
                format!("#{}", self.tensors.len()),
                name,
                format!("ne[0]={} is not a whole number of {} blocks", ne[0], dtype),
            ));
        }
        checked_nelements(ne, name)?;
        Ok(self.push(Tensor {
            dtype,
            nb: Tensor::contiguous_strides(dtype, ne),
            ne,
            op,
            src,
            view_src: None,
            view_offset: 0,
            name: String::new(),
            flags: TensorFlags::default(),
            data: None,
        }))
    }

    fn err(&self, id: TensorId, op: &'static str, reason: impl Into<String>) -> Error {
        Error::op(self.label(id), op, reason)
    }

    // ---- leaves ----

    /// A new leaf tensor (weight or input) with contiguous layout.
    pub fn new_tensor(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId> {
        let ne = pad_ne(ne, "NONE")?;
        self.node(dtype, ne, Op::None, vec![])
    }

    /// A new input leaf: set from outside before each run.
    pub fn input(&mut self, name: &str, dtype: DType, ne: &[usize]) -> Result<TensorId> {
        let id = self.new_tensor(dtype, ne)?;
        let t = self.get_mut(id);
        t.name = name.into();
        t.flags.input = true;
        Ok(id)
    }

    /// A new weight leaf bound to bytes already in a buffer.
    pub fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        buffer: Arc<dyn Buffer>,
        offset: usize,
    ) -> Result<TensorId> {
        let id = self.new_tensor(dtype, ne)?;
        let t = self.get_mut(id);
        t.name = name.into();
        t.flags.weight = true;
        self.bind(id, buffer, offset)?;
        Ok(id)
    }

    // ---- views ----

    fn view_node(
        &mut self,
        a: TensorId,
        op: Op,
        ne: [usize; 4],
        nb: [usize; 4],
        offset: usize,
    ) -> Result<TensorId> {
        let (root, base) = self.root(a);
        let src = self.get(a);
        let dtype = src.dtype;
        let t = Tensor {
            dtype,
            ne,
            nb,
            op,
            src: vec![a],
            view_src: Some(root),
            view_offset: base + offset,
            name: String::new(),
            flags: TensorFlags::default(),
            data: None,
        };
        // The view must stay inside its root.
        let root_t = self.get(root);
        let root_bytes = root_t.nbytes();
        let end = base + offset + t.nbytes();
        if end > root_bytes {
            return Err(self.err(
                a,
                t.op.name(),
                format!(
                    "view ends at byte {end}, past the {root_bytes} bytes of '{}'",
                    self.label(root)
                ),
            ));
        }
        Ok(self.push(t))
    }

    /// A view of `a` with shape `ne`, strides `nb` (`nb[0]` is implied) and byte offset.
    pub fn view(
        &mut self,
        a: TensorId,
        ne: &[usize],
        nb: &[usize],
        offset: usize,
    ) -> Result<TensorId> {
        self.check_id(a, "VIEW")?;
        let ne = pad_ne(ne, "VIEW")?;
        let dtype = self.get(a).dtype;
        if dtype.is_quantized() && ne[0] % dtype.block_size() != 0 {
            return Err(self.err(
                a,
                "VIEW",
                "a view of a quantized tensor must keep whole blocks",
            ));
        }
        let mut full = Tensor::contiguous_strides(dtype, ne);
        if nb.len() + 1 > MAX_DIMS {
            return Err(self.err(a, "VIEW", "at most 3 strides (nb[1..4])"));
        }
        for (i, &s) in nb.iter().enumerate() {
            full[i + 1] = s;
        }
        // Unspecified higher strides follow on from the last given one.
        for i in nb.len() + 1..MAX_DIMS {
            full[i] = full[i - 1] * ne[i - 1];
        }
        self.view_node(a, Op::View, ne, full, offset)
    }

    /// `a` with another shape of the same element count; `a` must be contiguous.
    pub fn reshape(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        self.check_id(a, "RESHAPE")?;
        let ne = pad_ne(ne, "RESHAPE")?;
        let t = self.get(a);
        if !t.is_contiguous() {
            return Err(self.err(a, "RESHAPE", "source is not contiguous (use cont first)"));
        }
        let n: usize = ne.iter().product();
        if n != t.nelements() {
            return Err(self.err(
                a,
                "RESHAPE",
                format!(
                    "{:?} has {} elements but the source {:?} has {}",
                    ne,
                    n,
                    t.ne,
                    t.nelements()
                ),
            ));
        }
        let nb = Tensor::contiguous_strides(t.dtype, ne);
        if t.dtype.is_quantized() && ne[0] % t.dtype.block_size() != 0 {
            return Err(self.err(a, "RESHAPE", "ne[0] must stay a whole number of blocks"));
        }
        self.view_node(a, Op::Reshape, ne, nb, 0)
    }

    /// `a` with axis `i` moved to position `axes[i]` (ggml's permute).
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        self.check_id(a, "PERMUTE")?;
        let mut seen = [false; 4];
        for &x in &axes {
            if x >= 4 || seen[x] {
                return Err(self.err(
                    a,
                    "PERMUTE",
                    format!("{axes:?} is not a permutation of 0..4"),
                ));
            }
            seen[x] = true;
        }
        let t = self.get(a);
        if t.dtype.is_quantized() && axes[0] != 0 {
            return Err(self.err(a, "PERMUTE", "a quantized tensor cannot move axis 0"));
        }
        let mut ne = [0; 4];
        let mut nb = [0; 4];
        for i in 0..4 {
            ne[axes[i]] = t.ne[i];
            nb[axes[i]] = t.nb[i];
        }
        self.view_node(a, Op::Permute(axes), ne, nb, 0)
    }

    /// `a` with axes 0 and 1 swapped.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_id(a, "TRANSPOSE")?;
        let t = self.get(a);
        if t.dtype.is_quantized() {
            return Err(self.err(a, "TRANSPOSE", "a quantized tensor cannot be transposed"));
        }
        let mut ne = t.ne;
        let mut nb = t.nb;
        ne.swap(0, 1);
        nb.swap(0, 1);
        self.view_node(a, Op::Transpose, ne, nb, 0)
    }

    // ---- copies ----

    /// Copies `a` into `b` (same element count), converting to `b`'s type; the result is a view
    /// of `b`.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.check_id(a, "CPY")?;
        self.check_id(b, "CPY")?;
        let (ta, tb) = (self.get(a), self.get(b));
        if ta.nelements() != tb.nelements() {
            return Err(self.err(
                a,
                "CPY",
                format!("{:?} and {:?} differ in element count", ta.ne, tb.ne),
            ));
        }
        check_convertible(ta.dtype, tb.dtype).map_err(|r| self.err(a, "CPY", r))?;
        if tb.dtype.is_quantized() && !tb.is_contiguous() {
            return Err(self.err(b, "CPY", "a quantized destination must be contiguous"));
        }
        if ta.dtype.is_quantized() && !ta.rows_contiguous() {
            return Err(self.err(a, "CPY", "a quantized source needs contiguous rows"));
        }
        let (ne, nb) = (tb.ne, tb.nb);
        let (root, off) = self.root(b);
        let id = self.push(Tensor {
            dtype: tb.dtype,
            ne,
            nb,
            op: Op::Cpy,
            src: vec![a, b],
            view_src: Some(root),
            view_offset: off,
            name: String::new(),
            flags: TensorFlags::default(),
            data: None,
        });
        Ok(id)
    }

    /// A contiguous copy of `a`.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_id(a, "CONT")?;
        let t = self.get(a);
        if t.dtype.is_quantized() && !t.rows_contiguous() {
            return Err(self.err(a, "CONT", "a quantized source needs contiguous rows"));
        }
        let (dt, ne) = (t.dtype, t.ne);
        self.node(dt, ne, Op::Cont, vec![a])
    }

    /// A copy of `a` converted to another type, contiguous.
    pub fn cast(&mut self, a: TensorId, dtype: DType) -> Result<TensorId> {
        self.check_id(a, "CPY")?;
        let ne = self.get(a).ne;
        let b = self.new_tensor(dtype, &ne)?;
        self.cpy(a, b)
    }

    /// A copy of `a` (same type).
    pub fn dup(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_id(a, "DUP")?;
        let t = self.get(a);
        if t.dtype.is_quantized() && !t.rows_contiguous() {
            return Err(self.err(a, "DUP", "a quantized source needs contiguous rows"));
        }
        let (dt, ne) = (t.dtype, t.ne);
        self.node(dt, ne, Op::Dup, vec![a])
    }

    // ---- rows ----

    /// Rows of `a` [n, rows, d2, d3] picked by I32 `idx` [m, d2, d3]: F32 [n, m, d2, d3].
    pub fn get_rows(&mut self, a: TensorId, idx: TensorId) -> Result<TensorId> {
        self.check_id(a, "GET_ROWS")?;
        self.check_id(idx, "GET_ROWS")?;
        let (ta, ti) = (self.get(a), self.get(idx));
        if ti.dtype != DType::I32 {
            return Err(self.err(
                idx,
                "GET_ROWS",
                format!("indices must be i32, not {}", ti.dtype),
            ));
        }
        if ti.ne[3] != 1 || ta.ne[2] != ti.ne[1] || ta.ne[3] != ti.ne[2] {
            return Err(self.err(
                idx,
                "GET_ROWS",
                format!(
                    "indices {:?} do not match source {:?} (need [m, ne2, ne3])",
                    ti.ne, ta.ne
                ),
            ));
        }
        if !ta.rows_contiguous() {
            return Err(self.err(a, "GET_ROWS", "source rows must be contiguous"));
        }
        if !matches!(ta.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32)
            && !ta.dtype.is_quantized()
        {
            return Err(self.err(a, "GET_ROWS", format!("type {} unsupported", ta.dtype)));
        }
        let out_t = if ta.dtype == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        let ne = [ta.ne[0], ti.ne[0], ta.ne[2], ta.ne[3]];
        self.node(out_t, ne, Op::GetRows, vec![a, idx])
    }

    /// Writes rows of `b` (F32) into `a` at indices `idx` (I32 or I64, [m, d2', d3'] broadcast
    /// over `a`'s dims 2-3), converting to `a`'s type; the result is a view of `a`.
    pub fn set_rows(&mut self, a: TensorId, b: TensorId, idx: TensorId) -> Result<TensorId> {
        for x in [a, b, idx] {
            self.check_id(x, "SET_ROWS")?;
        }
        let (ta, tb, ti) = (self.get(a), self.get(b), self.get(idx));
        if !matches!(ti.dtype, DType::I32 | DType::I64) {
            return Err(self.err(
                idx,
                "SET_ROWS",
                format!("indices must be i32 or i64, not {}", ti.dtype),
            ));
        }
        if tb.dtype != DType::F32 {
            return Err(self.err(
                b,
                "SET_ROWS",
                format!("source rows must be f32, not {}", tb.dtype),
            ));
        }
        check_convertible(DType::F32, ta.dtype).map_err(|r| self.err(a, "SET_ROWS", r))?;
        if ta.ne[0] != tb.ne[0] {
            return Err(self.err(
                b,
                "SET_ROWS",
                format!("row length {} != destination's {}", tb.ne[0], ta.ne[0]),
            ));
        }
        if ti.ne[0] != tb.ne[1]
            || tb.ne[2] % ti.ne[1] != 0
            || tb.ne[3] % ti.ne[2] != 0
            || ti.ne[3] != 1
        {
            return Err(self.err(
                idx,
                "SET_ROWS",
                format!("indices {:?} do not match rows {:?}", ti.ne, tb.ne),
            ));
        }
        if ta.ne[2] != tb.ne[2] || ta.ne[3] != tb.ne[3] {
            return Err(self.err(
                b,
                "SET_ROWS",
                format!(
                    "rows {:?} and destination {:?} differ in dims 2-3",
                    tb.ne, ta.ne
                ),
            ));
        }
        if !ta.rows_contiguous() {
            return Err(self.err(a, "SET_ROWS", "destination rows must be contiguous"));
        }
        let (dt, ne, nb) = (ta.dtype, ta.ne, ta.nb);
        let (root, off) = self.root(a);
        Ok(self.push(Tensor {
            dtype: dt,
            ne,
            nb,
            op: Op::SetRows,
            src: vec![a, b, idx],
            view_src: Some(root),
            view_offset: off,
            name: String::new(),
            flags: TensorFlags::default(),
            data: None,
        }))
    }

    // ---- matrix products ----

    /// `a` [k, m, d2, d3] (any type, rows contiguous) times `b` [k, n, e2, e3] (F32 or F16, or BF16
    /// when `a` is a float type; e2 and e3 multiples of d2 and d3): F32 [m, n, e2, e3].
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.check_id(a, "MUL_MAT")?;
        self.check_id(b, "MUL_MAT")?;
        let (ta, tb) = (self.get(a), self.get(b));
        if ta.ne[0] != tb.ne[0] {
            return Err(self.err(
                a,
                "MUL_MAT",
                format!("inner dims differ: {:?} x {:?}", ta.ne, tb.ne),
            ));
        }
        if tb.ne[2] % ta.ne[2] != 0 || tb.ne[3] % ta.ne[3] != 0 {
            return Err(self.err(
                b,
                "MUL_MAT",
                format!("batch dims of {:?} are not multiples of {:?}", tb.ne, ta.ne),
            ));
        }
        if !(matches!(tb.dtype, DType::F32 | DType::F16)
            || (ta.dtype.is_float() && tb.dtype == DType::BF16))
        {
            return Err(self.err(
                b,
                "MUL_MAT",
                format!(
                    "src1 must be f32 or f16 (or bf16 with float weights), not {} (src0 {})",
                    tb.dtype, ta.dtype
                ),
            ));
        }
        if matches!(
            ta.dtype,
            DType::I32 | DType::I64 | DType::Q8_1 | DType::Q8_K
        ) {
            return Err(self.err(a, "MUL_MAT", format!("src0 type {} unsupported", ta.dtype)));
        }
        if !ta.rows_contiguous() {
            return Err(self.err(a, "MUL_MAT", "src0 rows must be contiguous"));
        }
        let ne = [ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3]];
        self.node(DType::F32, ne, Op::MulMat, vec![a, b])
    }

    /// The expert mat-mul (ggml's `mul_mat_id`): `as_` [k, m, n_expert] (one matrix per
    /// expert, any type mul_mat takes, rows contiguous) times `b` [k, n_b, n_tokens] (F32 or
    /// F16), each row of `b` by the experts that I32 `ids` [n_used, n_tokens] name (n_used a
    /// multiple of n_b: row `e % n_b` of token t goes to expert `ids[e, t]`): F32
    /// [m, n_used, n_tokens].
    pub fn mul_mat_id(&mut self, as_: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        for x in [as_, b, ids] {
            self.check_id(x, "MUL_MAT_ID")?;
        }
        let (ta, tb, ti) = (self.get(as_), self.get(b), self.get(ids));
        if ti.dtype != DType::I32 {
            return Err(self.err(
                ids,
                "MUL_MAT_ID",
                format!("ids must be i32, not {}", ti.dtype),
            ));
        }
        if ta.ne[3] != 1 || tb.ne[3] != 1 || ti.ne[2] != 1 || ti.ne[3] != 1 {
            return Err(self.err(
                as_,
                "MUL_MAT_ID",
                format!(
                    "needs 3-D experts, 3-D rows and 2-D ids, got {:?}, {:?}, {:?}",
                    ta.ne, tb.ne, ti.ne
                ),
            ));
        }
        if ta.ne[0] != tb.ne[0] || ti.ne[1] != tb.ne[2] || ti.ne[0] % tb.ne[1] != 0 {
            return Err(self.err(
                b,
                "MUL_MAT_ID",
                format!(
                    "experts {:?}, rows {:?} and ids {:?} do not fit (need the same k, one id \
                     row per token, and ids per token a multiple of rows per token)",
                    ta.ne, tb.ne, ti.ne
                ),
            ));
        }
        if !matches!(tb.dtype, DType::F32 | DType::F16) {
            return Err(self.err(
                b,
                "MUL_MAT_ID",
                format!("src1 must be f32 or f16, not {}", tb.dtype),
            ));
        }
        if matches!(
            ta.dtype,
            DType::I32 | DType::I64 | DType::Q8_1 | DType::Q8_K
        ) || !ta.rows_contiguous()
        {
            return Err(self.err(
                as_,
                "MUL_MAT_ID",
                format!(
                    "src0 must be a float or quantized type with contiguous rows, not {}",
                    ta.dtype
                ),
            ));
        }
        let ne = [ta.ne[1], ti.ne[0], tb.ne[2], 1];
        self.node(DType::F32, ne, Op::MulMatId { first: 0 }, vec![as_, b, ids])
    }

    /// `a` [n, n_used, n_tokens] (F32) plus the rows of `b` [n, n_rows] (F32) that I32 `ids`
    /// [n_used, n_tokens] pick (ggml's `add_id`, a bias per expert): F32, `a`'s shape.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        for x in [a, b, ids] {
            self.check_id(x, "ADD_ID")?;
        }
        let (ta, tb, ti) = (self.get(a), self.get(b), self.get(ids));
        if ta.dtype != DType::F32 || tb.dtype != DType::F32 || ti.dtype != DType::I32 {
            return Err(self.err(
                a,
                "ADD_ID",
                format!(
                    "needs f32, f32 and i32 ids, got {}, {}, {}",
                    ta.dtype, tb.dtype, ti.dtype
                ),
            ));
        }
        let fits = ta.ne[3] == 1
            && tb.ne[2] == 1
            && tb.ne[3] == 1
            && tb.ne[0] == ta.ne[0]
            && ti.ne[0] == ta.ne[1]
            && ti.ne[1] == ta.ne[2]
            && ti.ne[2] == 1
            && ti.ne[3] == 1;
        if !fits {
            return Err(self.err(
                b,
                "ADD_ID",
                format!(
                    "a {:?}, b {:?} and ids {:?} do not fit (need a [n, n_used, n_tokens], \
                     b [n, n_rows], ids [n_used, n_tokens])",
                    ta.ne, tb.ne, ti.ne
                ),
            ));
        }
        let ne = ta.ne;
        self.node(DType::F32, ne, Op::AddId, vec![a, b, ids])
    }

    // ---- element-wise ----

    fn binary(&mut self, op: BinaryOp, a: TensorId, b: TensorId) -> Result<TensorId> {
        let name = Op::Binary(op).name();
        self.check_id(a, name)?;
        self.check_id(b, name)?;
        let (ta, tb) = (self.get(a), self.get(b));
        for i in 0..4 {
            if tb.ne[i] == 0 || ta.ne[i] % tb.ne[i] != 0 {
                return Err(self.err(
                    b,
                    name,
                    format!("{:?} does not broadcast over {:?}", tb.ne, ta.ne),
                ));
            }
        }
        if !ta.dtype.is_float() || !tb.dtype.is_float() {
            return Err(self.err(
                a,
                name,
                format!("float types only, got {} and {}", ta.dtype, tb.dtype),
            ));
        }
        let (dt, ne) = (ta.dtype, ta.ne);
        self.node(dt, ne, Op::Binary(op), vec![a, b])
    }

    /// a + b, b broadcast.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(BinaryOp::Add, a, b)
    }
    /// a - b, b broadcast.
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(BinaryOp::Sub, a, b)
    }
    /// a * b, b broadcast.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// a / b, b broadcast.
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(BinaryOp::Div, a, b)
    }

    fn float_same(&mut self, a: TensorId, op: Op) -> Result<TensorId> {
        let name = op.name();
        self.check_id(a, name)?;
        let t = self.get(a);
        if !t.dtype.is_float() {
            return Err(self.err(a, name, format!("float types only, got {}", t.dtype)));
        }
        let (dt, ne) = (t.dtype, t.ne);
        self.node(dt, ne, op, vec![a])
    }

    /// An element-wise unary function.
    pub fn unary(&mut self, a: TensorId, op: UnaryOp) -> Result<TensorId> {
        self.float_same(a, Op::Unary(op))
    }

    /// x * scale.
    pub fn scale(&mut self, a: TensorId, scale: f32) -> Result<TensorId> {
        self.float_same(a, Op::Scale { scale, bias: 0.0 })
    }

    /// x * scale + bias.
    pub fn scale_bias(&mut self, a: TensorId, scale: f32, bias: f32) -> Result<TensorId> {
        self.float_same(a, Op::Scale { scale, bias })
    }

    /// min(max(x, min), max).
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        if min.is_nan() || max.is_nan() || min > max {
            return Err(self.err(a, "CLAMP", format!("bad bounds [{min}, {max}]")));
        }
        self.float_same(a, Op::Clamp { min, max })
    }

    /// A gated linear unit over one tensor whose rows hold the gate half then the up half
    /// (`swapped`: up then gate): the result has half the row length.
    pub fn glu(&mut self, a: TensorId, op: GluOp, swapped: bool) -> Result<TensorId> {
        let o = Op::Glu { op, swapped };
        self.check_id(a, o.name())?;
        let t = self.get(a);
        if t.dtype != DType::F32 && t.dtype != DType::F16 {
            return Err(self.err(a, o.name(), format!("f32 or f16 only, got {}", t.dtype)));
        }
        if !t.ne[0].is_multiple_of(2) {
            return Err(self.err(a, o.name(), format!("row length {} is odd", t.ne[0])));
        }
        if !t.rows_contiguous() {
            return Err(self.err(a, o.name(), "rows must be contiguous"));
        }
        let mut ne = t.ne;
        ne[0] /= 2;
        let dt = t.dtype;
        self.node(dt, ne, o, vec![a])
    }

    /// A gated linear unit of separate gate and up tensors of one shape: act(gate) * up.
    pub fn glu_split(&mut self, gate: TensorId, up: TensorId, op: GluOp) -> Result<TensorId> {
        let o = Op::Glu { op, swapped: false };
        self.check_id(gate, o.name())?;
        self.check_id(up, o.name())?;
        let (tg, tu) = (self.get(gate), self.get(up));
        if tg.ne != tu.ne || tg.dtype != tu.dtype {
            return Err(self.err(
                up,
                o.name(),
                format!(
                    "gate {:?} {} and up {:?} {} differ",
                    tg.ne, tg.dtype, tu.ne, tu.dtype
                ),
            ));
        }
        if tg.dtype != DType::F32 && tg.dtype != DType::F16 {
            return Err(self.err(gate, o.name(), format!("f32 or f16 only, got {}", tg.dtype)));
        }
        let (dt, ne) = (tg.dtype, tg.ne);
        self.node(dt, ne, o, vec![gate, up])
    }

    /// gpt-oss's clamped SwiGLU of gate and up tensors of one f32 shape (ggml's
    /// `swiglu_oai`): x * sigmoid(alpha * x) * (y + 1) with x = min(gate, limit) and
    /// y = clamp(up, -limit, limit).
    pub fn swiglu_oai(
        &mut self,
        gate: TensorId,
        up: TensorId,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId> {
        let o = Op::SwigluOai { alpha, limit };
        self.check_id(gate, o.name())?;
        self.check_id(up, o.name())?;
        let (tg, tu) = (self.get(gate), self.get(up));
        if tg.ne != tu.ne || tg.dtype != DType::F32 || tu.dtype != DType::F32 {
            return Err(self.err(
                up,
                o.name(),
                format!(
                    "gate {:?} {} and up {:?} {} must be f32 of one shape",
                    tg.ne, tg.dtype, tu.ne, tu.dtype
                ),
            ));
        }
        if !alpha.is_finite() || limit.is_nan() || limit <= 0.0 {
            return Err(self.err(
                gate,
                o.name(),
                format!("alpha {alpha} must be finite and limit {limit} positive"),
            ));
        }
        let ne = tg.ne;
        self.node(DType::F32, ne, o, vec![gate, up])
    }

    /// silu(gate) * up.
    pub fn swiglu_split(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.glu_split(gate, up, GluOp::Swiglu)
    }

    // ---- normalisation ----

    fn row_op_f32(&mut self, a: TensorId, op: Op) -> Result<TensorId> {
        let name = op.name();
        self.check_id(a, name)?;
        let t = self.get(a);
        if t.dtype != DType::F32 {
            return Err(self.err(a, name, format!("f32 only, got {}", t.dtype)));
        }
        let ne = t.ne;
        self.node(DType::F32, ne, op, vec![a])
    }

    /// RMS norm of each row.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.row_op_f32(a, Op::RmsNorm { eps })
    }

    /// Layer norm (no affine part) of each row.
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.row_op_f32(a, Op::Norm { eps })
    }

    /// softmax(a * scale + slope * mask) over rows; the mask (F32 or F16) is [ne0, >= ne1, d2, d3]
    /// with d2, d3 dividing a's, broadcast.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        self.check_id(a, "SOFT_MAX")?;
        let ta = self.get(a);
        if ta.dtype != DType::F32 {
            return Err(self.err(a, "SOFT_MAX", format!("f32 only, got {}", ta.dtype)));
        }
        let mut src = vec![a];
        if let Some(m) = mask {
            self.check_id(m, "SOFT_MAX")?;
            let tm = self.get(m);
            if !matches!(tm.dtype, DType::F32 | DType::F16) {
                return Err(self.err(
                    m,
                    "SOFT_MAX",
                    format!("mask must be f32 or f16, not {}", tm.dtype),
                ));
            }
            if tm.ne[0] != ta.ne[0]
                || tm.ne[1] < ta.ne[1]
                || !ta.ne[2].is_multiple_of(tm.ne[2])
                || !ta.ne[3].is_multiple_of(tm.ne[3])
            {
                return Err(self.err(
                    m,
                    "SOFT_MAX",
                    format!("mask {:?} does not fit {:?}", tm.ne, ta.ne),
                ));
            }
            src.push(m);
        } else if max_bias != 0.0 {
            return Err(self.err(a, "SOFT_MAX", "ALiBi (max_bias) needs a mask"));
        }
        let ne = ta.ne;
        self.node(DType::F32, ne, Op::SoftMax { scale, max_bias }, src)
    }

    /// Rotary position embedding: `a` `[head_dim, heads, tokens, 1]` (F32 or F16), `pos` I32 `[tokens]`.
    pub fn rope(&mut self, a: TensorId, pos: TensorId, p: RopeParams) -> Result<TensorId> {
        self.rope_ext(a, pos, None, p)
    }

    /// [`Graph::rope`] with per-pair frequency factors: `factors` F32 `[n_dims / 2]` divides
    /// pair k's angle by `factors[k]` (ggml's `rope_ext` with its third source).
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        factors: Option<TensorId>,
        p: RopeParams,
    ) -> Result<TensorId> {
        self.check_id(a, "ROPE")?;
        self.check_id(pos, "ROPE")?;
        if let Some(f) = factors {
            self.check_id(f, "ROPE")?;
            let tf = self.get(f);
            if tf.dtype != DType::F32 || tf.ne != [p.n_dims / 2, 1, 1, 1] || !tf.is_contiguous() {
                return Err(self.err(
                    f,
                    "ROPE",
                    format!(
                        "frequency factors must be contiguous f32 [{}], got {} {:?}",
                        p.n_dims / 2,
                        tf.dtype,
                        tf.ne
                    ),
                ));
            }
        }
        let (ta, tp) = (self.get(a), self.get(pos));
        if !matches!(ta.dtype, DType::F32 | DType::F16) {
            return Err(self.err(a, "ROPE", format!("f32 or f16 only, got {}", ta.dtype)));
        }
        if tp.dtype != DType::I32 || tp.ne[0] != ta.ne[2] || tp.nelements() != tp.ne[0] {
            return Err(self.err(
                pos,
                "ROPE",
                format!(
                    "positions must be i32 [{}], got {} {:?}",
                    ta.ne[2], tp.dtype, tp.ne
                ),
            ));
        }
        if p.n_dims == 0 || !p.n_dims.is_multiple_of(2) || p.n_dims > ta.ne[0] {
            return Err(self.err(
                a,
                "ROPE",
                format!("n_dims {} must be even and at most {}", p.n_dims, ta.ne[0]),
            ));
        }
        // Written so that a NaN base fails too.
        if p.freq_base.is_nan() || p.freq_base <= 0.0 || !p.freq_scale.is_finite() {
            return Err(self.err(a, "ROPE", "freq_base must be > 0 and freq_scale finite"));
        }
        if !p.ext_factor.is_finite() || !p.attn_factor.is_finite() {
            return Err(self.err(a, "ROPE", "ext_factor and attn_factor must be finite"));
        }
        if p.ext_factor != 0.0 && (p.n_ctx_orig == 0 || p.freq_scale <= 0.0) {
            return Err(self.err(
                a,
                "ROPE",
                "YaRN needs the original context length and a positive freq_scale",
            ));
        }
        let (dt, ne) = (ta.dtype, ta.ne);
        let mut srcs = vec![a, pos];
        srcs.extend(factors);
        self.node(dt, ne, Op::Rope(p), srcs)
    }

    /// Fused attention. q [d, n_q, heads, b] F32; k [d, n_kv, kv_heads, b] and v [dv, n_kv,
    /// kv_heads, b] F32 or F16 with heads a multiple of kv_heads (GQA); mask F16/F32
    /// [n_kv, >= n_q, 1 or heads..., 1]. Result F32 [dv, heads, n_q, b] (ggml's permuted layout).
    #[allow(clippy::too_many_arguments)] // ggml's signature: three tensors, a mask, three scalars
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        logit_softcap: f32,
    ) -> Result<TensorId> {
        self.flash_attn(q, k, v, mask, None, [scale, max_bias, logit_softcap])
    }

    /// [`Graph::flash_attn_ext`] with attention sinks: `sinks` F32 [heads], one logit per
    /// query head that joins the soft-max of the head's rows and adds no value (gpt-oss).
    #[allow(clippy::too_many_arguments)] // flash_attn_ext's arguments and the sinks
    pub fn flash_attn_ext_sinks(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        sinks: TensorId,
        scale: f32,
        max_bias: f32,
        logit_softcap: f32,
    ) -> Result<TensorId> {
        self.flash_attn(q, k, v, mask, Some(sinks), [scale, max_bias, logit_softcap])
    }

    /// flash_attn_ext with optional sinks; `params`: scale, max_bias, logit_softcap.
    fn flash_attn(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        sinks: Option<TensorId>,
        [scale, max_bias, logit_softcap]: [f32; 3],
    ) -> Result<TensorId> {
        for x in [q, k, v] {
            self.check_id(x, "FLASH_ATTN_EXT")?;
        }
        let (tq, tk, tv) = (self.get(q), self.get(k), self.get(v));
        if tq.dtype != DType::F32 {
            return Err(self.err(
                q,
                "FLASH_ATTN_EXT",
                format!("q must be f32, not {}", tq.dtype),
            ));
        }
        for (id, t) in [(k, tk), (v, tv)] {
            if !matches!(t.dtype, DType::F32 | DType::F16) {
                return Err(self.err(
                    id,
                    "FLASH_ATTN_EXT",
                    format!("k and v must be f32 or f16, not {}", t.dtype),
                ));
            }
        }
        if tk.ne[0] != tq.ne[0]
            || tk.ne[1] != tv.ne[1]
            || tk.ne[2] != tv.ne[2]
            || tk.ne[3] != tv.ne[3]
        {
            return Err(self.err(
                k,
                "FLASH_ATTN_EXT",
                format!("q {:?}, k {:?}, v {:?} do not fit", tq.ne, tk.ne, tv.ne),
            ));
        }
        if tk.ne[2] == 0 || tq.ne[2] % tk.ne[2] != 0 || tq.ne[3] % tk.ne[3] != 0 {
            return Err(self.err(
                k,
                "FLASH_ATTN_EXT",
                format!(
                    "{} query heads are not a multiple of {} kv heads",
                    tq.ne[2], tk.ne[2]
                ),
            ));
        }
        let mut src = vec![q, k, v];
        if let Some(m) = mask {
            self.check_id(m, "FLASH_ATTN_EXT")?;
            let tm = self.get(m);
            if !matches!(tm.dtype, DType::F32 | DType::F16)
                || tm.ne[0] != tk.ne[1]
                || tm.ne[1] < tq.ne[1]
                || tq.ne[2] % tm.ne[2] != 0
                || tq.ne[3] % tm.ne[3] != 0
            {
                return Err(self.err(
                    m,
                    "FLASH_ATTN_EXT",
                    format!(
                        "mask {} {:?} does not fit n_kv {} x n_q {}",
                        tm.dtype, tm.ne, tk.ne[1], tq.ne[1]
                    ),
                ));
            }
            src.push(m);
        } else if max_bias != 0.0 {
            return Err(self.err(q, "FLASH_ATTN_EXT", "ALiBi (max_bias) needs a mask"));
        }
        if let Some(s) = sinks {
            self.check_id(s, "FLASH_ATTN_EXT")?;
            let ts = self.get(s);
            if ts.dtype != DType::F32 || ts.ne != [tq.ne[2], 1, 1, 1] || !ts.is_contiguous() {
                return Err(self.err(
                    s,
                    "FLASH_ATTN_EXT",
                    format!(
                        "sinks must be one contiguous f32 row of {} heads, not {} {:?}",
                        tq.ne[2], ts.dtype, ts.ne
                    ),
                ));
            }
            src.push(s);
        }
        let ne = [tv.ne[0], tq.ne[2], tq.ne[1], tq.ne[3]];
        self.node(
            DType::F32,
            ne,
            Op::FlashAttnExt {
                scale,
                max_bias,
                logit_softcap,
                sinks: sinks.is_some(),
            },
            src,
        )
    }

    // ---- shape ops ----

    /// `a` and `b` joined along `dim`; other dims must match.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        self.check_id(a, "CONCAT")?;
        self.check_id(b, "CONCAT")?;
        let (ta, tb) = (self.get(a), self.get(b));
        if dim >= 4 {
            return Err(self.err(a, "CONCAT", format!("dim {dim} out of range")));
        }
        if ta.dtype != tb.dtype || ta.dtype.is_quantized() {
            return Err(self.err(
                b,
                "CONCAT",
                format!(
                    "types {} and {} must match and not be quantized",
                    ta.dtype, tb.dtype
                ),
            ));
        }
        for i in 0..4 {
            if i != dim && ta.ne[i] != tb.ne[i] {
                return Err(self.err(
                    b,
                    "CONCAT",
                    format!("{:?} and {:?} differ outside dim {dim}", ta.ne, tb.ne),
                ));
            }
        }
        let mut ne = ta.ne;
        ne[dim] += tb.ne[dim];
        let dt = ta.dtype;
        self.node(dt, ne, Op::Concat(dim), vec![a, b])
    }

    /// `a` tiled to shape `ne` (each dim a multiple of a's).
    pub fn repeat(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        self.check_id(a, "REPEAT")?;
        let ne = pad_ne(ne, "REPEAT")?;
        let t = self.get(a);
        if t.dtype.is_quantized() {
            return Err(self.err(a, "REPEAT", "quantized tensors cannot be repeated"));
        }
        for i in 0..4 {
            if t.ne[i] == 0 || ne[i] % t.ne[i] != 0 {
                return Err(self.err(a, "REPEAT", format!("{:?} does not tile {:?}", t.ne, ne)));
            }
        }
        let dt = t.dtype;
        self.node(dt, ne, Op::Repeat, vec![a])
    }

    /// `a` with `p[i]` zeros appended along each axis i.
    pub fn pad(&mut self, a: TensorId, p: [usize; 4]) -> Result<TensorId> {
        self.check_id(a, "PAD")?;
        let t = self.get(a);
        if t.dtype != DType::F32 {
            return Err(self.err(a, "PAD", format!("f32 only, got {}", t.dtype)));
        }
        let mut ne = t.ne;
        for i in 0..4 {
            ne[i] = ne[i].checked_add(p[i]).ok_or(Error::Overflow("pad"))?;
        }
        self.node(DType::F32, ne, Op::Pad(p), vec![a])
    }

    /// Sum of every element: F32 `[1]`.
    pub fn sum(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_id(a, "SUM")?;
        let t = self.get(a);
        if !t.dtype.is_float() {
            return Err(self.err(a, "SUM", format!("float types only, got {}", t.dtype)));
        }
        self.node(DType::F32, [1, 1, 1, 1], Op::Sum, vec![a])
    }

    fn row_reduce(&mut self, a: TensorId, op: Op) -> Result<TensorId> {
        let name = op.name();
        self.check_id(a, name)?;
        let t = self.get(a);
        if t.dtype != DType::F32 {
            return Err(self.err(a, name, format!("f32 only, got {}", t.dtype)));
        }
        let ne = [1, t.ne[1], t.ne[2], t.ne[3]];
        self.node(DType::F32, ne, op, vec![a])
    }

    /// Sum of each row: [1, ne1, ne2, ne3].
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        self.row_reduce(a, Op::SumRows)
    }

    /// Mean of each row: [1, ne1, ne2, ne3].
    pub fn mean(&mut self, a: TensorId) -> Result<TensorId> {
        self.row_reduce(a, Op::Mean)
    }

    /// Index of the largest value of each row of a 2-D F32 tensor: I32 `[ne1]`.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_id(a, "ARGMAX")?;
        let t = self.get(a);
        if t.dtype != DType::F32 || t.ne[2] != 1 || t.ne[3] != 1 {
            return Err(self.err(
                a,
                "ARGMAX",
                format!("needs a 2-D f32 tensor, got {} {:?}", t.dtype, t.ne),
            ));
        }
        let n = t.ne[1];
        self.node(DType::I32, [n, 1, 1, 1], Op::Argmax, vec![a])
    }

    /// The I32 indices that sort each row of F32 `a`, ascending or descending (stable).
    pub fn argsort(&mut self, a: TensorId, descending: bool) -> Result<TensorId> {
        self.check_id(a, "ARGSORT")?;
        let t = self.get(a);
        if t.dtype != DType::F32 {
            return Err(self.err(a, "ARGSORT", format!("f32 only, got {}", t.dtype)));
        }
        let ne = t.ne;
        self.node(DType::I32, ne, Op::Argsort { descending }, vec![a])
    }

    /// The I32 indices of the `k` largest values of each row of F32 `a`, largest first:
    /// [k, ne1, ne2, ne3].
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        self.check_id(a, "TOP_K")?;
        let t = self.get(a);
        if t.dtype != DType::F32 || k == 0 || k > t.ne[0] {
            return Err(self.err(
                a,
                "TOP_K",
                format!(
                    "needs f32 rows of at least k={k} > 0 values, got {} {:?}",
                    t.dtype, t.ne
                ),
            ));
        }
        let ne = [k, t.ne[1], t.ne[2], t.ne[3]];
        self.node(DType::I32, ne, Op::TopK(k), vec![a])
    }

    /// Elements with column > n_past + row set to -inf.
    pub fn diag_mask_inf(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.row_op_f32(a, Op::DiagMaskInf(n_past))
    }

    /// F32 values start, start + step, ... below stop.
    pub fn arange(&mut self, start: f32, stop: f32, step: f32) -> Result<TensorId> {
        let n = ((stop - start) / step).ceil();
        if !(step != 0.0 && n.is_finite() && (0.0..1e9).contains(&n)) {
            return Err(Error::op(
                format!("#{}", self.len()),
                "ARANGE",
                format!("bad range {start}..{stop} step {step}"),
            ));
        }
        self.node(
            DType::F32,
            [n as usize, 1, 1, 1],
            Op::Arange { start, stop, step },
            vec![],
        )
    }
}

fn pad_ne(ne: &[usize], op: &'static str) -> Result<[usize; MAX_DIMS]> {
    if ne.is_empty() || ne.len() > MAX_DIMS {
        return Err(Error::op(
            "(new)",
            op,
            format!("a shape has 1 to 4 dims, got {}", ne.len()),
        ));
    }
    let mut out = [1; MAX_DIMS];
    out[..ne.len()].copy_from_slice(ne);
    Ok(out)
}

fn checked_nelements(ne: [usize; MAX_DIMS], op: &'static str) -> Result<usize> {
    ne.iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .filter(|&n| n <= isize::MAX as usize / 8)
        .ok_or_else(|| Error::op("(new)", op, format!("shape {ne:?} is too large")))
}

/// Which type conversions cpy supports: between F32/F16/BF16, from those into any quantized
/// type, from a quantized type to F32, and same-type copies.
fn check_convertible(from: DType, to: DType) -> std::result::Result<(), String> {
    let ok = from == to
        || (from.is_float() && to.is_float())
        || (from.is_float() && to.is_quantized() && !matches!(to, DType::Q8_K))
        || (from.is_quantized() && to == DType::F32);
    if ok {
        Ok(())
    } else {
        Err(format!("cannot convert {from} to {to}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_leaves_are_the_unwritten_inputs_and_weights() {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[8, 4]).unwrap();
        let cache = g.input("cache", DType::F16, &[8, 16]).unwrap();
        let idx = g.input("idx", DType::I32, &[4]).unwrap();
        let rows = g.add(x, x).unwrap();
        let stored = g.set_rows(cache, rows, idx).unwrap();
        let copied_into = g.input("dst", DType::F32, &[8, 4]).unwrap();
        let view = g.reshape(copied_into, &[32]).unwrap();
        let flat = g.reshape(x, &[32]).unwrap();
        let c = g.cpy(flat, view).unwrap();
        let plain = g.new_tensor(DType::F32, &[4]).unwrap();
        let ro = g.read_only_leaves();
        assert!(ro[x.index()] && ro[idx.index()], "inputs nothing writes");
        assert!(!ro[cache.index()], "SET_ROWS writes the cache");
        assert!(!ro[copied_into.index()], "CPY writes through a view of it");
        for t in [rows, stored, view, flat, c, plain] {
            assert!(!ro[t.index()], "not an input or weight leaf");
        }
    }

    #[test]
    fn reader_counts_and_the_next_computed_node() {
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &[4, 2]).unwrap();
        let b = g.add(a, a).unwrap();
        let v = g.reshape(b, &[8]).unwrap();
        let c = g.scale(v, 2.0).unwrap();
        g.set_output(c);
        let counts = g.reader_counts();
        assert_eq!(counts[a.index()], 2, "read twice by one add");
        assert_eq!(counts[b.index()], 1);
        assert_eq!(counts[c.index()], 1, "an output counts once");
        let nodes: Vec<TensorId> = g.ids().collect();
        assert_eq!(
            g.next_computed(&nodes, 0, 8),
            Some((1, b)),
            "the leaf is passed over"
        );
        assert_eq!(
            g.next_computed(&nodes, 2, 8),
            Some((3, c)),
            "the view is passed over"
        );
        assert_eq!(
            g.next_computed(&nodes, 2, 1),
            None,
            "the window ends at the view"
        );
    }

    #[test]
    fn stamps_change_with_the_graph_and_differ_between_graphs() {
        let mut g = Graph::new();
        let other = Graph::new();
        assert_ne!(g.stamp(), other.stamp());
        let a = g.input("a", DType::F32, &[4]).unwrap();
        let s0 = g.stamp();
        assert_eq!(g.stamp(), s0, "reading changes nothing");
        let _ = g.get(a);
        assert_eq!(g.stamp(), s0);
        let copy = g.clone();
        assert_eq!(copy.stamp(), s0, "a clone is the same state");
        g.set_output(a);
        let s1 = g.stamp();
        assert_ne!(s1, s0);
        g.get_mut(a).flags.input = true;
        assert_ne!(g.stamp(), s1);
        let s2 = g.stamp();
        g.set_name(a, "b");
        assert_ne!(g.stamp(), s2);
        let s3 = g.stamp();
        g.add(a, a).unwrap();
        assert_ne!(g.stamp(), s3);
    }
}
