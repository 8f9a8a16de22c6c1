//! Embeddings: unit-length vectors of texts (the model's hidden states, pooled as its file
//! says), and their cosine similarities.
//!
//! ```text
//! cargo run --example embeddings [MODEL.gguf]
//! ```

use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::{fetch, Embedder, Model};

fn main() -> tessera::Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => fetch::test_model(&mut |_| {})?,
    };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let device = tessera::registry().best().unwrap_or_else(|_| cpu.clone());
    let model = Arc::new(Model::load(&path, device, cpu, &mut |_, _| {})?);

    let texts = [
        "The cat sat on the mat.",
        "A kitten rested on the rug.",
        "Quarterly revenue grew by four percent.",
    ];
    let mut embedder = Embedder::new(model, 512)?;
    println!("pooling: {:?}", embedder.pooling());
    let vecs: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| embedder.embed(t))
        .collect::<tessera::Result<_>>()?;
    for (i, a) in texts.iter().enumerate() {
        for (j, b) in texts.iter().enumerate().skip(i + 1) {
            let cos: f32 = vecs[i].iter().zip(&vecs[j]).map(|(x, y)| x * y).sum();
            println!("{cos:.3}  {a:?} ~ {b:?}");
        }
    }
    Ok(())
}
