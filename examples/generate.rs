//! The smallest program that embeds tessera: load a GGUF model, put it on the best device
//! present, and stream a completion token by token.
//!
//! ```text
//! cargo run --release --example generate -- "Once upon a time" [MODEL.gguf]
//! ```
//!
//! Without a model path it uses the test model (SmolLM2-135M-Instruct), fetched into the cache
//! on first use. Build with `--features cuda` or `--features wgpu` to let it find GPUs.

use std::io::Write;
use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::generate::{generate, GenerateParams};
use tessera_llm::{fetch, Context, ContextParams, Model};

fn main() -> tessera::Result<()> {
    let mut args = std::env::args().skip(1);
    let prompt = args
        .next()
        .unwrap_or_else(|| "Once upon a time".to_string());
    let path = match args.next() {
        Some(p) => p.into(),
        None => fetch::test_model(&mut |_| {})?,
    };

    // The best device present (a GPU when one is compiled in and found), with the CPU running
    // whatever that device cannot.
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let device = tessera::registry().best().unwrap_or_else(|_| cpu.clone());
    eprintln!("loading {} onto {}", path.display(), device.name());
    let model = Arc::new(Model::load(&path, device, cpu, &mut |_, _| {})?);

    // A context holds the KV cache; the prompt is tokenized as the model's vocabulary says
    // (BOS added when the file asks for it).
    let mut ctx = Context::new(model.clone(), ContextParams::default())?;
    let prompt_ids = model.tokenizer.encode(&prompt, true, false)?;

    // Sample up to 64 tokens (temperature 0.8, top-k 40, top-p 0.95 by default), printing each
    // piece of text as soon as it is complete; returning false from the callback would stop.
    let params = GenerateParams {
        max_tokens: 64,
        ..Default::default()
    };
    print!("{prompt}");
    let out = generate(&mut ctx, &prompt_ids, &params, &mut |piece| {
        print!("{piece}");
        std::io::stdout().flush().is_ok()
    })?;
    println!();
    eprintln!(
        "{} prompt tokens at {:.1} tokens/s, {} generated at {:.1} tokens/s ({:?})",
        out.prompt_ids.len(),
        out.prompt_tps(),
        out.ids.len(),
        out.gen_tps(),
        out.stop
    );
    Ok(())
}
