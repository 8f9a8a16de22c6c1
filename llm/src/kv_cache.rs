//! The KV cache: for each layer a K and a V matrix of `n_embd_kv` values per cell, written by
//! set_rows and read by attention through views.
//!
//! Global layers hold one cell per position of the context. Layers that attend through a
//! sliding window hold a ring of [`KvCache::window_cells`] cells instead (position p in cell
//! p mod the ring's size): a window of W positions and a batch of B tokens need W + B - 1
//! cells, so the ring is that rounded up to whole padding blocks and never larger than the
//! context's.
//!
//! A cache shared by many sequences ([`KvCache::new_shared`], [`Cells`]) is one pool of cells:
//! each cell holds one position of one or more sequences (a shared prefix is the same cells
//! listed under several sequences), and a step's mask lets each token see only its own
//! sequence's cells. Sliding-window layers then hold every cell too (a ring per sequence would
//! not be one matrix), and the mask applies the window.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_core::{Buffer, DType, Device, Error, Graph, Result, TensorId};

use crate::config::ModelConfig;
use crate::shard::{LayerSplit, Sharding};

/// A KV cache on one device, or on the parts of a layer split.
pub struct KvCache {
    /// One buffer, or one per part of a layer split.
    buffers: Vec<Arc<dyn Buffer>>,
    dtype: DType,
    n_ctx: usize,
    window_cells: Option<usize>,
    /// Each layer's buffer, the byte offset of its K matrix (its V matrix follows it) and its
    /// cells.
    layers: Vec<(usize, usize, usize)>,
    /// Bytes of one cell's row of one matrix.
    row: usize,
}

/// Allocates the buffer of one group of layers: `(size, group, [(offset, cells)])`, the K and
/// V matrices of its layers at their byte offsets.
type AllocKv<'a> = dyn FnMut(usize, usize, &[(usize, usize)]) -> Result<Arc<dyn Buffer>> + 'a;

/// The cells of each layer of a cache of `n_ctx` positions: with `ring_batch` (batches of at
/// most that many tokens), sliding-window layers in rings of whole `pad`-cell blocks; without
/// it (a cache shared by many sequences), every cell in every layer. And the rings' cells.
fn layer_cells(
    cfg: &ModelConfig,
    n_ctx: usize,
    ring_batch: Option<usize>,
    pad: usize,
) -> (Vec<usize>, Option<usize>) {
    let window_cells = cfg.max_window().map(|w| match ring_batch {
        Some(n_batch) => ((w + n_batch).div_ceil(pad) * pad).min(n_ctx),
        None => n_ctx,
    });
    let cells = cfg
        .layers
        .iter()
        .map(|layer| match layer.window {
            Some(_) => window_cells.unwrap_or(n_ctx),
            None => n_ctx,
        })
        .collect();
    (cells, window_cells)
}

impl KvCache {
    /// Allocates a cache of `n_ctx` positions of `dtype` (F16 or F32) on `device` for batches
    /// of at most `n_batch` tokens; sliding-window layers get rings of whole `pad`-cell blocks
    /// (on a meta device, `shard` splits it by KV heads).
    pub fn new(
        cfg: &ModelConfig,
        device: &dyn Device,
        n_ctx: usize,
        n_batch: usize,
        pad: usize,
        dtype: DType,
        shard: Option<&Sharding>,
    ) -> Result<Self> {
        KvCache::build(
            cfg,
            n_ctx,
            Some(n_batch),
            pad,
            dtype,
            None,
            &mut |size, _, matrices| match shard {
                Some(sh) => sh.alloc_kv(cfg, matrices, dtype, size),
                None => device.buffer_type().alloc(size.max(1)),
            },
        )
    }

