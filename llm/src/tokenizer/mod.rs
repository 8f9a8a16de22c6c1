//! Tokenizers built from GGUF metadata, giving llama.cpp's token ids.
//!
//! Two vocabulary kinds are supported, named by `tokenizer.ggml.model`:
//!
//! * `gpt2`: byte-level BPE. Text is cut into words by the pre-tokenizer that
//!   `tokenizer.ggml.pre` names (`smollm`, `llama-bpe`, `gpt-2`, `qwen2`, `default` and their
//!   aliases; no name means `default`, a name not known here is an error, as in llama.cpp),
//!   each word's bytes are written as GPT-2 byte characters and merged by the ranks of
//!   `tokenizer.ggml.merges`.
//! * `llama`: SentencePiece-style BPE. Spaces are written as `▁`, a space is put before the
//!   text (and after every special token) when `add_space_prefix` is set, pairs merge by token
//!   score, and characters that are no token become byte tokens `<0xXX>`.
//!
//! Special tokens: control (type 3), user-defined (type 4) and unknown (type 2) tokens written
//! in the text are cut out before tokenizing, longest first, as llama.cpp does: user-defined
//! ones always, control and unknown ones only with `parse_special`. `add_special` adds BOS/EOS
//! where the vocabulary asks for them (`add_bos` / `add_eos`). In a Phi 3 vocabulary the white
//! space after most special tokens is dropped, as llama.cpp does for files it takes for Phi 3.
//!
//! End of generation: EOS, the file's EOT / EOM / FIM tokens, the end-of-turn token of the
//! file's chat format ([`crate::chat::ChatFormat`]) and tokens whose text llama.cpp knows as an
//! end-of-turn marker.
//!
//! Decoding turns each token into its bytes ([`Tokenizer::token_to_piece`]); special tokens
//! decode to their text. One UTF-8 character may span several tokens: [`StreamDecoder`]
//! emits text only once it is complete.

pub(crate) mod bpe;
mod pretok;
mod spm;
mod symbols;

use std::collections::{BTreeSet, HashMap};

use tessera_core::gguf::GgufFile;
use tessera_core::{Error, Result};

use pretok::PreTokenizer;

/// GGUF token types (`tokenizer.ggml.token_type`).
mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const BYTE: i32 = 6;
}

/// Token texts that llama.cpp treats as end of generation (and as control tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fill-in-the-middle token texts that llama.cpp also treats as end of generation: pad,
/// repository and file-separator tokens (used when the file does not give their ids).
const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Fill-in-the-middle prefix, suffix and middle token texts, which llama.cpp takes for control
/// tokens.
const FIM_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];

/// Everything a [`Tokenizer`] is built from: the `tokenizer.ggml.*` metadata of a GGUF file
/// ([`VocabSpec::from_gguf`]), or a vocabulary made by hand.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece-style).
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer's name (`None`: llama.cpp's default).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: each token's text, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: each token's type (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte); empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.scores`: merge scores of a `llama` vocabulary; empty means all 0.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges`: `"left right"` lines of a `gpt2` vocabulary, by rank.
    pub merges: Vec<String>,
    /// The beginning-of-sequence token.
    pub bos: Option<u32>,
    /// The end-of-sequence token.
    pub eos: Option<u32>,
    /// The unknown token.
    pub unk: Option<u32>,
    /// Whether `add_special` puts BOS in front.
    pub add_bos: bool,
    /// Whether `add_special` puts EOS at the end.
    pub add_eos: bool,
    /// Whether a `llama` vocabulary puts a space before the text.
    pub add_space_prefix: bool,
    /// The end-of-generation tokens. EOS is always one, listed here or not.
    pub eog: Vec<u32>,
    /// Special tokens after which the white space of the text is dropped (llama.cpp's
    /// right-strip attribute, which it gives the special tokens of Phi 3 vocabularies).
    pub rstrip: Vec<u32>,
}

/// llama.cpp's defaults for the special tokens of a vocabulary kind, before the file's keys.
struct KindDefaults {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_space_prefix: bool,
}

