//! The byte-level BPE vocabulary of the synthetic Llama shapes, generated: the 256 byte tokens,
//! merges learnt from a small built-in English text, filler tokens up to the size asked for, and
//! Llama 3's control tokens at the end (`<|begin_of_text|>`, `<|end_of_text|>`, `<|eot_id|>` ...).
//!
//! Every merge's result is a token and every byte is one, so the tokenizer cuts any text into
//! tokens and decodes them back to the same text. Filler tokens are pairs (or longer runs) of
//! other tokens glued together: merges never make them, but the llama3 pre-tokenizer takes a
//! word that is one of them whole, and a random model that picks one decodes it to plain text.

use std::collections::{HashMap, HashSet};

use tessera_core::{Error, Result};

use super::Rng;
use crate::tokenizer::bpe::byte_chars;

/// The text the merges are learnt from.
const CORPUS: &str = include_str!("corpus.txt");

/// Control tokens with a name, in id order at the start of the control block (Llama 3's).
const NAMED_SPECIALS: &[&str] = &[
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
];

/// The fewest tokens a generated vocabulary can have: the bytes and the named control tokens.
pub const MIN_VOCAB: usize = 256 + NAMED_SPECIALS.len();

/// The most control tokens (Llama 3 has 256).
const MAX_SPECIALS: usize = 256;

/// GGUF token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// A generated vocabulary, ready for the `tokenizer.ggml.*` keys.
pub(super) struct Vocab {
    /// Token texts, by id.
    pub tokens: Vec<String>,
    /// Token types, by id.
    pub types: Vec<i32>,
    /// Merge lines `"left right"`, by rank.
    pub merges: Vec<String>,
    /// `<|begin_of_text|>`.
    pub bos: u32,
    /// `<|end_of_text|>`.
    pub eos: u32,
}

/// Generates a vocabulary of exactly `n_vocab` tokens (at least [`MIN_VOCAB`]).
pub(super) fn byte_level_bpe(n_vocab: usize) -> Result<Vocab> {
    if n_vocab < MIN_VOCAB {
        return Err(Error::Invalid(format!(
            "a generated vocabulary needs at least {MIN_VOCAB} tokens (256 bytes and \
             {} control tokens), not {n_vocab}",
            NAMED_SPECIALS.len()
        )));
    }
    // About 1 in 500 tokens is a control token, as in Llama 3 (256 of 128256).
    let n_special = (n_vocab / 500).clamp(NAMED_SPECIALS.len(), MAX_SPECIALS);
    let specials: Vec<String> = NAMED_SPECIALS
        .iter()
        .map(|s| s.to_string())
        .chain((3..).map(|k| format!("<|reserved_special_token_{k}|>")))
        .take(n_special)
        .collect();
    let n_normal = n_vocab - n_special;

    let mut tokens: Vec<String> = byte_chars().iter().map(char::to_string).collect();
    let mut seen: HashSet<String> = tokens.iter().chain(&specials).cloned().collect();
    let merges = learn_merges(n_normal - tokens.len());
    for (l, r) in &merges {
        let t = format!("{l}{r}");
        if seen.insert(t.clone()) {
            tokens.push(t);
        }
    }
    let mut rng = Rng::new(0x5eed_70c3);
    let n_learnt = tokens.len();
    while tokens.len() < n_normal {
        let mut t = tokens[rng.below(n_learnt)].clone();
        loop {
            t.push_str(&tokens[rng.below(n_learnt)]);
            if !seen.contains(&t) {
                break;
            }
        }
        seen.insert(t.clone());
        tokens.push(t);
    }
    let bos = tokens.len() as u32;
    let mut types = vec![NORMAL; tokens.len()];
    tokens.extend(specials);
    types.resize(tokens.len(), CONTROL);
    Ok(Vocab {
        tokens,
        types,
        merges: merges
            .into_iter()
            .map(|(l, r)| format!("{l} {r}"))
            .collect(),
        bos,
        eos: bos + 1,
    })
}