    /// Allocates a cache of `n_cells` cells shared by many sequences (see [`Cells`]):
    /// sliding-window layers hold every cell as the global ones do.
    pub fn new_shared(
        cfg: &ModelConfig,
        device: &dyn Device,
        n_cells: usize,
        dtype: DType,
        shard: Option<&Sharding>,
    ) -> Result<Self> {
        KvCache::build(
            cfg,
            n_cells,
            None,
            1,
            dtype,
            None,
            &mut |size, _, matrices| match shard {
                Some(sh) => sh.alloc_kv(cfg, matrices, dtype, size),
                None => device.buffer_type().alloc(size.max(1)),
            },
        )
    }

    /// As [`KvCache::new_shared`], each layer's K and V on the part of `split` that holds the
    /// layer.
    pub fn new_shared_split(
        cfg: &ModelConfig,
        split: &LayerSplit,
        n_cells: usize,
        dtype: DType,
    ) -> Result<Self> {
        let part_of = |l: usize| split.layer_part(l);
        KvCache::build(
            cfg,
            n_cells,
            None,
            1,
            dtype,
            Some(&part_of),
            &mut |size, part, matrices| split.alloc_kv(part, cfg, matrices, dtype, size),
        )
    }

    /// As [`KvCache::new`], each layer's K and V on the part of `split` that holds the layer.
    pub fn new_split(
        cfg: &ModelConfig,
        split: &LayerSplit,
        n_ctx: usize,
        n_batch: usize,
        pad: usize,
        dtype: DType,
    ) -> Result<Self> {
        let part_of = |l: usize| split.layer_part(l);
        KvCache::build(
            cfg,
            n_ctx,
            Some(n_batch),
            pad,
            dtype,
            Some(&part_of),
            &mut |size, part, matrices| split.alloc_kv(part, cfg, matrices, dtype, size),
        )
    }

    /// Bytes of each layer's K and V for a cache of these settings (see [`KvCache::new`]).
    pub fn layer_bytes(
        cfg: &ModelConfig,
        n_ctx: usize,
        n_batch: usize,
        pad: usize,
        dtype: DType,
    ) -> Vec<usize> {
        let row = cfg.n_embd_kv() * dtype.type_size();
        let (cells, _) = layer_cells(cfg, n_ctx, Some(n_batch), pad);
        cells.iter().map(|c| 2 * row * c).collect()
    }

    /// The cache with its layers grouped by `part_of` (one buffer per group; all in one
    /// without it), each group's buffer from `alloc(size, group, [(offset, cells)])`, the K
    /// and V matrices of its layers.
    fn build(
        cfg: &ModelConfig,
        n_ctx: usize,
        ring_batch: Option<usize>,
        pad: usize,
        dtype: DType,
        part_of: Option<&dyn Fn(usize) -> usize>,
        alloc: &mut AllocKv<'_>,
    ) -> Result<Self> {
        if !matches!(dtype, DType::F16 | DType::F32) {
            return Err(Error::Invalid(format!(
                "KV cache type must be f16 or f32, not {dtype}"
            )));
        }
        if n_ctx == 0 {
            return Err(Error::Invalid("the context size must be at least 1".into()));
        }
        let (cells, window_cells) = layer_cells(cfg, n_ctx, ring_batch, pad);
        let row = cfg.n_embd_kv() * dtype.type_size();
        let group = |l: usize| part_of.map_or(0, |f| f(l));
        let mut groups: Vec<usize> = (0..cells.len()).map(group).collect();
        groups.sort_unstable();
        groups.dedup();
        let mut layers = vec![(0, 0, 0); cells.len()];
        let mut buffers = Vec::with_capacity(groups.len());
        for (b, &g) in groups.iter().enumerate() {
            let mut size = 0usize;
            let mut matrices = Vec::new();
            for (l, &c) in cells.iter().enumerate().filter(|&(l, _)| group(l) == g) {
                layers[l] = (b, size, c);
                let m = row.checked_mul(c).ok_or(Error::Overflow("KV cache size"))?;
                matrices.push((size, c));
                matrices.push((size + m, c));
                size = m
                    .checked_mul(2)
                    .and_then(|m| m.checked_add(size))
                    .ok_or(Error::Overflow("KV cache size"))?;
            }
            let buffer = alloc(size, g, &matrices)?;
            buffer.clear(0)?;
            buffers.push(buffer);
        }
        Ok(KvCache {
            buffers,
            dtype,
            n_ctx,
            window_cells,
            layers,
            row,
        })
    }