impl KindDefaults {
    /// The defaults of tokenizer model `model` with pre-tokenizer `pre`; an error naming the
    /// model when it is not one of the two supported.
    fn new(model: &str, pre: Option<&str>) -> Result<KindDefaults> {
        match model {
            "llama" => Ok(KindDefaults {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                add_bos: true,
                add_space_prefix: true,
            }),
            "gpt2" => Ok(KindDefaults {
                bos: Some(11),
                eos: Some(11),
                unk: None,
                add_bos: matches!(
                    pre.unwrap_or("default"),
                    "llama3"
                        | "llama-v3"
                        | "llama-bpe"
                        | "falcon3"
                        | "falcon-h1"
                        | "pixtral"
                        | "midm-2.0"
                        | "lfm2"
                        | "jina-v5-nano"
                        | "tekken"
                        | "chameleon"
                ),
                add_space_prefix: false,
            }),
            other => Err(Error::Model(format!(
                "tokenizer model '{other}' is not supported (only gpt2 and llama)"
            ))),
        }
    }
}

/// Reads an optional string key.
fn gguf_opt_str<'f>(f: &'f GgufFile, key: &str) -> Result<Option<&'f str>> {
    f.get(key).map(|_| f.get_str(key)).transpose()
}

/// Reads an optional boolean key.
fn gguf_opt_bool(f: &GgufFile, key: &str) -> Result<Option<bool>> {
    f.get(key).map(|_| f.get_bool(key)).transpose()
}

