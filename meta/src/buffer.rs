//! Meta buffers. A meta buffer has a virtual byte range that graphs bind tensors into, exactly
//! like a plain buffer, and keeps the bytes in one of two ways:
//!
//! - **Staged** ([`MetaBufferType::alloc`]): host memory, committed only where it is written.
//!   Graph inputs and read-back outputs live here: the meta backend uploads each input's slice
//!   to every part before a run and gathers each output after it. Intermediate results never
//!   touch it: each part computes them in its own compute memory, sized to its slices.
//! - **Sharded** ([`crate::MetaDevice::alloc_sharded`]): the tensors are registered at their
//!   virtual offsets with a split state, and every part holds only its slices, packed, in a
//!   buffer of its own device. Weights and the KV cache live here. `set` and `get` of a whole
//!   registered tensor scatter and gather the slices.

use std::any::Any;
use std::sync::{Arc, Mutex};

use tessera_core::backend::{Buffer, BufferType};
use tessera_core::dtype::DType;
use tessera_core::error::{Error, Result};
use tessera_core::tensor::MAX_DIMS;

use crate::split::{byte_chunks, SplitState};

/// The buffer type of a meta device: staged host memory (see the module documentation).
pub struct MetaBufferType {
    pub(crate) name: String,
    pub(crate) alignment: usize,
    /// The smallest of the parts' largest buffers: a sharded buffer no larger than this fits
    /// every part (a slice is never larger than its tensor).
    pub(crate) max_size: usize,
}

impl BufferType for MetaBufferType {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(MetaBuffer {
            name: self.name.clone(),
            size,
            kind: Kind::Staged(Mutex::new(None)),
        }))
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn max_size(&self) -> usize {
        self.max_size
    }

    fn is_host(&self) -> bool {
        false
    }
}

/// One tensor registered in a sharded buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardedTensor {
    /// Its virtual byte offset (where graphs bind it).
    pub offset: usize,
    /// Element type.
    pub dtype: DType,
    /// Shape of the whole tensor.
    pub ne: [usize; MAX_DIMS],
    /// How it is spread over the parts.
    pub state: SplitState,
}

/// Each part's slice of a registered tensor: its buffer and byte offset.
pub(crate) type Slices = Vec<(Arc<dyn Buffer>, usize)>;

/// A registered tensor and where each part keeps its slice.
pub(crate) struct Placed {
    pub tensor: ShardedTensor,
    /// Byte offset of the slice in each part's buffer.
    pub part_offsets: Vec<usize>,
}

enum Kind {
    /// Host bytes, allocated (zeroed, so untouched pages stay uncommitted) on first use.
    Staged(Mutex<Option<Vec<u8>>>),
    /// One buffer per part holding the registered tensors' slices.
    Sharded {
        parts: Vec<Arc<dyn Buffer>>,
        tensors: Vec<Placed>,
    },
}

/// A buffer of a meta device (see the module documentation).
pub struct MetaBuffer {
    name: String,
    size: usize,
    kind: Kind,
}

impl MetaBuffer {
    /// A sharded buffer over `parts` (one per part device) holding `tensors` at
    /// `part_offsets`; `size` is the virtual size.
    pub(crate) fn sharded(
        name: String,
        size: usize,
        parts: Vec<Arc<dyn Buffer>>,
        mut tensors: Vec<Placed>,
    ) -> MetaBuffer {
        tensors.sort_by_key(|p| p.tensor.offset);
        MetaBuffer {
            name,
            size,
            kind: Kind::Sharded { parts, tensors },
        }
    }

    /// Calls `f` with the host bytes of a staged buffer (created zeroed on first use), locked
    /// for the call; `None` for a sharded buffer.
    pub(crate) fn with_staged_mut<R>(
        &self,
        f: impl FnOnce(&mut [u8]) -> Result<R>,
    ) -> Option<Result<R>> {
        let Kind::Staged(m) = &self.kind else {
            return None;
        };
        Some(match m.lock() {
            Ok(mut g) => f(g.get_or_insert_with(|| vec![0u8; self.size])),
            Err(_) => Err(poisoned(&self.name)),
        })
    }

    /// Whether the buffer holds registered tensors sliced over the parts.
    pub fn is_sharded(&self) -> bool {
        matches!(self.kind, Kind::Sharded { .. })
    }

    /// The part buffers of a sharded buffer (empty for a staged one).
    pub fn part_buffers(&self) -> &[Arc<dyn Buffer>] {
        match &self.kind {
            Kind::Sharded { parts, .. } => parts,
            Kind::Staged(_) => &[],
        }
    }

    /// The tensor registered at `offset`, with each part's slice (buffer and byte offset).
    pub(crate) fn registered(&self, offset: usize) -> Option<(&ShardedTensor, Slices)> {
        let Kind::Sharded { parts, tensors } = &self.kind else {
            return None;
        };
        let i = tensors
            .binary_search_by_key(&offset, |p| p.tensor.offset)
            .ok()?;
        let p = &tensors[i];
        Some((
            &p.tensor,
            parts
                .iter()
                .cloned()
                .zip(p.part_offsets.iter().copied())
                .collect(),
        ))
    }