    /// Bytes of one cell over every layer's K and V.
    pub fn cell_bytes(&self) -> usize {
        2 * self.row * self.layers.len()
    }

    /// Appends cell `cell`'s K and V rows of every layer to `out` ([`KvCache::cell_bytes`]
    /// bytes; only for a cache whose layers all hold that cell).
    pub fn read_cell(&self, cell: usize, out: &mut Vec<u8>) -> Result<()> {
        for &(buffer, off, cells) in &self.layers {
            self.check_cell(cell, cells)?;
            for m in 0..2 {
                let at = off + m * self.row * cells + cell * self.row;
                let start = out.len();
                out.resize(start + self.row, 0);
                self.buffers[buffer].get(at, &mut out[start..])?;
            }
        }
        Ok(())
    }

    /// Writes cell `cell`'s K and V rows of every layer from `bytes` (as
    /// [`KvCache::read_cell`] gave them).
    pub fn write_cell(&self, cell: usize, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.cell_bytes() {
            return Err(Error::Invalid(format!(
                "a cell holds {} bytes, not {}",
                self.cell_bytes(),
                bytes.len()
            )));
        }
        let mut rows = bytes.chunks(self.row);
        for &(buffer, off, cells) in &self.layers {
            self.check_cell(cell, cells)?;
            for m in 0..2 {
                let at = off + m * self.row * cells + cell * self.row;
                self.buffers[buffer].set(at, rows.next().unwrap_or_default())?;
            }
        }
        Ok(())
    }

    fn check_cell(&self, cell: usize, cells: usize) -> Result<()> {
        if cell >= cells {
            return Err(Error::Invalid(format!(
                "cell {cell} past a layer's {cells} cells"
            )));
        }
        Ok(())
    }

    /// Cells of each global layer (the positions the context holds, padded).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Cells of the ring of each sliding-window layer (None when the model has none).
    pub fn window_cells(&self) -> Option<usize> {
        self.window_cells
    }

    /// Element type of the cache.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Adds layer `layer`'s K (`v` false) or V matrix `[n_embd_kv, cells]` to a graph, bound to
    /// the cache's memory.
    pub fn tensor(
        &self,
        g: &mut Graph,
        layer: usize,
        v: bool,
        n_embd_kv: usize,
    ) -> Result<TensorId> {
        let &(buffer, offset, cells) = self.layers.get(layer).ok_or_else(|| {
            Error::Invalid(format!(
                "layer {layer} past the cache's {}",
                self.layers.len()
            ))
        })?;
        let id = g.new_tensor(self.dtype, &[n_embd_kv, cells])?;
        g.set_name(id, format!("cache_{}_l{layer}", if v { "v" } else { "k" }));
        let offset = offset + usize::from(v) * n_embd_kv * self.dtype.type_size() * cells;
        g.bind(id, self.buffers[buffer].clone(), offset)?;
        Ok(id)
    }
}

/// A sequence's id in a cache shared by many.
pub type SeqId = u32;

