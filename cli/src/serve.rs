//! `tessera serve`: the OpenAI-compatible HTTP server (tessera-serve) over a model.

use clap::Args;
use tessera::{Error, Result};

use crate::load::{self, ModelArgs};

/// Options of `tessera serve`.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default: only this machine can connect).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded together.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Positions one request may hold, prompt and completion (0: the model's, at most 4096).
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
    /// Requests waiting for a slot; past them the server answers 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Most tokens in one step (the running decodes and prompt chunks).
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub body_limit: usize,
    /// Require `Authorization: Bearer KEY` on every request but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The model's id in requests and /v1/models (default: the file's name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let path = load::model_path(&a.model)?;
    let model_id = match &a.alias {
        Some(id) => id.clone(),
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .ok_or_else(|| Error::Invalid(format!("{} has no file name", path.display())))?,
    };
    // The placement's room for the KV cache: the slots' positions together (an automatic
    // partial offload leaves that much free on the GPU).
    let context = tessera_llm::ContextParams {
        n_ctx: a.ctx.max(1).saturating_mul(a.parallel.max(1)),
        n_ubatch: a.batch,
        ..Default::default()
    };
    let model = load::load(&a.model, &context)?;
    let opts = tessera_serve::ServeOptions {
        model_id,
        parallel: a.parallel,
        ctx: a.ctx,
        queue: a.queue,
        n_ubatch: a.batch,
        body_limit: a.body_limit,
        api_key: a.api_key,
    };
    tessera_serve::serve(model, opts, &a.host, a.port)
}
