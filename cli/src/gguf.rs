//! `tessera gguf synth` and `tessera gguf trim`: make random-weight models of a known shape, and
//! cut real models down to their first layers.

use std::path::PathBuf;
use std::time::Instant;

use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};
use tessera::Result;
use tessera_llm::fetch;
use tessera_llm::synth::{self, Like, SynthType};

use crate::progress;

/// GGUF model tools.
#[derive(Subcommand)]
pub enum GgufCommand {
    /// Write a random-weight model shaped like a known one.
    Synth(SynthArgs),
    /// Keep the first N layers of a model.
    Trim(TrimArgs),
}

/// Arguments of `tessera gguf synth`.
#[derive(Args)]
pub struct SynthArgs {
    /// The shape: smollm2-135m (the test model's exact layout and tokenizer); llama-1b
    /// (Llama 3.2 1B), llama-8b (Llama 3 8B), llama-70b (Llama 3 70B), llama3.1-8b (with its
    /// rope factors), qwen2-7b (Qwen 2.5 7B), qwen3-8b, gemma2-9b, gemma3-4b, phi3-mini (Phi 3
    /// mini 128k), mixtral-8x7b, qwen3-30b-a3b, gpt-oss-20b (mixtures of experts); and small
    /// models of each architecture for tests: llama3-small (Llama 3.1 rope factors),
    /// qwen2-small, qwen3-small, gemma2-small, gemma3-small, phi3-small, and the mixtures of
    /// experts mixtral-small,
    /// qwen2moe-small, qwen3moe-small, olmoe-small, gpt-oss-small (gpt-oss's experts are MXFP4
    /// whatever the type, as in OpenAI's files). All but smollm2-135m have a generated
    /// vocabulary.
    #[arg(long, value_parser = PossibleValuesParser::new(Like::NAMES))]
    like: String,
    /// Type of the weight matrices: one type for all, or q4_k_m, llama.cpp's Q4_K_M mix (Q4_K,
    /// Q6_K for the output head and half of the attn_v and ffn_down matrices).
    #[arg(long = "type", value_parser = PossibleValuesParser::new(SynthType::NAMES))]
    dtype: String,
    /// The file to write.
    #[arg(long)]
    out: PathBuf,
}

/// Arguments of `tessera gguf trim`.
#[derive(Args)]
pub struct TrimArgs {
    /// How many layers to keep (from the first).
    #[arg(long)]
    layers: usize,
    /// The model to trim.
    input: PathBuf,
    /// The file to write.
    output: PathBuf,
}

/// Runs a `tessera gguf` command.
pub fn run(cmd: GgufCommand) -> Result<()> {
    match cmd {
        GgufCommand::Synth(a) => run_synth(a),
        GgufCommand::Trim(a) => run_trim(a),
    }
}

fn run_synth(a: SynthArgs) -> Result<()> {
    let like = Like::from_name(&a.like)?;
    let ty = SynthType::from_name(&a.dtype)?;
    if like == Like::Smollm2_135m {
        // The layout and tokenizer come from the test model: fetch it first, with its own bar.
        let m = &fetch::SMOLLM2_135M;
        let pb = progress::bytes_bar(&format!("fetching {}", m.name));
        let r = m.fetch(
            &fetch::FetchOptions::from_env(),
            &mut progress::fetch_reporter(&pb, m),
        );
        pb.finish_and_clear();
        r?;
    }
    let t0 = Instant::now();
    let pb = progress::bytes_bar(&format!("writing {} {}", like.name(), ty.name()));
    let r = synth::synth(like, ty, &a.out, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    });
    pb.finish_and_clear();
    r?;
    report(&a.out, t0);
    Ok(())
}

fn run_trim(a: TrimArgs) -> Result<()> {
    let t0 = Instant::now();
    let pb = progress::bytes_bar(&format!("writing the first {} layers", a.layers));
    let r = synth::trim(&a.input, a.layers, &a.output, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    });
    pb.finish_and_clear();
    r?;
    report(&a.output, t0);
    Ok(())
}

/// Prints what was written, and how long it took.
fn report(path: &std::path::Path, t0: Instant) {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({:.1} MB) in {:.1} s",
        path.display(),
        size as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
}
