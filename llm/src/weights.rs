//! A model's weights on a device: mapped without copying where the device reads host memory
//! (the CPU), uploaded tensor by tensor otherwise.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_core::backend::HostBytes;
use tessera_core::gguf::GgufFile;
use tessera_core::{Buffer, DType, Device, Error, Result};

use crate::shard::{LayerSplit, Sharding};

/// One weight tensor: where it lives and what it is.
#[derive(Clone)]
pub struct WeightTensor {
    /// The buffer holding it.
    pub buffer: Arc<dyn Buffer>,
    /// Byte offset in the buffer.
    pub offset: usize,
    /// Element type.
    pub dtype: DType,
    /// Shape (ggml order).
    pub ne: [usize; 4],
}

/// Every tensor of a GGUF file, on one device.
pub struct Weights {
    map: HashMap<String, WeightTensor>,
    bytes: usize,
    mapped: bool,
}

impl Weights {
    /// Puts the file's tensors on `device`; `progress(done, total)` is called as bytes upload.
    pub fn load(
        file: &GgufFile,
        device: &dyn Device,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        Self::load_with(file, device, None, &[], progress)
    }

    /// As [`Weights::load`]; on a meta device, `shard` puts each part's slices on that part.
    /// `segments` lists fused tensors (by the suffix after `blk.N.`) that are read as their row
    /// segments, each a tensor of its own (see [`crate::ModelConfig::fused_segments`]).
    pub fn load_with(
        file: &GgufFile,
        device: &dyn Device,
        shard: Option<&Sharding>,
        segments: &[(&str, Vec<(&str, usize)>)],
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let total: u64 = file.tensors.iter().map(|t| t.size).sum();
        let specs = tensor_specs(file, segments)?;
        let mut w = Weights {
            map: HashMap::new(),
            bytes: total as usize,
            mapped: true,
        };
        let mut done = 0u64;
        w.place(file, specs, device, shard, &mut |n| {
            done += n;
            progress(done, total)
        })?;
        Ok(w)
    }

    /// As [`Weights::load_with`], each tensor on the part of `split` that holds it.
    pub fn load_split(
        file: &GgufFile,
        split: &LayerSplit,
        segments: &[(&str, Vec<(&str, usize)>)],
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let total: u64 = file.tensors.iter().map(|t| t.size).sum();
        let mut by_part: Vec<Vec<TensorSpec>> = split.parts().iter().map(|_| Vec::new()).collect();
        for t in tensor_specs(file, segments)? {
            by_part[split.part_of_weight(&t.name)].push(t);
        }
        let mut w = Weights {
            map: HashMap::new(),
            bytes: total as usize,
            mapped: true,
        };
        let mut done = 0u64;
        for (j, specs) in by_part.into_iter().enumerate() {
            if specs.is_empty() {
                continue;
            }
            let dev = split.parts()[j].as_ref();
            w.place(file, specs, dev, split.sharding(j), &mut |n| {
                done += n;
                progress(done, total)
            })?;
        }
        Ok(w)
    }

    /// Puts tensors `specs` of `file` on `device` (split by `shard` on a meta device): the
    /// mapped file itself where the device reads host memory, uploads otherwise;
    /// `placed(bytes)` reports each tensor (or all at once when mapped).
    fn place(
        &mut self,
        file: &GgufFile,
        specs: Vec<TensorSpec>,
        device: &dyn Device,
        shard: Option<&Sharding>,
        placed: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let data_offset = file.data_offset as usize;
        let host: Arc<dyn HostBytes> = Arc::new(file.mapping());
        if let Some(buf) = device.buffer_from_host(host)? {
            let bytes: u64 = specs.iter().map(|t| t.size as u64).sum();
            for t in specs {
                self.map.insert(
                    t.name,
                    WeightTensor {
                        buffer: buf.clone(),
                        offset: data_offset + t.offset,
                        dtype: t.dtype,
                        ne: t.ne,
                    },
                );
            }
            placed(bytes);
            return Ok(());
        }
        self.mapped = false;
        let bt = device.buffer_type();
        let align = bt.alignment().max(1);
        let max = bt.max_size();
        // Greedy packing into buffers no larger than the type allows.
        let mut groups: Vec<(usize, Vec<(usize, usize)>)> = Vec::new(); // (size, [(spec index, offset)])
        for (i, t) in specs.iter().enumerate() {
            let size = t.size;
            if size > max {
                return Err(Error::Model(format!(
                    "tensor '{}' ({size} bytes) exceeds the largest buffer of {} ({max} bytes)",
                    t.name,
                    device.name()
                )));
            }
            let fits = groups
                .last()
                .map(|g| g.0.div_ceil(align) * align + size <= max)
                .unwrap_or(false);
            if !fits {
                groups.push((0, Vec::new()));
            }
            let g = groups.last_mut().expect("pushed above");
            let off = g.0.div_ceil(align) * align;
            g.1.push((i, off));
            g.0 = off + size;
        }
        let bytes = file.bytes();
        for (size, members) in groups {
            let buf = match shard {
                Some(sh) => {
                    let list: Vec<_> = members
                        .iter()
                        .map(|&(i, off)| {
                            let t = &specs[i];
                            (t.name.as_str(), t.dtype, t.ne, off)
                        })
                        .collect();
                    sh.alloc_weights(size, &list)?
                }
                None => bt.alloc(size.max(1))?,
            };
            for (i, off) in members {
                let t = &specs[i];
                let start = data_offset + t.offset;
                buf.set(off, &bytes[start..start + t.size])?;
                placed(t.size as u64);
                self.map.insert(
                    t.name.clone(),
                    WeightTensor {
                        buffer: buf.clone(),
                        offset: off,
                        dtype: t.dtype,
                        ne: t.ne,
                    },
                );
            }
        }
        Ok(())
    }

