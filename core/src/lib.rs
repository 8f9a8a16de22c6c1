//! tessera-core: element types and quantized blocks, tensors and graphs, the backend traits,
//! the registry, the graph allocator and scheduler, the options parser, and GGUF.
#![warn(missing_docs)]

pub mod alloc;
pub mod backend;
pub mod dtype;
pub mod error;
pub mod fusion;
pub mod gguf;
pub mod graph;
pub mod graph_key;
pub mod math;
pub mod op;
pub mod options;
pub mod quant;
pub mod registry;
pub mod sched;
pub mod staging;
pub mod tensor;

pub use backend::{
    Backend, BackendReg, Buffer, BufferType, Communicator, Device, DeviceKind, Event, Memory,
    ReduceType,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::Graph;
pub use op::{BinaryOp, GluOp, Op, RopeMode, RopeParams, UnaryOp};
pub use registry::Registry;
pub use sched::{OffloadStats, SchedPlan, Scheduler};
pub use tensor::{Tensor, TensorData, TensorFlags, TensorId};
