//! `tessera`: generate text with a GGUF model (a file, or a known model by name) on any device,
//! serve it over an OpenAI-compatible HTTP API, measure its perplexity and speed, list devices
//! and known models, and run the op conformance suite and op benchmarks.

mod allreduce;
mod bench;
mod devices;
mod generate;
mod gguf;
mod load;
mod models;
mod ops;
mod perplexity;
mod progress;
mod serve;
mod tokenize;

use clap::{Parser, Subcommand};

/// Tensor graphs on any mix of devices.
#[derive(Parser)]
#[command(name = "tessera", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every device of every compiled-in backend (and a meta device's parts with --meta).
    Devices(devices::DevicesArgs),
    /// Generate text from a prompt, streaming it.
    Generate(generate::GenerateArgs),
    /// Chat interactively with the model's chat template.
    Chat(generate::ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API, decoding many requests together.
    Serve(serve::ServeArgs),
    /// Print a text's token ids.
    Tokenize(tokenize::TokenizeArgs),
    /// A model's perplexity on a text, computed as llama.cpp's perplexity tool does.
    Perplexity(perplexity::PerplexityArgs),
    /// List the models `--model NAME` fetches, and which are cached.
    Models(models::ModelsArgs),
    /// Measure prompt and generation tokens per second, as llama-bench does.
    Bench(bench::BenchArgs),
    /// Time the all-reduce between a meta device's parts, per tensor size.
    AllReduce(allreduce::AllReduceArgs),
    /// The op conformance suite and op benchmarks.
    #[command(subcommand)]
    Ops(ops::OpsCommand),
    /// GGUF tools: synthetic random-weight models, trimmed models.
    #[command(subcommand)]
    Gguf(gguf::GgufCommand),
}

fn main() {
    // Mesa's device-select Vulkan layer prints an error when XDG_RUNTIME_DIR is unset (headless
    // machines, CI) and only reorders adapters, which tessera does itself: keep it quiet.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(a) => devices::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => generate::chat(a),
        Command::Serve(a) => serve::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Models(a) => models::run(a),
        Command::Bench(a) => bench::run(a),
        Command::AllReduce(a) => allreduce::run(a),
        Command::Ops(c) => ops::run(c),
        Command::Gguf(c) => gguf::run(c),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