    fn sharded_access(&self, offset: usize, len: usize) -> Result<(&Placed, &[Arc<dyn Buffer>])> {
        let Kind::Sharded { parts, tensors } = &self.kind else {
            return Err(self.range_error(offset, len));
        };
        let found = tensors
            .binary_search_by_key(&offset, |p| p.tensor.offset)
            .ok()
            .map(|i| &tensors[i]);
        match found {
            Some(p) if nbytes(&p.tensor) == len => Ok((p, parts)),
            _ => Err(Error::Buffer {
                buffer: self.name(),
                reason: format!("bytes {offset}..{} are not one whole registered tensor (a sharded buffer moves whole tensors)", offset + len),
            }),
        }
    }
}

/// Bytes of a registered tensor (contiguous).
fn nbytes(t: &ShardedTensor) -> usize {
    let row = t.ne[0] / t.dtype.block_size() * t.dtype.type_size();
    row * t.ne[1] * t.ne[2] * t.ne[3]
}

/// Part `j`'s bytes of a registered tensor, cut from the whole tensor's bytes.
pub(crate) fn slice_of(
    dtype: DType,
    ne: [usize; MAX_DIMS],
    state: &SplitState,
    j: usize,
    full: &[u8],
) -> Vec<u8> {
    match state {
        SplitState::Split(x) => {
            let chunks = byte_chunks(dtype, ne, x, j);
            let mut out = Vec::with_capacity(chunks.iter().map(|c| c.2).sum());
            for (f, _, len) in chunks {
                out.extend_from_slice(&full[f..f + len]);
            }
            out
        }
        _ => full.to_vec(),
    }
}

/// Writes part `j`'s bytes `part` of a split tensor into the whole tensor's bytes.
pub(crate) fn place_slice(
    dtype: DType,
    ne: [usize; MAX_DIMS],
    state: &SplitState,
    j: usize,
    part: &[u8],
    full: &mut [u8],
) {
    if let SplitState::Split(x) = state {
        for (f, p, len) in byte_chunks(dtype, ne, x, j) {
            full[f..f + len].copy_from_slice(&part[p..p + len]);
        }
    }
}

impl Buffer for MetaBuffer {
    fn name(&self) -> String {
        match self.kind {
            Kind::Staged(_) => format!("{} (staged)", self.name),
            Kind::Sharded { .. } => format!("{} (sharded)", self.name),
        }
    }

    fn size(&self) -> usize {
        self.size
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        match &self.kind {
            Kind::Staged(m) => {
                let mut g = m.lock().map_err(|_| poisoned(&self.name))?;
                let bytes = g.get_or_insert_with(|| vec![0u8; self.size]);
                bytes[offset..offset + data.len()].copy_from_slice(data);
                Ok(())
            }
            Kind::Sharded { .. } => {
                let (p, parts) = self.sharded_access(offset, data.len())?;
                let t = &p.tensor;
                for (j, buf) in parts.iter().enumerate() {
                    let part = slice_of(t.dtype, t.ne, &t.state, j, data);
                    if !part.is_empty() {
                        buf.set(p.part_offsets[j], &part)?;
                    }
                }
                Ok(())
            }
        }
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        match &self.kind {
            Kind::Staged(m) => {
                let g = m.lock().map_err(|_| poisoned(&self.name))?;
                match g.as_ref() {
                    Some(bytes) => out.copy_from_slice(&bytes[offset..offset + out.len()]),
                    None => out.fill(0),
                }
                Ok(())
            }
            Kind::Sharded { .. } => {
                let (p, parts) = self.sharded_access(offset, out.len())?;
                let t = &p.tensor;
                match &t.state {
                    SplitState::Split(x) => {
                        for (j, buf) in parts.iter().enumerate() {
                            let len = slice_len(t, x.part_len(j));
                            if len == 0 {
                                continue;
                            }
                            let mut part = vec![0u8; len];
                            buf.get(p.part_offsets[j], &mut part)?;
                            place_slice(t.dtype, t.ne, &t.state, j, &part, out);
                        }
                        Ok(())
                    }
                    SplitState::Mirrored => match parts.first() {
                        Some(b) => b.get(p.part_offsets[0], out),
                        None => Err(self.range_error(offset, out.len())),
                    },
                    SplitState::Partial => {
                        let mut sum = vec![0f32; out.len() / 4];
                        let mut part = vec![0u8; out.len()];
                        for (j, buf) in parts.iter().enumerate() {
                            buf.get(p.part_offsets[j], &mut part)?;
                            for (s, c) in sum.iter_mut().zip(part.chunks_exact(4)) {
                                *s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                            }
                        }
                        for (o, s) in out.chunks_exact_mut(4).zip(&sum) {
                            o.copy_from_slice(&s.to_le_bytes());
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    fn clear(&self, value: u8) -> Result<()> {
        match &self.kind {
            Kind::Staged(m) => {
                let mut g = m.lock().map_err(|_| poisoned(&self.name))?;
                match g.as_mut() {
                    Some(bytes) => bytes.fill(value),
                    None if value == 0 => {}
                    None => *g = Some(vec![value; self.size]),
                }
                Ok(())
            }
            Kind::Sharded { parts, .. } => parts.iter().try_for_each(|p| p.clear(value)),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bytes of a slice of `t` holding `len` elements along its split axis.
fn slice_len(t: &ShardedTensor, len: usize) -> usize {
    let mut ne = t.ne;
    if let SplitState::Split(x) = &t.state {
        ne[x.axis] = len;
    }
    nbytes(&ShardedTensor { ne, ..t.clone() })
}

fn poisoned(name: &str) -> Error {
    Error::Buffer {
        buffer: name.to_string(),
        reason: "a thread panicked while writing it".into(),
    }
}
