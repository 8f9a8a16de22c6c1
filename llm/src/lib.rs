//! tessera-llm: run GGUF Llama-family models on tessera.
#![warn(missing_docs)]
