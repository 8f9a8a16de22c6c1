//! tessera-llm: run GGUF Llama-family models on tessera.
#![warn(missing_docs)]
pub mod chat;
pub mod sampling;
pub mod tokenizer;