    /// A tensor by name; an error naming it when the file lacks it.
    pub fn get(&self, name: &str) -> Result<&WeightTensor> {
        self.map
            .get(name)
            .ok_or_else(|| Error::Model(format!("the model has no tensor '{name}'")))
    }

    /// A tensor by name, if present.
    pub fn find(&self, name: &str) -> Option<&WeightTensor> {
        self.map.get(name)
    }

    /// A tensor by name, checked to have the shape the metadata implies.
    pub fn expect(&self, name: &str, ne: &[usize]) -> Result<&WeightTensor> {
        let w = self.get(name)?;
        let mut want = [1usize; 4];
        want[..ne.len()].copy_from_slice(ne);
        if w.ne != want {
            return Err(Error::Model(format!(
                "tensor '{name}' has shape {:?}, but the metadata implies {:?}",
                w.ne, want
            )));
        }
        Ok(w)
    }

    /// The names of the tensors (fused tensors by their segments' names).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|k| k.as_str())
    }

    /// Total bytes of weights.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the weights are the mapped file itself (no copy) on every device.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }
}

/// One tensor to place: a file tensor, or a row segment of a fused one.
struct TensorSpec {
    name: String,
    dtype: DType,
    ne: [usize; 4],
    /// Byte offset in the file's tensor data.
    offset: usize,
    size: usize,
}

/// The file's tensors, with each fused tensor of `segments` replaced by its row segments.
fn tensor_specs(
    file: &GgufFile,
    segments: &[(&str, Vec<(&str, usize)>)],
) -> Result<Vec<TensorSpec>> {
    let mut out = Vec::with_capacity(file.tensors.len());
    for t in &file.tensors {
        let ne = ne_usize(&t.ne);
        let fused = t.name.strip_prefix("blk.").and_then(|r| {
            let (layer, kind) = r.split_once('.')?;
            let parts = segments.iter().find(|(k, _)| *k == kind).map(|(_, p)| p)?;
            Some((layer, parts))
        });
        let Some((layer, parts)) = fused else {
            out.push(TensorSpec {
                name: t.name.clone(),
                dtype: t.dtype,
                ne,
                offset: t.offset as usize,
                size: t.size as usize,
            });
            continue;
        };
        let rows: usize = parts.iter().map(|p| p.1).sum();
        if ne[1] != rows || ne[2] != 1 || ne[3] != 1 {
            return Err(Error::Model(format!(
                "tensor '{}' has shape {ne:?}, but its segments need {rows} rows",
                t.name
            )));
        }
        let row_bytes = t.size as usize / rows;
        let mut start = 0;
        for &(kind, n) in parts {
            out.push(TensorSpec {
                name: format!("blk.{layer}.{kind}"),
                dtype: t.dtype,
                ne: [ne[0], n, 1, 1],
                offset: t.offset as usize + start * row_bytes,
                size: n * row_bytes,
            });
            start += n;
        }
    }
    Ok(out)
}

fn ne_usize(ne: &[u64; 4]) -> [usize; 4] {
    [
        ne[0] as usize,
        ne[1] as usize,
        ne[2] as usize,
        ne[3] as usize,
    ]
}
