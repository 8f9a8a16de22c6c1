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
use crate::shard::Sharding;

/// A KV cache on one device.
pub struct KvCache {
    buffer: Arc<dyn Buffer>,
    dtype: DType,
    n_ctx: usize,
    window_cells: Option<usize>,
    /// Byte offset of each layer's K matrix (its V matrix follows it) and its cells.
    layers: Vec<(usize, usize)>,
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
        if !matches!(dtype, DType::F16 | DType::F32) {
            return Err(Error::Invalid(format!(
                "KV cache type must be f16 or f32, not {dtype}"
            )));
        }
        if n_ctx == 0 {
            return Err(Error::Invalid("the context size must be at least 1".into()));
        }
        let window_cells = cfg
            .max_window()
            .map(|w| ((w + n_batch).div_ceil(pad) * pad).min(n_ctx));
        let row = cfg.n_embd_kv() * dtype.type_size();
        let mut layers = Vec::with_capacity(cfg.n_layer);
        let mut size = 0usize;
        for layer in &cfg.layers {
            let cells = match layer.window {
                Some(_) => window_cells.unwrap_or(n_ctx),
                None => n_ctx,
            };
            layers.push((size, cells));
            size = row
                .checked_mul(cells)
                .and_then(|m| m.checked_mul(2))
                .and_then(|m| m.checked_add(size))
                .ok_or(Error::Overflow("KV cache size"))?;
        }
        let buffer = match shard {
            Some(sh) => {
                let matrices: Vec<(usize, usize)> = layers
                    .iter()
                    .flat_map(|&(off, cells)| [(off, cells), (off + row * cells, cells)])
                    .collect();
                sh.alloc_kv(cfg, &matrices, dtype, size)?
            }
            None => device.buffer_type().alloc(size.max(1))?,
        };
        buffer.clear(0)?;
        Ok(KvCache {
            buffer,
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
        let &(offset, cells) = self.layers.get(layer).ok_or_else(|| {
            Error::Invalid(format!(
                "layer {layer} past the cache's {}",
                self.layers.len()
            ))
        })?;
        let id = g.new_tensor(self.dtype, &[n_embd_kv, cells])?;
        g.set_name(id, format!("cache_{}_l{layer}", if v { "v" } else { "k" }));
        let offset = offset + usize::from(v) * n_embd_kv * self.dtype.type_size() * cells;
        g.bind(id, self.buffer.clone(), offset)?;
        Ok(id)
    }
}
