//! tessera-llm: run GGUF models (Llama, Granite, Qwen 2/3, Gemma 2/3, Phi 3) on tessera: tokenizer, model graph, KV cache,
//! sampling, chat templates and generation; and make synthetic or trimmed models ([`synth`]).
//!
//! For apps: one [`Model`] shared by many [`Session`]s (generation as an iterator of
//! [`Piece`]s, stop strings, cancellation, state saved to bytes or a file), [`Embedder`] for
//! embeddings, and [`BatchContext`] to decode many sequences in one graph per step (what a
//! server's continuous batching runs on).
//!
//! # Example
//!
//! Load a model onto the best device present (the CPU runs what that device cannot) and stream
//! a completion:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use tessera::cpu::CpuDevice;
//! use tessera::Device;
//! use tessera_llm::generate::{generate, GenerateParams};
//! use tessera_llm::{Context, ContextParams, Model};
//!
//! # fn main() -> tessera::Result<()> {
//! let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
//! let device = tessera::registry().best()?;
//! let model = Arc::new(Model::load("model.gguf", device, cpu, &mut |_, _| {})?);
//! let mut ctx = Context::new(model.clone(), ContextParams::default())?;
//! let prompt = model.tokenizer.encode("Once upon a time", true, false)?;
//! let out = generate(&mut ctx, &prompt, &GenerateParams::default(), &mut |text| {
//!     print!("{text}");
//!     true // keep going
//! })?;
//! println!("\n{:.1} tokens/s", out.gen_tps());
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
pub mod arch;
pub mod batch;
pub mod chat;
pub mod config;
pub mod context;
pub mod embed;
pub mod fetch;
pub mod forward;
pub mod generate;
pub mod kv_cache;
pub mod model;
pub mod perplexity;
pub mod sampling;
pub mod session;
pub mod shard;
#[cfg(feature = "async")]
pub mod stream;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use arch::Arch;
pub use batch::{BatchContext, BatchParams};
pub use config::ModelConfig;
pub use context::{Context, ContextParams};
pub use embed::{Embedder, Pooling};
pub use generate::{Cancel, GenOptions, StopReason};
pub use kv_cache::SeqId;
pub use model::{LoadParams, Model, OP_OFFLOAD_BATCH};
pub use session::{Piece, Session};
