//! The KV cache: for each layer a K and a V matrix of `n_ctx` rows of `n_embd_kv` values,
//! one row per position, written by set_rows and read by attention through views.

use std::sync::Arc;

use tessera_core::{Buffer, DType, Device, Error, Graph, Result, TensorId};

use crate::config::LlamaConfig;
use crate::shard::Sharding;

/// A KV cache on one device.
pub struct KvCache {
    buffer: Arc<dyn Buffer>,
    dtype: DType,
    n_ctx: usize,
    row: usize,
    n_layer: usize,
}

impl KvCache {
    /// Allocates a cache of `n_ctx` positions of `dtype` (F16 or F32) on `device` (on a meta
    /// device, `shard` splits it by KV heads).
    pub fn new(
        cfg: &LlamaConfig,
        device: &dyn Device,
        n_ctx: usize,
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
        let row = cfg.n_embd_kv() * dtype.type_size();
        let size = row
            .checked_mul(n_ctx)
            .and_then(|m| m.checked_mul(2 * cfg.n_layer))
            .ok_or(Error::Overflow("KV cache size"))?;
        let buffer = match shard {
            Some(sh) => sh.alloc_kv(cfg, n_ctx, dtype, size)?,
            None => device.buffer_type().alloc(size.max(1))?,
        };
        buffer.clear(0)?;
        Ok(KvCache {
            buffer,
            dtype,
            n_ctx,
            row,
            n_layer: cfg.n_layer,
        })
    }

    /// Positions the cache holds.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Element type of the cache.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Adds layer `layer`'s K (`v` false) or V matrix to a graph, bound to the cache's memory.
    pub fn tensor(
        &self,
        g: &mut Graph,
        layer: usize,
        v: bool,
        n_embd_kv: usize,
    ) -> Result<TensorId> {
        if layer >= self.n_layer {
            return Err(Error::Invalid(format!(
                "layer {layer} past the cache's {}",
                self.n_layer
            )));
        }
        let id = g.new_tensor(self.dtype, &[n_embd_kv, self.n_ctx])?;
        g.set_name(id, format!("cache_{}_l{layer}", if v { "v" } else { "k" }));
        let offset = (2 * layer + v as usize) * self.row * self.n_ctx;
        g.bind(id, self.buffer.clone(), offset)?;
        Ok(id)
    }
}
