//! `tessera generate` and `tessera chat`.

use std::io::{BufRead, Write};

use clap::Args;
use tessera::{Error, Result};
use tessera_llm::chat::Message;
use tessera_llm::generate::{generate, GenerateParams};
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::{Context, ContextParams};

use crate::load::{self, ModelArgs};

/// Sampling and context options shared by generate and chat.
#[derive(Args, Clone, Debug)]
pub struct SampleArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this probability mass (1: all).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this times the most likely (0: none).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty on recently seen tokens (1: none).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Context size in tokens (0: the model's, at most 4096).
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
}

impl SampleArgs {
    /// The context: `--ctx` positions (0: the smaller of the model's and 4096).
    fn context(&self) -> ContextParams {
        ContextParams {
            n_ctx: self.ctx,
            ..ContextParams::default()
        }
    }

    fn params(&self) -> Result<GenerateParams> {
        if self.temp.is_nan()
            || self.temp < 0.0
            || !(0.0..=1.0).contains(&self.top_p)
            || !(0.0..=1.0).contains(&self.min_p)
        {
            return Err(Error::Invalid(
                "--temp must be >= 0, --top-p and --min-p within [0, 1]".into(),
            ));
        }
        Ok(GenerateParams {
            max_tokens: self.max_tokens,
            sampler: SamplerConfig {
                temperature: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                seed: self.seed,
                ..SamplerConfig::default()
            },
            stop_at_eog: true,
        })
    }
}

/// Arguments of `tessera generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object (prompt ids, generated ids, text, timings) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Keep generating past end-of-generation tokens (for comparisons with fixed-length runs).
    #[arg(long)]
    ignore_eog: bool,
}

/// Runs `tessera generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    if a.prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    let mut params = a.sample.params()?;
    params.stop_at_eog = !a.ignore_eog;
    let model = load::load(&a.model, &a.sample.context())?;
    let text = if a.chat {
        model
            .template
            .render(&[Message::new("user", a.prompt.clone())], true)?
    } else {
        a.prompt.clone()
    };
    let ids = model.tokenizer.encode(&text, true, true)?;
    if ids.is_empty() {
        return Err(Error::Invalid("the prompt gives no tokens".into()));
    }
    let mut ctx = Context::new(model.clone(), a.sample.context())?;
    let json = a.json;
    let mut stdout = std::io::stdout();
    let g = generate(&mut ctx, &ids, &params, &mut |piece| {
        if !json {
            let _ = write!(stdout, "{piece}");
            let _ = stdout.flush();
        }
        true
    })?;
    if json {
        let v = serde_json::json!({
            "device": model.device().name(),
            "prompt_ids": g.prompt_ids,
            "ids": g.ids,
            "text": g.text,
            "stop": format!("{:?}", g.stop),
            "prompt_secs": g.prompt_secs,
            "gen_secs": g.gen_secs,
            "prompt_tokens_per_sec": g.prompt_tps(),
            "gen_tokens_per_sec": g.gen_tps(),
        });
        println!("{v}");
    } else {
        println!();
        eprintln!(
            "[{}] prompt: {} tokens, {:.1} tokens/s | generation: {} tokens, {:.1} tokens/s",
            model.device().name(),
            g.prompt_ids.len(),
            g.prompt_tps(),
            g.ids.len(),
            g.gen_tps()
        );
    }
    Ok(())
}

/// Arguments of `tessera chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// A system message to start with.
    #[arg(long)]
    system: Option<String>,
}

/// Runs `tessera chat`: reads user turns from stdin, answers each.
pub fn chat(a: ChatArgs) -> Result<()> {
    let params = a.sample.params()?;
    let model = load::load(&a.model, &a.sample.context())?;
    let mut ctx = Context::new(model.clone(), a.sample.context())?;
    let mut messages: Vec<Message> = a
        .system
        .iter()
        .map(|s| Message::new("system", s.clone()))
        .collect();
    let mut evaluated: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    eprintln!(
        "chatting with {} on {} (an empty line or Ctrl-D ends)",
        model.config.arch,
        model.device().name()
    );
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| Error::io("reading stdin", e))?
            == 0
        {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            break;
        }
        messages.push(Message::new("user", line));
        let rendered = model.template.render(&messages, true)?;
        let ids = model.tokenizer.encode(&rendered, true, true)?;
        // Reuse the cache for the part of the conversation already evaluated.
        let common = evaluated
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        let common = common.min(ids.len().saturating_sub(1));
        ctx.truncate(common);
        let mut stdout = std::io::stdout();
        let g = generate(&mut ctx, &ids[common..], &params, &mut |piece| {
            let _ = write!(stdout, "{piece}");
            let _ = stdout.flush();
            true
        })?;
        println!();
        evaluated = ids;
        evaluated.extend(&g.ids);
        // The last generated token was sampled but not evaluated.
        evaluated.truncate(ctx.n_past());
        messages.push(Message::new("assistant", g.text));
    }
    Ok(())
}
