//! tessera-llm: run GGUF Llama-family models on tessera: tokenizer, model graph, KV cache,
//! sampling, chat templates and generation.
#![warn(missing_docs)]
pub mod chat;
pub mod config;
pub mod context;
pub mod fetch;
pub mod forward;
pub mod generate;
pub mod kv_cache;
pub mod model;
pub mod sampling;
pub mod shard;
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use context::{Context, ContextParams};
pub use model::Model;
