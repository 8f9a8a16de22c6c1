//! Perplexity on the CPU against llama.cpp's `llama-perplexity` on the same file and text
//! (tests/data/perplexity/*.json, recorded by scripts/reference/perplexity.py; its README says
//! how): the token count equal, the final PPL within 1%, and the running PPL after every chunk
//! and the error within 2%. The looser bound is llama.cpp's own spread: its two CPU attention
//! paths (flash attention on and off, both recorded) differ by up to 1.6% in the running value
//! after the first chunks of these files, where few tokens are scored, and by 0.6% in the error.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::fetch::{self, FetchOptions};
use tessera_llm::perplexity::{self, PerplexityParams};
use tessera_llm::{Context, ContextParams, Model};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/perplexity")
        .join(name)
}

/// llama.cpp's run of `reference` at context `ctx`.
fn run_at(reference: &serde_json::Value, ctx: usize) -> &serde_json::Value {
    reference["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["n_ctx"].as_u64() == Some(ctx as u64))
        .unwrap_or_else(|| panic!("no run at ctx {ctx}"))
}

fn within(name: &str, got: f64, want: f64, tol: f64) {
    let rel = (got - want).abs() / want;
    assert!(
        rel <= tol,
        "{name}: ours {got:.4}, llama.cpp's {want:.4}: {:.2}% apart (at most {:.0}%)",
        rel * 100.0,
        tol * 100.0
    );
}

/// Runs the model at `ctx` over the first `chunks` chunks of the reference text (all when
/// `None`) and compares with llama.cpp's run.
fn check(model: Arc<Model>, reference_file: &str, ctx: usize, chunks: Option<usize>) {
    let text = std::fs::read_to_string(data(reference_file)).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want = run_at(&reference, ctx);
    let text = perplexity::read_text(&data(reference["text"].as_str().unwrap())).unwrap();
    let mut context = Context::new(
        model,
        ContextParams {
            n_ctx: ctx,
            n_ubatch: ctx,
            ..ContextParams::default()
        },
    )
    .unwrap();
    let tokens = perplexity::tokenize(&context, &text).unwrap();
    assert_eq!(
        tokens.len() as u64,
        want["n_tokens"].as_u64().unwrap(),
        "the text's token count differs from llama.cpp's"
    );
    let params = PerplexityParams {
        n_ctx: ctx,
        n_batch: ctx,
        max_chunks: chunks,
    };
    let t0 = std::time::Instant::now();
    let got = perplexity::perplexity(&mut context, &tokens, &params, &mut |_, _, _| {}).unwrap();
    println!(
        "ctx {ctx}: {} chunks in {:.1} s: ours {}",
        got.running.len(),
        t0.elapsed().as_secs_f64(),
        perplexity::format_running(&got.running)
    );
    let running: Vec<f64> = want["running"]
        .as_array()
        .expect("running values")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect();
    assert_eq!(
        got.running.len(),
        chunks.unwrap_or(running.len()),
        "chunk count"
    );
    for (i, (&g, &w)) in got.running.iter().zip(&running).enumerate() {
        within(&format!("PPL after chunk {}", i + 1), g, w, 0.02);
    }
    if chunks.is_none() {
        let (ppl, err) = (
            want["ppl"].as_f64().unwrap(),
            want["error"].as_f64().unwrap(),
        );
        println!(
            "final: ours {:.4} +/- {:.5}, llama.cpp's {ppl:.4} +/- {err:.5}",
            got.ppl, got.error
        );
        within("final PPL", got.ppl, ppl, 0.01);
        within("its error", got.error, err, 0.02);
    }
}

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    check(common::cpu_model(), "smollm2-135m.json", 128, None);
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    let path = fetch::GEMMA3_270M
        .fetch(&FetchOptions::from_env(), &mut |_| {})
        .expect("the Gemma 3 file is fetched or cached");
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let model = Model::load(path, cpu.clone(), cpu, &mut |_, _| {}).expect("the model loads");
    check(Arc::new(model), "gemma3-270m.json", 512, None);
}