/// Whether tokenizing with `add_special` puts BOS in front and EOS at the end, for the
/// vocabulary of a GGUF file (its keys, else llama.cpp's defaults for its kind).
pub(crate) fn gguf_add_bos_eos(f: &GgufFile) -> Result<(bool, bool)> {
    let model = f.get_str("tokenizer.ggml.model")?;
    let pre = gguf_opt_str(f, "tokenizer.ggml.pre")?;
    let defaults =
        KindDefaults::new(model, pre).map_err(|e| Error::Model(format!("{}: {e}", f.path())))?;
    Ok((
        gguf_opt_bool(f, "tokenizer.ggml.add_bos_token")?.unwrap_or(defaults.add_bos),
        gguf_opt_bool(f, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
    ))
}

/// A token's type as llama.cpp uses it: tokens it recognises as end-of-turn or FIM markers are
/// control tokens whatever the file says. (llama.cpp makes only the first FIM candidate of each
/// kind it meets a control token, and none where the file gives that token's id; here all are.)
fn effective_type(text: &str, file_type: i32) -> i32 {
    let marker = EOG_TEXTS.contains(&text)
        || FIM_TEXTS.contains(&text)
        || FIM_EOG_TEXTS.iter().any(|texts| texts.contains(&text));
    if marker {
        token_type::CONTROL
    } else {
        file_type
    }
}

/// Whether llama.cpp takes the file for a Phi 3 model: its `general.name`, in lower case,
/// contains `phi-3` or `phi3`.
fn phi3_named(f: &GgufFile) -> Result<bool> {
    let name = gguf_opt_str(f, "general.name")?
        .unwrap_or_default()
        .to_ascii_lowercase();
    Ok(name.contains("phi-3") || name.contains("phi3"))
}

/// The tokens llama.cpp right-strips in a Phi 3 vocabulary: every control, user-defined and
/// unknown token, and `</s>`, except `<unk>`, `<s>` and `<|endoftext|>`.
fn phi3_rstrip(tokens: &[String], types: &[i32]) -> Vec<u32> {
    tokens
        .iter()
        .enumerate()
        .filter(|&(i, t)| {
            let ty = effective_type(t, types.get(i).copied().unwrap_or(token_type::NORMAL));
            let special = matches!(
                ty,
                token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN
            );
            (special || t == "</s>") && !matches!(t.as_str(), "<unk>" | "<s>" | "<|endoftext|>")
        })
        .map(|(i, _)| i as u32)
        .collect()
}

/// Reads an optional token id key; an id outside the vocabulary is ignored with a warning, as
/// llama.cpp does.
fn gguf_token_id(f: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>> {
    if f.get(key).is_none() {
        return Ok(None);
    }
    let id = f.get_u32(key)?;
    if (id as usize) < n_vocab {
        Ok(Some(id))
    } else {
        log::warn!(
            "{}: {key} = {id} is outside the vocabulary ({n_vocab}); ignored",
            f.path()
        );
        Ok(None)
    }
}

impl VocabSpec {
    /// Reads the `tokenizer.ggml.*` metadata of a GGUF file, with llama.cpp's defaults for
    /// absent keys and its end-of-generation set (EOS, EOT/EOM and FIM pad/repo/separator
    /// tokens, and tokens whose text is a known end-of-turn marker), to which the end-of-turn
    /// token of the file's chat format is added. A Phi 3 file's special tokens are
    /// right-stripped.
    pub fn from_gguf(f: &GgufFile) -> Result<VocabSpec> {
        let model = f.get_str("tokenizer.ggml.model")?.to_owned();
        let pre = gguf_opt_str(f, "tokenizer.ggml.pre")?.map(str::to_owned);
        let in_file = |e: Error| Error::Model(format!("{}: {e}", f.path()));
        let defaults = KindDefaults::new(&model, pre.as_deref()).map_err(in_file)?;
        if let (Some(_), "gpt2") = (&pre, model.as_str()) {
            // Only byte-level BPE vocabularies have a pre-tokenizer; an unknown one is refused,
            // as llama.cpp refuses it.
            PreTokenizer::of_spec(pre.as_deref()).map_err(in_file)?;
        }
        let tokens: Vec<String> = f
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let n = tokens.len();
        let token_types = match f.get("tokenizer.ggml.token_type") {
            Some(_) => f.get_i32_array("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        };
        let scores = match f.get("tokenizer.ggml.scores") {
            Some(_) => f.get_f32_array("tokenizer.ggml.scores")?,
            None => Vec::new(),
        };
        let merges = match f.get("tokenizer.ggml.merges") {
            Some(_) => f
                .get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(String::from)
                .collect(),
            None => Vec::new(),
        };
        let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let bos = gguf_token_id(f, "tokenizer.ggml.bos_token_id", n)?.or(in_vocab(defaults.bos));
        let eos = gguf_token_id(f, "tokenizer.ggml.eos_token_id", n)?.or(in_vocab(defaults.eos));
        let unk =
            gguf_token_id(f, "tokenizer.ggml.unknown_token_id", n)?.or(in_vocab(defaults.unk));
        let (add_bos, add_eos) = gguf_add_bos_eos(f)?;
        let add_space_prefix = gguf_opt_bool(f, "tokenizer.ggml.add_space_prefix")?
            .unwrap_or(defaults.add_space_prefix);

        let mut keyed = Vec::new();
        for key in ["eot", "eom"] {
            keyed.extend(gguf_token_id(
                f,
                &format!("tokenizer.ggml.{key}_token_id"),
                n,
            )?);
        }
        for (key, texts) in ["fim_pad", "fim_rep", "fim_sep"].iter().zip(FIM_EOG_TEXTS) {
            match gguf_token_id(f, &format!("tokenizer.ggml.{key}_token_id"), n)? {
                Some(id) => keyed.push(id),
                None => keyed.extend(
                    tokens
                        .iter()
                        .position(|t| texts.contains(&t.as_str()))
                        .map(|i| i as u32),
                ),
            }
        }
        // The token that ends a turn in the file's chat format.
        if let (_, Some(format)) = crate::chat::gguf_template(f)? {
            let end = format.end_of_turn();
            keyed.extend(tokens.iter().rposition(|t| t == end).map(|i| i as u32));
        }
        let rstrip = if phi3_named(f)? {
            phi3_rstrip(&tokens, &token_types)
        } else {
            Vec::new()
        };
        let mut spec = VocabSpec {
            model,
            pre,
            tokens,
            token_types,
            scores,
            merges,
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
            eog: Vec::new(),
            rstrip,
        };
        spec.eog = spec.llama_cpp_eog(&keyed);
        Ok(spec)
    }

    /// llama.cpp's end-of-generation set for this vocabulary: the `extra` ids (EOT, EOM, FIM
    /// tokens the file names), EOS, and every token whose text is a known end-of-turn marker
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>` ...). Sorted, no repeats.
    pub fn llama_cpp_eog(&self, extra: &[u32]) -> Vec<u32> {
        let mut set: BTreeSet<u32> = extra.iter().copied().collect();
        set.extend(self.eos);
        for (i, t) in self.tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&t.as_str()) {
                set.insert(i as u32);
            }
        }
        set.into_iter().collect()
    }
}

/// How the text of a vocabulary is turned into symbols to merge.
#[derive(Debug)]
enum Kind {
    /// Byte-level BPE.
    Bpe {
        pre: PreTokenizer,
        merges: bpe::Merges,
        byte_chars: Box<[char; 256]>,
    },
    /// SentencePiece-style BPE; the byte tokens `<0xXX>` by byte.
    Spm {
        byte_tokens: Box<[Option<u32>; 256]>,
    },
}

/// A piece of the text being tokenized: plain text, or a special token cut out of it.
#[derive(Debug, Clone, Copy)]
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A tokenizer: text to token ids and back, as llama.cpp does it for the same GGUF vocabulary.
#[derive(Debug)]
pub struct Tokenizer {
    kind: Kind,
    tokens: Vec<String>,
    types: Vec<i32>,
    token_to_id: HashMap<String, u32>,
    scores: Vec<f32>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    /// Special tokens after which white space is dropped.
    rstrip: BTreeSet<u32>,
    /// Each token's bytes when decoded.
    pieces: Vec<Vec<u8>>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    eog: BTreeSet<u32>,
}

impl Tokenizer {
    /// Builds a tokenizer. Fails when the model kind is unknown, the vocabulary is empty, an
    /// array's length does not match the vocabulary, or a special token id is outside it.
    pub fn new(spec: VocabSpec) -> Result<Tokenizer> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(Error::Model("tokenizer: the vocabulary is empty".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(Error::Model(format!(
                "tokenizer: {n} tokens do not fit u32 ids"
            )));
        }
        for (what, len) in [
            ("token_type", spec.token_types.len()),
            ("scores", spec.scores.len()),
        ] {
            if len != 0 && len != n {
                return Err(Error::Model(format!(
                    "tokenizer: {len} {what} entries for {n} tokens"
                )));
            }
        }
        let check = |what: &str, id: Option<u32>| -> Result<()> {
            match id {
                Some(i) if i as usize >= n => Err(Error::Model(format!(
                    "tokenizer: {what} token {i} is outside the vocabulary ({n} tokens)"
                ))),
                _ => Ok(()),
            }
        };
        check("BOS", spec.bos)?;
        check("EOS", spec.eos)?;
        check("unknown", spec.unk)?;
        for &id in &spec.eog {
            check("end-of-generation", Some(id))?;
        }
        for &id in &spec.rstrip {
            check("right-stripped", Some(id))?;
        }
        if spec.add_bos && spec.bos.is_none() {
            return Err(Error::Model(
                "tokenizer: add_bos is set but there is no BOS token".into(),
            ));
        }
        if spec.add_eos && spec.eos.is_none() {
            return Err(Error::Model(
                "tokenizer: add_eos is set but there is no EOS token".into(),
            ));
        }

        // Empty token texts get a placeholder, as in llama.cpp, so that they never match.
        let tokens: Vec<String> = spec
            .tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t
                }
            })
            .collect();
        let mut types = if spec.token_types.is_empty() {
            vec![token_type::NORMAL; n]
        } else {
            spec.token_types
        };
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            *ty = effective_type(t, *ty);
        }
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            token_to_id.insert(t.clone(), i as u32);
        }

        let (kind, clean_spaces) = match spec.model.as_str() {
            "gpt2" => {
                let pre = PreTokenizer::of_spec(spec.pre.as_deref())?;
                let clean = pre.clean_spaces;
                let merges = bpe::Merges::new(&spec.merges);
                log::debug!(
                    "tokenizer: byte-level BPE, {n} tokens, {} merges",
                    merges.len()
                );
                (
                    Kind::Bpe {
                        pre,
                        merges,
                        byte_chars: Box::new(bpe::byte_chars()),
                    },
                    clean,
                )
            }
            "llama" => {
                let mut byte_tokens = Box::new([None; 256]);
                for (b, slot) in (0..=255u8).zip(byte_tokens.iter_mut()) {
                    // `<0xXX>`, else the byte itself as a token (ASCII only).
                    *slot = token_to_id
                        .get(&format!("<0x{b:02X}>"))
                        .copied()
                        .or_else(|| {
                            b.is_ascii()
                                .then(|| token_to_id.get(&char::from(b).to_string()))
                                .flatten()
                                .copied()
                        });
                }
                (Kind::Spm { byte_tokens }, false)
            }
            other => {
                return Err(Error::Model(format!(
                    "tokenizer model '{other}' is not supported (only gpt2 and llama)"
                )))
            }
        };

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(
                    types[i as usize],
                    token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN
                )
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));

        let mut eog: BTreeSet<u32> = spec.eog.into_iter().collect();
        eog.extend(spec.eos);

        let mut tok = Tokenizer {
            kind,
            tokens,
            types,
            token_to_id,
            scores: spec.scores,
            specials,
            rstrip: spec.rstrip.into_iter().collect(),
            pieces: Vec::new(),
            bos: spec.bos,
            eos: spec.eos,
            unk: spec.unk,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            add_space_prefix: spec.add_space_prefix,
            clean_spaces,
            eog,
        };
        tok.pieces = (0..n).map(|i| tok.make_piece(i)).collect();
        Ok(tok)
    }

    /// Builds the tokenizer of a GGUF file ([`VocabSpec::from_gguf`] then [`Tokenizer::new`]).
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        Tokenizer::new(VocabSpec::from_gguf(f)?)
    }

    /// The bytes a token decodes to.
    fn make_piece(&self, id: usize) -> Vec<u8> {
        let text = &self.tokens[id];
        match (self.types[id], &self.kind) {
            (token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN, _) => {
                text.as_bytes().to_vec()
            }
            (token_type::NORMAL, Kind::Bpe { .. }) => {
                let mut out = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match bpe::char_byte(c) {
                        Some(b) => out.push(b),
                        // Not a byte character: keep it as it is.
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
            (token_type::NORMAL, Kind::Spm { .. }) => text.replace('▁', " ").into_bytes(),
            (token_type::BYTE, Kind::Spm { .. }) => text
                .strip_prefix("<0x")
                .and_then(|s| s.strip_suffix('>'))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map_or_else(Vec::new, |b| vec![b]),
            // Unused, undefined and (in BPE) byte tokens decode to nothing, as in llama.cpp.
            _ => Vec::new(),
        }
    }

    /// The number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether `add_special` puts BOS in front of the text.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generation ends at `id` (EOS, end-of-turn and similar tokens).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation tokens, in increasing order.
    pub fn eog_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// Whether `id` is a control token (BOS, EOS, `<|im_start|>` ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&token_type::CONTROL)
    }

    /// The text of a token as stored in the vocabulary (byte characters, `▁`, `<0xXX>`).
    pub fn token_text(&self, id: u32) -> Result<&str> {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .ok_or_else(|| self.bad_id(id))
    }

    /// The token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    fn bad_id(&self, id: u32) -> Error {
        Error::Invalid(format!(
            "token id {id} is outside the vocabulary ({} tokens)",
            self.n_vocab()
        ))
    }

    /// The bytes token `id` decodes to; special tokens give their text. A UTF-8 character may
    /// be split over several tokens, so the bytes need not be valid UTF-8 on their own.
    pub fn token_to_piece(&self, id: u32) -> Result<&[u8]> {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or_else(|| self.bad_id(id))
    }

    /// Tokenizes `text`. With `add_special`, BOS and EOS are added where the vocabulary asks
    /// for them; with `parse_special`, control tokens written in the text (`<|im_start|>`)
    /// become their ids instead of being tokenized as text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.kind {
            Kind::Bpe {
                pre,
                merges,
                byte_chars,
            } => {
                let mut encoded = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => {
                            for word in pre.split(t) {
                                encoded.clear();
                                encoded.extend(word.bytes().map(|b| byte_chars[b as usize]));
                                self.bpe_word(&encoded, pre.ignore_merges, merges, &mut out);
                            }
                        }
                    }
                }
            }
            Kind::Spm { byte_tokens } => {
                // A space goes before the first text and before text after a special token.
                let mut after_special = true;
                for frag in fragments {
                    match frag {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 3);
                            if self.add_space_prefix && after_special {
                                s.push('▁');
                            }
                            s.extend(t.chars().map(|c| if c == ' ' { '▁' } else { c }));
                            self.spm_text(&s, byte_tokens, &mut out)?;
                            after_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Cuts special tokens out of `text`, longest first.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = Vec::new();
        if !text.is_empty() {
            frags.push(Fragment::Text(text));
        }
        for &id in &self.specials {
            if !parse_special && self.types[id as usize] != token_type::USER_DEFINED {
                continue;
            }
            let pat = self.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(pat)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(mut rest) => {
                        while let Some(at) = rest.find(pat) {
                            if at > 0 {
                                next.push(Fragment::Text(&rest[..at]));
                            }
                            next.push(Fragment::Token(id));
                            rest = &rest[at + pat.len()..];
                            if self.rstrip.contains(&id) {
                                // C's `isspace`, as llama.cpp strips.
                                rest = rest
                                    .trim_start_matches([' ', '\t', '\n', '\x0B', '\x0C', '\r']);
                            }
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    token => next.push(token),
                }
            }
            frags = next;
        }
        frags
    }

    /// One byte-encoded BPE word.
    fn bpe_word(&self, word: &str, ignore_merges: bool, merges: &bpe::Merges, out: &mut Vec<u32>) {
        if ignore_merges {
            if let Some(&id) = self.token_to_id.get(word) {
                out.push(id);
                return;
            }
        }
        bpe::merge_word(word, merges, |sym| match self.token_to_id.get(sym) {
            Some(&id) => out.push(id),
            // Not a token: its single bytes, where they are tokens (llama.cpp drops the rest).
            None => {
                let mut buf = [0u8; 4];
                for b in sym.bytes().filter(u8::is_ascii) {
                    let s: &str = char::from(b).encode_utf8(&mut buf);
                    out.extend(self.token_to_id.get(s).copied());
                }
            }
        });
    }

    /// One SentencePiece text fragment (spaces already written as `▁`).
    fn spm_text(
        &self,
        text: &str,
        byte_tokens: &[Option<u32>; 256],
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let mut missing = None;
        spm::merge(text, &self.token_to_id, &self.scores, |sym| {
            match self.token_to_id.get(sym) {
                Some(&id) => out.push(id),
                None => {
                    for b in sym.bytes() {
                        match byte_tokens[b as usize].or(self.unk) {
                            Some(id) => out.push(id),
                            None => missing = Some(b),
                        }
                    }
                }
            }
        });
        match missing {
            Some(b) => Err(Error::Model(format!(
                "tokenizer: the vocabulary has no token for byte 0x{b:02X} and no unknown token"
            ))),
            None => Ok(()),
        }
    }

    /// The bytes `ids` decode to, as llama.cpp's detokenizer gives them (special tokens as
    /// text; a `llama` vocabulary with `add_space_prefix` drops the first token's leading
    /// space; some BPE pre-tokenizers remove spaces before punctuation).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_to_piece(id)?;
            let strip = i == 0 && self.add_space_prefix && piece.first() == Some(&b' ');
            out.extend_from_slice(if strip { &piece[1..] } else { piece });
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        Ok(out)
    }

    /// The text `ids` decode to ([`Tokenizer::decode_bytes`]); bytes that are not valid UTF-8
    /// (a character cut at the end) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }
}

/// llama.cpp's `clean_up_tokenization_spaces`: drops the space in ` ?`, ` !`, ` .`, ` ,`, the
/// spaces around a lone `'`, and the space before `'s`, `'m`, `'re`, `'ve`.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // Each pass reads the text as the previous one left it.
    if text.len() < 2 {
        return;
    }
    let src = std::mem::take(text);
    let mut out = vec![src[0]];
    for i in 1..src.len() {
        if src[i - 1] == b' ' && matches!(src[i], b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(src[i]);
    }

    let mut src = std::mem::take(&mut out);
    let mut out = Vec::with_capacity(src.len());
    if let Some(&first) = src.first() {
        out.push(first);
    }
    let mut i = 1;
    while i < src.len() {
        let x = src[i];
        if x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            out.push(x);
            // The space after the quote is dropped too, and no longer counts as a space
            // before the next character.
            src[i + 1] = 0;
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }

    let src = out;
    let mut out = Vec::with_capacity(src.len());
    if let Some(&first) = src.first() {
        out.push(first);
    }
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let x2 = src.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || (x2.is_some() && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

/// Turns a stream of token ids into text, holding back bytes until they form whole UTF-8
/// characters. Invalid byte sequences become U+FFFD. Decodes each token on its own, without
/// the first-token and clean-up rules of [`Tokenizer::decode`].
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        StreamDecoder::default()
    }

    /// Adds token `id`; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.pending
            .extend_from_slice(tokenizer.token_to_piece(id)?);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return Ok(out);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just checked to be valid UTF-8.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return Ok(out);
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: returns what is still pending (an incomplete character as U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests;
