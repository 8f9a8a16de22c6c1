//! Tensors: a type, a shape `ne` and byte strides `nb` (ggml's words), how the tensor is made
//! (an op and its sources, or a view of another tensor), and where its bytes live.

use std::sync::Arc;

use crate::backend::Buffer;
use crate::dtype::DType;
use crate::op::Op;

/// Most dimensions a tensor has.
pub const MAX_DIMS: usize = 4;

/// A tensor's index in its [`crate::Graph`]'s arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a tensor is for, beyond being computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorFlags {
    /// Set from outside before each run.
    pub input: bool,
    /// Read back after a run: its memory is never reused within the graph.
    pub output: bool,
    /// A model parameter: it lives in a weight buffer.
    pub weight: bool,
}

/// Where a tensor's bytes are: a buffer and a byte offset in it.
#[derive(Clone)]
pub struct TensorData {
    /// The buffer holding the bytes.
    pub buffer: Arc<dyn Buffer>,
    /// Byte offset of element 0 in the buffer.
    pub offset: usize,
}

impl std::fmt::Debug for TensorData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.buffer.name(), self.offset)
    }
}

/// One node of a graph.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Elements along each axis; `ne[0]` is the contiguous one.
    pub ne: [usize; MAX_DIMS],
    /// Byte stride of each axis (`nb[0]` is the block or element size for contiguous rows).
    pub nb: [usize; MAX_DIMS],
    /// How the tensor is computed.
    pub op: Op,
    /// The op's sources, in ggml's order.
    pub src: Vec<TensorId>,
    /// For views and in-place results: the tensor whose memory this one uses (a root, never
    /// itself a view).
    pub view_src: Option<TensorId>,
    /// Byte offset into `view_src`'s memory.
    pub view_offset: usize,
    /// Name, for errors and lookups; may be empty.
    pub name: String,
    /// Input, output, weight.
    pub flags: TensorFlags,
    /// Where the bytes live, once bound or allocated (views resolve through `view_src`).
    pub data: Option<TensorData>,
}

impl Tensor {
    /// Contiguous strides for a type and shape (`ne[0]` a whole number of blocks).
    pub fn contiguous_strides(dtype: DType, ne: [usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
        let mut nb = [0; MAX_DIMS];
        nb[0] = dtype.type_size();
        nb[1] = nb[0] * (ne[0] / dtype.block_size());
        nb[2] = nb[1] * ne[1];
        nb[3] = nb[2] * ne[2];
        nb
    }

    /// Number of elements.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Number of rows (elements / `ne[0]`).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one contiguous row.
    pub fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.type_size()
    }

    /// The span of bytes the tensor touches from its first element (0 when empty).
    pub fn nbytes(&self) -> usize {
        if self.ne.contains(&0) {
            return 0;
        }
        let bs = self.dtype.block_size();
        // Rows of blocks span whole blocks; a plain type's axis 0 may be strided (transposed),
        // so its span is one element plus the strides of the rest, as in ggml.
        let mut n = if bs == 1 {
            self.dtype.type_size() + (self.ne[0] - 1) * self.nb[0]
        } else {
            self.ne[0] / bs * self.nb[0]
        };
        for i in 1..MAX_DIMS {
            n += (self.ne[i] - 1) * self.nb[i];
        }
        n
    }

    /// Whether the elements are laid out densely in the usual order.
    pub fn is_contiguous(&self) -> bool {
        self.nb == Tensor::contiguous_strides(self.dtype, self.ne)
            || self.ne.iter().product::<usize>() == 0
            || self.dense_ignoring_unit_dims()
    }

    fn dense_ignoring_unit_dims(&self) -> bool {
        let expect = Tensor::contiguous_strides(self.dtype, self.ne);
        (0..MAX_DIMS).all(|i| self.ne[i] == 1 || self.nb[i] == expect[i])
    }

    /// Whether each row's elements are contiguous (`nb[0]` is the element or block size).
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.type_size()
    }

    /// Whether two tensors have the same shape.
    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.ne == other.ne
    }

    /// A printable name: the name, or `#id` when it has none.
    pub fn label(&self, id: TensorId) -> String {
        if self.name.is_empty() {
            format!("#{}", id.0)
        } else {
            self.name.clone()
        }
    }
}
