//! Save a conversation's KV state to a file and go on from it later without re-reading the
//! prompt: the restored session continues exactly as the original would.
//!
//! ```text
//! cargo run --example save_restore [MODEL.gguf]
//! ```

use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::{fetch, BatchParams, GenOptions, Model, Session};

fn main() -> tessera::Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => fetch::test_model(&mut |_| {})?,
    };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let device = tessera::registry().best().unwrap_or_else(|_| cpu.clone());
    let model = Arc::new(Model::load(&path, device, cpu, &mut |_, _| {})?);
    let greedy = || GenOptions {
        max_tokens: 24,
        sampler: SamplerConfig::greedy(),
        ..GenOptions::default()
    };

    let mut session = Session::new(model.clone(), BatchParams::default())?;
    let first: String = session
        .complete("A short story about a lighthouse:", greedy())?
        .map(|p| p.map(|p| p.text))
        .collect::<tessera::Result<_>>()?;
    let file = std::env::temp_dir().join("tessera-example-session.bin");
    session.save_file(&file)?;
    println!(
        "saved {} tokens to {}",
        session.tokens().len(),
        file.display()
    );

    // Later (another process could do this): restore and continue.
    let mut restored = Session::restore_file(model, BatchParams::default(), &file)?;
    let more: String = restored
        .generate(greedy())?
        .map(|p| p.map(|p| p.text))
        .collect::<tessera::Result<_>>()?;
    let again: String = session
        .generate(greedy())?
        .map(|p| p.map(|p| p.text))
        .collect::<tessera::Result<_>>()?;
    println!("{first}|{more}");
    println!(
        "the restored session continued as the original: {}",
        more == again
    );
    std::fs::remove_file(&file).ok();
    Ok(())
}
