//! The KV cache: for each layer a K and a V matrix of `n_embd_kv` values per cell, written by
//! set_rows and read by attention through views.
//!
//! Global layers hold one cell per position of the context. Layers that attend through a
//! sliding window hold a ring of [`KvCache::window_cells`] cells instead (position p in cell
//! p mod the ring's size): a window of W positions and a batch of B tokens need W + B - 1
//! cells, so the ring is that rounded up to whole padding blocks and never larger than the
//! context's.

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
}

/// Allocates the buffer of one group of layers: `(size, group, [(offset, cells)])`, the K and
/// V matrices of its layers at their byte offsets.
type AllocKv<'a> = dyn FnMut(usize, usize, &[(usize, usize)]) -> Result<Arc<dyn Buffer>> + 'a;

/// The cells of each layer of a cache of `n_ctx` positions for batches of at most `n_batch`
/// tokens, sliding-window layers in rings of whole `pad`-cell blocks; and the ring's cells.
fn layer_cells(
    cfg: &ModelConfig,
    n_ctx: usize,
    n_batch: usize,
    pad: usize,
) -> (Vec<usize>, Option<usize>) {
    let window_cells = cfg
        .max_window()
        .map(|w| ((w + n_batch).div_ceil(pad) * pad).min(n_ctx));
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
            n_batch,
            pad,
            dtype,
            None,
            &mut |size, _, matrices| match shard {
                Some(sh) => sh.alloc_kv(cfg, matrices, dtype, size),
                None => device.buffer_type().alloc(size.max(1)),
            },
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
            n_batch,
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
        let (cells, _) = layer_cells(cfg, n_ctx, n_batch, pad);
        cells.iter().map(|c| 2 * row * c).collect()
    }

    /// The cache with its layers grouped by `part_of` (one buffer per group; all in one
    /// without it), each group's buffer from `alloc(size, group, [(offset, cells)])`, the K
    /// and V matrices of its layers.
    fn build(
        cfg: &ModelConfig,
        n_ctx: usize,
        n_batch: usize,
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
        let (cells, window_cells) = layer_cells(cfg, n_ctx, n_batch, pad);
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
        })
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
