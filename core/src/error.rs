//! The one error type of tessera. Every fallible call returns [`Result`].

use crate::dtype::DType;

/// Everything that can go wrong in tessera, each naming what and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A graph op was given inputs it cannot take (shapes, strides or types).
    #[error("tensor '{tensor}' ({op}): {reason}")]
    InvalidOp {
        /// The tensor being built (its name, or its id).
        tensor: String,
        /// The op.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A quantized row that is not a whole number of blocks.
    #[error("{n} elements of {dtype} are not a whole number of {block}-element blocks")]
    NotWholeBlocks {
        /// The type.
        dtype: DType,
        /// The row length.
        n: usize,
        /// The type's block size.
        block: usize,
    },
    /// A type name or id that tessera does not know.
    #[error("unknown tensor type {0}")]
    UnknownType(String),
    /// A size computation overflowed.
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
    /// A backend cannot run an op (or an op on these types).
    #[error("backend {backend} does not support {what}")]
    Unsupported {
        /// The backend or device name.
        backend: String,
        /// The op, type or capability.
        what: String,
    },
    /// A buffer is too small, or an access falls outside it.
    #[error("buffer {buffer}: {reason}")]
    Buffer {
        /// The buffer's name or its type's name.
        buffer: String,
        /// What is wrong.
        reason: String,
    },
    /// A device ran out of memory.
    #[error("out of memory on {device}: asked for {bytes} bytes")]
    OutOfMemory {
        /// The device.
        device: String,
        /// The size of the failed allocation.
        bytes: usize,
    },
    /// A device, or a driver or library it needs, is missing or failed.
    #[error("device {device}: {reason}")]
    Device {
        /// The device (or backend) name.
        device: String,
        /// What happened.
        reason: String,
    },
    /// A device spec (`cpu`, `cuda:0`, `meta:cpu,cpu`) names nothing that exists.
    #[error("no device '{0}' (run `tessera devices` to list them)")]
    NoSuchDevice(String),
    /// A GGUF file that cannot be read.
    #[error("GGUF {path}: {reason}")]
    Gguf {
        /// The file (or `<memory>`).
        path: String,
        /// What is wrong, and where in the file.
        reason: String,
    },
    /// A model whose tensors or metadata tessera cannot run.
    #[error("model: {0}")]
    Model(String),
    /// A graph whose tensors cannot be split across the devices of a meta device.
    #[error("cannot split tensor '{tensor}' ({op}): {reason}")]
    Split {
        /// The tensor.
        tensor: String,
        /// The op that produced it.
        op: &'static str,
        /// Why.
        reason: String,
    },
    /// Bad user input that fits none of the above (a flag, a prompt, a ratio list).
    #[error("{0}")]
    Invalid(String),
    /// An I/O error, with the path or action it happened on.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// An [`Error::InvalidOp`].
    pub fn op(tensor: impl Into<String>, op: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOp {
            tensor: tensor.into(),
            op,
            reason: reason.into(),
        }
    }
}

/// tessera's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
