//! `tessera tokenize`.

use clap::Args;
use tessera::core::gguf::GgufFile;
use tessera::Result;
use tessera_llm::tokenizer::Tokenizer;

use crate::load::{self, ModelArgs};

/// Arguments of `tessera tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text.
    #[arg(long)]
    text: String,
    /// Print JSON (ids and pieces).
    #[arg(long)]
    json: bool,
    /// Do not parse special-token text such as <|im_start|>.
    #[arg(long)]
    no_parse_special: bool,
}

/// Prints the token ids of a text (only the tokenizer is loaded, not the weights).
pub fn run(a: TokenizeArgs) -> Result<()> {
    let path = load::model_path(&a.model)?;
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&a.text, true, !a.no_parse_special)?;
    if a.json {
        let pieces: Vec<String> = ids
            .iter()
            .map(|&i| {
                tok.token_to_piece(i)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
            })
            .collect::<Result<_>>()?;
        println!("{}", serde_json::json!({ "ids": ids, "pieces": pieces }));
    } else {
        println!(
            "{}",
            ids.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}
