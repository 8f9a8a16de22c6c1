//! Stream a completion as an iterator of pieces, with a stop string and a seed.
//!
//! ```text
//! cargo run --example stream -- "The three primary colors are" [MODEL.gguf]
//! ```
//!
//! Without a model path it uses the test model (SmolLM2-135M-Instruct), fetched on first use.

use std::io::Write;
use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::{fetch, BatchParams, GenOptions, Model, Session};

fn main() -> tessera::Result<()> {
    let mut args = std::env::args().skip(1);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The three primary colors are".into());
    let path = match args.next() {
        Some(p) => p.into(),
        None => fetch::test_model(&mut |_| {})?,
    };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let device = tessera::registry().best().unwrap_or_else(|_| cpu.clone());
    let model = Arc::new(Model::load(&path, device, cpu, &mut |_, _| {})?);

    let mut session = Session::new(model, BatchParams::default())?;
    let opts = GenOptions {
        max_tokens: 64,
        sampler: SamplerConfig {
            seed: 42,
            ..SamplerConfig::default()
        },
        // The text ends before the first blank line.
        stop: vec!["\n\n".into()],
        ..GenOptions::default()
    };
    print!("{prompt}");
    let mut pieces = session.complete(&prompt, opts)?;
    for piece in pieces.by_ref() {
        print!("{}", piece?.text);
        std::io::stdout().flush().ok();
    }
    println!(
        "\n[{} tokens; stopped: {:?}]",
        pieces.n_generated(),
        pieces.stop_reason()
    );
    Ok(())
}
