//! tessera-core: element types and quantized blocks, tensors and graphs, the backend traits,
//! the registry, the graph allocator and scheduler, the meta (sharding) layer, and GGUF.
#![warn(missing_docs)]

pub mod dtype;
pub mod error;

pub use dtype::DType;
pub use error::{Error, Result};