/// Which sequences hold each cell of a shared cache, and at which position.
///
/// The cells are handed to sequences in pages of [`Cells::page`] consecutive cells: a sequence
/// takes a free cell of a page it was handed, else the lowest wholly free page becomes its own,
/// else (every page handed out) the lowest free cell anywhere. So while pages last, every cell
/// of a page belongs to one sequence (and the sequences that share its prefix), and a step's
/// mask hides whole pages from every token of the other sequences: attention kernels skip the
/// key tiles their rows' mask hides entirely, so a token's attention costs its own sequence's
/// pages, not every cell in use. Pages are handed out lowest first, so the cells a step attends
/// (up to the highest one in use) stay few. A page whose cells are all freed goes back.
#[derive(Clone, Debug)]
pub struct Cells {
    /// Per cell: its position and the sequences that hold it (empty: free).
    cells: Vec<(u32, Vec<SeqId>)>,
    /// Cells no sequence holds.
    n_free: usize,
    /// Cells per page.
    page: usize,
    /// Per page: the sequence it is handed to (None: free for the next sequence that needs one)
    /// and how many of its cells are held.
    pages: Vec<(Option<SeqId>, usize)>,
    /// Per sequence: positions held (0..len, each in one cell).
    lens: BTreeMap<SeqId, usize>,
    next_id: SeqId,
}

impl Cells {
    /// `n` free cells handed out one at a time, lowest first (pages of one cell), no sequence.
    pub fn new(n: usize) -> Self {
        Cells::with_pages(n, 1)
    }

    /// `n` free cells handed to sequences in pages of `page` cells (the last page may be
    /// shorter; `page` 0 counts as 1), no sequence.
    pub fn with_pages(n: usize, page: usize) -> Self {
        let page = page.max(1);
        Cells {
            cells: vec![(0, Vec::new()); n],
            n_free: n,
            page,
            pages: vec![(None, 0); n.div_ceil(page)],
            lens: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// Cells in all.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether there are no cells at all.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Cells per page.
    pub fn page(&self) -> usize {
        self.page
    }

    /// The sequence page `p` is handed to (None: free, or its sequence was removed while
    /// others still hold some of its cells).
    pub fn page_owner(&self, p: usize) -> Option<SeqId> {
        self.pages.get(p).and_then(|x| x.0)
    }

    /// Cells no sequence holds.
    pub fn n_free(&self) -> usize {
        self.n_free
    }

    /// One past the highest cell in use (0 when none is).
    pub fn used_end(&self) -> usize {
        self.cells
            .iter()
            .rposition(|c| !c.1.is_empty())
            .map_or(0, |i| i + 1)
    }

    /// A new, empty sequence.
    pub fn add_seq(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.lens.insert(id, 0);
        id
    }

    /// The sequences that exist.
    pub fn seqs(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.lens.keys().copied()
    }

    /// Positions sequence `seq` holds.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        self.lens
            .get(&seq)
            .copied()
            .ok_or_else(|| Error::Invalid(format!("no sequence {seq}")))
    }

    /// Forgets sequence `seq` and frees the cells only it held; the pages it was handed that
    /// other sequences still hold cells of (a shared prefix) are no longer its own.
    pub fn remove_seq(&mut self, seq: SeqId) -> Result<()> {
        self.truncate(seq, 0)?;
        self.lens.remove(&seq);
        for p in &mut self.pages {
            if p.0 == Some(seq) {
                p.0 = None;
            }
        }
        Ok(())
    }

    /// Keeps the first `n` positions of `seq` (no-op when it holds fewer).
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let len = self.seq_len(seq)?;
        for (i, (pos, seqs)) in self.cells.iter_mut().enumerate() {
            if *pos as usize >= n && !seqs.is_empty() {
                seqs.retain(|&s| s != seq);
                if seqs.is_empty() {
                    self.n_free += 1;
                    let page = &mut self.pages[i / self.page];
                    page.1 -= 1;
                    if page.1 == 0 {
                        page.0 = None;
                    }
                }
            }
        }
        self.lens.insert(seq, len.min(n));
        Ok(())
    }

