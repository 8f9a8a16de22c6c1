//! Greedy generation of the test model on the CPU against llama.cpp's
//! (shared/reference/smollm2-greedy.json): ids equal up to the first step where llama.cpp's
//! top-2 gap is below 0.5 (beyond that, either choice is within llama.cpp's own noise).

mod common;

use tessera_llm::{Context, ContextParams};

use common::*;

#[test]
fn greedy_generation_matches_llama_cpp_to_the_first_near_tie() {
    let model = cpu_model();
    let r = reference("smollm2-greedy.json");
    for p in r["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["generated_ids"]);
        let steps = p["steps"].as_array().unwrap();
        let tie = steps
            .iter()
            .position(|s| s["margin_top1_top2"].as_f64().unwrap() < 0.5)
            .unwrap_or(steps.len());
        let mut ctx = Context::new(model.clone(), ContextParams::default()).unwrap();
        let mut logits = ctx.eval(&prompt, false).unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let t = argmax(&logits) as u32;
            got.push(t);
            logits = ctx.eval(&[t], false).unwrap();
        }
        let matched = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!(
            "{name}: matched {matched}/{} tokens; first near-tie at step {tie}",
            want.len()
        );
        assert!(
            matched >= tie,
            "{name}: diverged at step {matched}, before the first near-tie at {tie}"
        );
    }
}
