//! Several conversations over one model: the weights are loaded once and shared, each session
//! keeps its own KV cache and sampling; each runs on its own thread, and one is cancelled from
//! the main thread.
//!
//! ```text
//! cargo run --example sessions [MODEL.gguf]
//! ```

use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::chat::Message;
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::{fetch, BatchParams, Cancel, GenOptions, Model, Session};

fn main() -> tessera::Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => fetch::test_model(&mut |_| {})?,
    };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let device = tessera::registry().best().unwrap_or_else(|_| cpu.clone());
    let model = Arc::new(Model::load(&path, device, cpu, &mut |_, _| {})?);

    let questions = [
        "What is the capital of France?",
        "Name a fruit.",
        "Count to ten.",
    ];
    let cancel = Cancel::new();
    let threads: Vec<_> = questions
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let (model, q) = (model.clone(), q.to_string());
            // The last session may be cancelled by the main thread.
            let cancel = (i == questions.len() - 1).then(|| cancel.clone());
            std::thread::spawn(move || -> tessera::Result<String> {
                let prompt = model.template.render(&[Message::new("user", q)], true)?;
                let mut session = Session::new(model, BatchParams::default())?;
                let opts = GenOptions {
                    max_tokens: 48,
                    sampler: SamplerConfig {
                        seed: i as u64,
                        ..SamplerConfig::default()
                    },
                    cancel,
                    ..GenOptions::default()
                };
                session
                    .complete(&prompt, opts)?
                    .map(|p| p.map(|p| p.text))
                    .collect()
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    cancel.cancel();
    for (q, t) in questions.iter().zip(threads) {
        let answer = t.join().expect("the session's thread ends")?;
        let answer = answer.trim();
        let shown = if answer.is_empty() {
            "(cancelled before its first word)"
        } else {
            answer
        };
        println!("Q: {q}\nA: {shown}\n");
    }
    Ok(())
}