    /// Makes `dst` hold `src`'s first `n` positions (the same cells: nothing is copied); `dst`'s
    /// own positions are dropped first. `dst`'s later positions go to pages of its own.
    pub fn copy_prefix(&mut self, src: SeqId, dst: SeqId, n: usize) -> Result<()> {
        let n = n.min(self.seq_len(src)?);
        self.truncate(dst, 0)?;
        for (pos, seqs) in &mut self.cells {
            if seqs.contains(&src) && (*pos as usize) < n {
                seqs.push(dst);
            }
        }
        self.lens.insert(dst, n);
        Ok(())
    }

    /// The cells of page `p`.
    fn page_cells(&self, p: usize) -> std::ops::Range<usize> {
        p * self.page..((p + 1) * self.page).min(self.cells.len())
    }

    /// The lowest free cell of `range`.
    fn free_in(&self, range: std::ops::Range<usize>) -> Option<usize> {
        let start = range.start;
        self.cells[range]
            .iter()
            .position(|c| c.1.is_empty())
            .map(|i| i + start)
    }

    /// Takes a free cell for position `len` of `seq` (which grows by one); returns the cell.
    pub fn push(&mut self, seq: SeqId) -> Result<usize> {
        let len = self.seq_len(seq)?;
        let own = (0..self.pages.len())
            .find(|&p| self.pages[p].0 == Some(seq) && self.pages[p].1 < self.page_cells(p).len());
        let cell = match own {
            Some(p) => self.free_in(self.page_cells(p)),
            None => match self.pages.iter().position(|p| *p == (None, 0)) {
                Some(p) => {
                    self.pages[p].0 = Some(seq);
                    Some(self.page_cells(p).start)
                }
                None => self.free_in(0..self.cells.len()),
            },
        }
        .ok_or_else(|| {
            Error::Invalid(format!(
                "the KV cache's {} cells are all in use",
                self.cells.len()
            ))
        })?;
        self.cells[cell] = (len as u32, vec![seq]);
        self.n_free -= 1;
        self.pages[cell / self.page].1 += 1;
        self.lens.insert(seq, len + 1);
        Ok(cell)
    }

    /// The cells of `seq` in position order.
    pub fn cells_of(&self, seq: SeqId) -> Vec<usize> {
        let mut v: Vec<(u32, usize)> = self
            .cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.1.contains(&seq))
            .map(|(i, c)| (c.0, i))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, i)| i).collect()
    }

    /// Appends the mask row of a token of `seq` at position `p` over the first `n_kv` cells: 0
    /// where it may attend (a cell of `seq` at a position not after `p`, and fewer than `window`
    /// positions behind when given), -inf elsewhere.
    pub fn mask_row(
        &self,
        seq: SeqId,
        p: usize,
        window: Option<usize>,
        n_kv: usize,
        out: &mut Vec<half::f16>,
    ) {
        self.mask_rows(&[(seq, p)], window, n_kv, out);
    }

    /// Appends the mask rows ([`Cells::mask_row`]) of the tokens `rows` (each its sequence and
    /// position), in one pass over the cells.
    pub fn mask_rows(
        &self,
        rows: &[(SeqId, usize)],
        window: Option<usize>,
        n_kv: usize,
        out: &mut Vec<half::f16>,
    ) {
        let start = out.len();
        out.resize(start + rows.len() * n_kv, half::f16::NEG_INFINITY);
        let mask = &mut out[start..];
        // The rows of each sequence of the step.
        let mut of_seq: BTreeMap<SeqId, Vec<usize>> = BTreeMap::new();
        for (i, &(s, _)) in rows.iter().enumerate() {
            of_seq.entry(s).or_default().push(i);
        }
        for (c, (pos, seqs)) in self.cells[..n_kv].iter().enumerate() {
            let q = *pos as usize;
            for s in seqs {
                for &i in of_seq.get(s).map_or(&[][..], Vec::as_slice) {
                    let p = rows[i].1;
                    if q <= p && window.is_none_or(|w| p - q < w) {
                        mask[i * n_kv + c] = half::f16::ZERO;
                    }
                }
            }
        }
    }
}