/// Cuts text into words roughly as GPT-2's pre-tokenizer does: an optional space followed by a
/// run of letters, of up to three digits, or of other symbols; or a run of white space.
fn words(text: &str) -> Vec<&str> {
    #[derive(PartialEq)]
    enum Class {
        Letter,
        Digit,
        Symbol,
        Space,
    }
    let class = |c: char| {
        if c.is_alphabetic() {
            Class::Letter
        } else if c.is_numeric() {
            Class::Digit
        } else if c.is_whitespace() {
            Class::Space
        } else {
            Class::Symbol
        }
    };
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let start = chars[i].0;
        let lead =
            chars[i].1 == ' ' && chars.get(i + 1).is_some_and(|c| class(c.1) != Class::Space);
        if lead {
            i += 1;
        }
        let kind = class(chars[i].1);
        let mut n = 0;
        while i < chars.len() && class(chars[i].1) == kind {
            let full_number = kind == Class::Digit && n == 3;
            // A run of spaces leaves its last space to the word after it.
            let next_word = kind == Class::Space
                && n > 0
                && chars[i].1 == ' '
                && chars.get(i + 1).is_some_and(|c| class(c.1) != Class::Space);
            if full_number || next_word {
                break;
            }
            i += 1;
            n += 1;
        }
        let end = chars.get(i).map_or(text.len(), |c| c.0);
        out.push(&text[start..end]);
    }
    out
}

/// Learns up to `budget` merges from the built-in text: each step merges the most frequent
/// adjacent pair (the smallest pair of strings among equals), until every word of the text is
/// one token.
fn learn_merges(budget: usize) -> Vec<(String, String)> {
    let chars = byte_chars();
    // Symbols by id; ids 0..256 are the bytes.
    let mut syms: Vec<String> = chars.iter().map(char::to_string).collect();
    let mut sym_ids: HashMap<String, u32> = syms
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), i as u32))
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in words(CORPUS) {
        *counts.entry(w).or_default() += 1;
    }
    let mut words: Vec<(Vec<u32>, usize)> = counts
        .into_iter()
        .map(|(w, n)| (w.bytes().map(u32::from).collect(), n))
        .collect();
    words.sort();

    let mut merges = Vec::new();
    while merges.len() < budget {
        let mut pairs: HashMap<(u32, u32), usize> = HashMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0], p[1])).or_default() += n;
            }
        }
        let best = pairs.into_iter().min_by(|a, b| {
            let key = |p: (u32, u32)| (syms[p.0 as usize].as_str(), syms[p.1 as usize].as_str());
            b.1.cmp(&a.1).then_with(|| key(a.0).cmp(&key(b.0)))
        });
        let Some(((l, r), _)) = best else { break };
        let text = format!("{}{}", syms[l as usize], syms[r as usize]);
        let id = *sym_ids.entry(text.clone()).or_insert_with(|| {
            syms.push(text);
            (syms.len() - 1) as u32
        });
        for (w, _) in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == l && w[i + 1] == r {
                    w[i] = id;
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push((syms[l as usize].clone(), syms[r as usize].clone()));
    }
    merges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_like_gpt2() {
        assert_eq!(
            words("Hello, world!  It is 12345 o'clock.\n"),
            [
                "Hello", ",", " world", "!", " ", " It", " is", " 123", "45", " o", "'", "clock",
                ".", "\n"
            ]
        );
    }

    #[test]
    fn vocab_sizes_and_ids() {
        for n in [MIN_VOCAB, 1000, 20_000] {
            let v = byte_level_bpe(n).unwrap();
            assert_eq!(v.tokens.len(), n);
            assert_eq!(v.types.len(), n);
            let unique: HashSet<&String> = v.tokens.iter().collect();
            assert_eq!(unique.len(), n, "duplicate tokens");
            assert_eq!(v.tokens[v.bos as usize], "<|begin_of_text|>");
            assert_eq!(v.tokens[v.eos as usize], "<|end_of_text|>");
            for m in &v.merges {
                assert!(
                    unique.contains(&m.replace(' ', "")),
                    "merge {m} makes no token"
                );
            }
        }
        assert!(byte_level_bpe(MIN_VOCAB - 1).is_err());
        let big = byte_level_bpe(128_256).unwrap();
        assert_eq!((big.bos, big.eos), (128_000, 128_001));
        assert!(big.merges.len() > 500, "{} merges", big.merges.len());
    }
}
