//! Pre-tokenizers of byte-level BPE vocabularies: cut text into words before BPE merges.
//!
//! A pre-tokenizer is a list of stages, each a regex in llama.cpp (`llm_tokenizer_bpe`). Every
//! stage splits each piece the previous stage made: the regex's matches *and* the text between
//! them become pieces, and a later stage never joins pieces. The stages here are hand-written
//! scanners with the regexes' semantics over Unicode general categories (`\p{L}`, `\p{N}`,
//! `\p{P}`) and White_Space (`\s`); the end of a piece is the end of the text for `(?!\S)`.

use tessera_core::{Error, Result};
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// `\p{L}`.
fn is_letter(c: char) -> bool {
    c.general_category_group() == GeneralCategoryGroup::Letter
}

/// `\p{N}`.
fn is_number(c: char) -> bool {
    c.general_category_group() == GeneralCategoryGroup::Number
}

/// `\s`.
fn is_space(c: char) -> bool {
    c.is_whitespace()
}

/// `[\p{P}\$\+<=>\^~\|]` (the first stage of llama.cpp's default pre-tokenizer).
fn is_punct_or_ascii_symbol(c: char) -> bool {
    c.general_category_group() == GeneralCategoryGroup::Punctuation
        || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
}

/// One splitting stage.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// Maximal runs of characters of a class, cut into chunks of at most `chunk` characters
    /// (`0`: uncut): `\p{N}` is `Runs(number, 1)`, `\p{N}+` is `Runs(number, 0)`,
    /// `[0-9][0-9][0-9]` is `Runs(ascii digit, 3)`.
    Runs(fn(char) -> bool, usize),
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` with `D` digits at most
    /// (3 for Llama 3, 1 for Qwen 2).
    Llama3 {
        /// The most digits in one piece.
        digits: usize,
    },
    /// GPT-4o (o200k): `[^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`, where U is a letter other than
    /// a-z, L a letter other than A-Z (a letter outside ASCII is both, as llama.cpp's regexes
    /// see it) and C a contraction (`'s 't 're 've 'm 'll 'd`, either case) after a word.
    Gpt4o,
}

/// A named pre-tokenizer: its stages and the decoding flags llama.cpp ties to the name.
#[derive(Debug, Clone)]
pub(crate) struct PreTokenizer {
    stages: Vec<Stage>,
    /// Whether decoding removes spaces before punctuation (llama.cpp's `clean_spaces`).
    pub(crate) clean_spaces: bool,
    /// Whether a word that is a token as a whole skips the merges (`ignore_merges`).
    pub(crate) ignore_merges: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer of a `tokenizer.ggml.pre` name, as llama.cpp maps it; `None` for a
    /// name not mapped here.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        use Stage::*;
        let digits_one: Stage = Runs(is_number, 1);
        let (stages, clean_spaces, ignore_merges) = match name {
            "default" => return Some(Self::default_bpe()),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "jina-v1-en" | "jina-v2-code"
            | "roberta-bpe" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => {
                (vec![Gpt2], true, false)
            }
            "trillion" | "granite-docling" => (vec![Gpt2], false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (vec![digits_one, Gpt2], true, false)
            }
            "smollm" | "command-r" => (vec![digits_one, Gpt2], false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (vec![Llama3 { digits: 3 }], true, true),
            "dbrx" | "smaug-bpe" => (vec![Llama3 { digits: 3 }], true, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
                (vec![Llama3 { digits: 1 }], false, false)
            }
            "stablelm2" | "megrez" => (vec![Llama3 { digits: 1 }], true, false),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => (vec![Gpt4o], false, false),
            _ => return None,
        };
        Some(PreTokenizer {
            stages,
            clean_spaces,
            ignore_merges,
        })
    }

    /// The pre-tokenizer a vocabulary names: `None` (no `tokenizer.ggml.pre`) is llama.cpp's
    /// default, with a warning as llama.cpp gives; a name it does not map is an error naming it.
    pub(crate) fn of_spec(name: Option<&str>) -> Result<Self> {
        match name {
            None => {
                log::warn!("tokenizer: the vocabulary names no pre-tokenizer; using 'default'");
                Ok(Self::default_bpe())
            }
            Some(name) => Self::from_name(name).ok_or_else(|| {
                Error::Model(format!(
                    "tokenizer: pre-tokenizer '{name}' is not supported"
                ))
            }),
        }
    }

    /// llama.cpp's default BPE pre-tokenizer (`default`, and a vocabulary that names none).
    pub(crate) fn default_bpe() -> Self {
        PreTokenizer {
            stages: vec![
                Stage::Runs(is_punct_or_ascii_symbol, 0),
                Stage::Gpt2,
                Stage::Runs(is_number, 0),
                Stage::Runs(|c| c.is_ascii_digit(), 3),
            ],
            clean_spaces: true,
            ignore_merges: false,
        }
    }

    /// Cuts `text` into words; their concatenation is `text`.
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = vec![chars.len()];
        for stage in &self.stages {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            let mut start = 0;
            for len in pieces {
                let seg = &chars[start..start + len];
                match *stage {
                    Stage::Runs(class, chunk) => split_runs(seg, class, chunk, &mut next),
                    Stage::Gpt2 => split_gpt2(seg, &mut next),
                    Stage::Llama3 { digits } => split_llama3(seg, digits, &mut next),
                    Stage::Gpt4o => split_gpt4o(seg, &mut next),
                }
                start += len;
            }
            pieces = next;
        }
        // Piece lengths (in chars) back to string slices.
        let mut out = Vec::with_capacity(pieces.len());
        let mut rest = text;
        for len in pieces {
            let bytes: usize = rest.chars().take(len).map(char::len_utf8).sum();
            let (piece, tail) = rest.split_at(bytes);
            out.push(piece);
            rest = tail;
        }
        out
    }
}

/// Appends the lengths of the pieces of `seg` cut at `ends` (increasing, the last = `seg.len()`).
struct Cutter<'a> {
    out: &'a mut Vec<usize>,
    prev: usize,
}

impl Cutter<'_> {
    /// Ends the current piece at `end` (nothing when it would be empty).
    fn cut(&mut self, end: usize) {
        if end > self.prev {
            self.out.push(end - self.prev);
            self.prev = end;
        }
    }
}

/// Maximal runs of `class`, in chunks of `chunk` (`0`: whole runs), and the text between.
fn split_runs(seg: &[char], class: fn(char) -> bool, chunk: usize, out: &mut Vec<usize>) {
    let mut cut = Cutter { out, prev: 0 };
    let mut pos = 0;
    while pos < seg.len() {
        if class(seg[pos]) {
            cut.cut(pos);
            let mut run = 0;
            while pos < seg.len() && class(seg[pos]) {
                pos += 1;
                run += 1;
                if chunk > 0 && run == chunk {
                    cut.cut(pos);
                    run = 0;
                }
            }
            cut.cut(pos);
        } else {
            pos += 1;
        }
    }
    cut.cut(seg.len());
}

/// The character classes the scanners look at; `None` past the end of the piece.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

fn class_at(seg: &[char], pos: usize) -> Option<Class> {
    seg.get(pos).map(|&c| {
        if is_space(c) {
            Class::Space
        } else if is_letter(c) {
            Class::Letter
        } else if is_number(c) {
            Class::Number
        } else {
            Class::Other
        }
    })
}

/// The length of a contraction (`'s 't 'm 'd 're 've 'll`) at `pos`, or 0. With `fold`, the
/// letters match in either case.
fn contraction_at(seg: &[char], pos: usize, fold: bool) -> usize {
    if seg.get(pos) != Some(&'\'') {
        return 0;
    }
    let at = |i: usize| {
        seg.get(pos + i)
            .map(|&c| if fold { c.to_ascii_lowercase() } else { c })
    };
    match (at(1), at(2)) {
        (Some('s' | 't' | 'm' | 'd'), _) => 2,
        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => 3,
        _ => 0,
    }
}

/// The number of whitespace characters from `pos` on.
fn spaces_from(seg: &[char], pos: usize) -> usize {
    seg[pos..].iter().take_while(|&&c| is_space(c)).count()
}

/// The GPT-2 pattern over one piece.
/// ` ?[^\s\p{L}\p{N}]+[trail]*` at `pos`: the end of an optional space, a run of what is
/// neither space, letter nor number, and the `trail` characters after it; None where no such
/// run starts there.
fn other_run(seg: &[char], pos: usize, trail: &[char]) -> Option<usize> {
    let mut end = pos + usize::from(seg[pos] == ' ');
    if class_at(seg, end) != Some(Class::Other) {
        return None;
    }
    while class_at(seg, end) == Some(Class::Other) {
        end += 1;
    }
    while seg.get(end).is_some_and(|c| trail.contains(c)) {
        end += 1;
    }
    Some(end)
}

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at `pos` (or one character where no space starts there): the
/// end of the spaces through their last newline, else all but the last space where a non-space
/// follows, else all of them.
fn space_run(seg: &[char], pos: usize) -> usize {
    let n = spaces_from(seg, pos).max(1);
    let last_newline = seg[pos..pos + n]
        .iter()
        .rposition(|&c| c == '\r' || c == '\n');
    pos + match last_newline {
        Some(i) => i + 1,
        None if n > 1 && pos + n < seg.len() => n - 1,
        None => n,
    }
}

fn split_gpt2(seg: &[char], out: &mut Vec<usize>) {
    let mut cut = Cutter { out, prev: 0 };
    let mut pos = 0;
    while pos < seg.len() {
        let n = contraction_at(seg, pos, false);
        if n > 0 {
            pos += n;
            cut.cut(pos);
            continue;
        }
        // ` ?X+` for X in letters, numbers, others: the optional space takes the class of
        // what follows it.
        let lead = usize::from(seg[pos] == ' ');
        let class = class_at(seg, pos + lead);
        match class {
            Some(k @ (Class::Letter | Class::Number | Class::Other)) => {
                pos += lead;
                while class_at(seg, pos) == Some(k) {
                    pos += 1;
                }
                cut.cut(pos);
            }
            _ => {
                // `\s+(?!\S)|\s+`: a run followed by more text leaves its last space to the
                // next piece.
                let n = spaces_from(seg, pos).max(1);
                pos += if n > 1 && pos + n < seg.len() {
                    n - 1
                } else {
                    n
                };
                cut.cut(pos);
            }
        }
    }
}

/// The Llama 3 pattern over one piece, with at most `digits` digits a piece.
fn split_llama3(seg: &[char], digits: usize, out: &mut Vec<usize>) {
    let mut cut = Cutter { out, prev: 0 };
    let mut pos = 0;
    while pos < seg.len() {
        let n = contraction_at(seg, pos, true);
        if n > 0 {
            pos += n;
            cut.cut(pos);
            continue;
        }
        let c = seg[pos];
        let here = class_at(seg, pos);
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if c != '\r'
            && c != '\n'
            && here != Some(Class::Number)
            && (here == Some(Class::Letter) || class_at(seg, pos + 1) == Some(Class::Letter))
        {
            pos += 1;
            while class_at(seg, pos) == Some(Class::Letter) {
                pos += 1;
            }
            cut.cut(pos);
            continue;
        }
        // `\p{N}{1,D}`
        if here == Some(Class::Number) {
            let mut run = 0;
            while class_at(seg, pos) == Some(Class::Number) {
                pos += 1;
                run += 1;
                if run == digits {
                    cut.cut(pos);
                    run = 0;
                }
            }
            cut.cut(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        if let Some(end) = other_run(seg, pos, &['\r', '\n']) {
            pos = end;
            cut.cut(pos);
            continue;
        }
        pos = space_run(seg, pos);
        cut.cut(pos);
    }
}

/// GPT-4o's "upper" letters: any letter but a-z.
fn is_upper_word(c: char) -> bool {
    is_letter(c) && !c.is_ascii_lowercase()
}

/// GPT-4o's "lower" letters: any letter but A-Z.
fn is_lower_word(c: char) -> bool {
    is_letter(c) && !c.is_ascii_uppercase()
}

/// The end of the run of `class` from `pos`.
fn run_end(seg: &[char], pos: usize, class: fn(char) -> bool) -> usize {
    pos + seg[pos..].iter().take_while(|&&c| class(c)).count()
}

/// The end of GPT-4o's word at `pos` (its two letter alternatives), or None. The leading
/// character may be anything but a newline, letter or number; then `U*L+` as a backtracking
/// regex matches it: the longest run of U that a L can follow (a letter outside ASCII is both),
/// then the run of L; failing that `U+L*`.
fn gpt4o_word(seg: &[char], pos: usize) -> Option<usize> {
    let c = seg[pos];
    let lead = !matches!(c, '\r' | '\n') && !is_letter(c) && !is_number(c);
    let start = pos + usize::from(lead && seg.get(pos + 1).is_some_and(|&n| is_letter(n)));
    let upper_end = run_end(seg, start, is_upper_word);
    let lower_start = (start..=upper_end)
        .rev()
        .find(|&k| seg.get(k).is_some_and(|&c| is_lower_word(c)));
    let end = match lower_start {
        Some(k) => run_end(seg, k, is_lower_word),
        None if upper_end > start => run_end(seg, upper_end, is_lower_word),
        None => return None,
    };
    Some(end + contraction_at(seg, end, true))
}

/// The GPT-4o pattern over one piece.
fn split_gpt4o(seg: &[char], out: &mut Vec<usize>) {
    let mut cut = Cutter { out, prev: 0 };
    let mut pos = 0;
    while pos < seg.len() {
        if let Some(end) = gpt4o_word(seg, pos) {
            pos = end;
            cut.cut(pos);
            continue;
        }
        // `\p{N}{1,3}`
        if class_at(seg, pos) == Some(Class::Number) {
            let mut run = 0;
            while class_at(seg, pos) == Some(Class::Number) && run < 3 {
                pos += 1;
                run += 1;
            }
            cut.cut(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
        if let Some(end) = other_run(seg, pos, &['\r', '\n', '/']) {
            pos = end;
            cut.cut(pos);
            continue;
        }
        pos = space_run(seg, pos);
        cut.cut(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(name: &str, text: &str) -> Vec<String> {
        PreTokenizer::from_name(name)
            .unwrap()
            .split(text)
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn gpt2_words_spaces_and_contractions() {
        assert_eq!(
            split("gpt-2", "Hello world's  end!?  \n x"),
            ["Hello", " world", "'s", " ", " end", "!?", "  \n", " x"]
        );
        assert_eq!(split("gpt-2", "a   "), ["a", "   "]);
        assert_eq!(split("gpt-2", " "), [" "]);
        assert_eq!(split("gpt-2", ""), Vec::<String>::new());
        assert_eq!(split("gpt-2", "x 12ab"), ["x", " 12", "ab"]);
        assert_eq!(split("gpt-2", "I'M"), ["I", "'", "M"]);
    }

    #[test]
    fn smollm_splits_every_digit_first() {
        assert_eq!(
            split("smollm", "abc 2024-01"),
            ["abc", " ", "2", "0", "2", "4", "-", "0", "1"]
        );
        // The space before a digit ends its own piece, so `\s+(?!\S)` keeps both spaces.
        assert_eq!(split("smollm", "a  1"), ["a", "  ", "1"]);
    }

    #[test]
    fn llama3_digit_groups_letters_and_newlines() {
        assert_eq!(split("llama3", "12345 x"), ["123", "45", " x"]);
        assert_eq!(split("llama3", "I'M ok"), ["I", "'M", " ok"]);
        assert_eq!(split("llama3", "a.\n\nb"), ["a", ".\n\n", "b"]);
        assert_eq!(split("llama3", "a \n  b"), ["a", " \n", " ", " b"]);
        assert_eq!(split("llama3", "(x)"), ["(x", ")"]);
        assert_eq!(split("qwen2", "123"), ["1", "2", "3"]);
    }

    #[test]
    fn gpt4o_case_runs_contractions_and_digit_groups() {
        assert_eq!(
            split("gpt-4o", "HelloWorld XMLHttp iPhone I'M they'LL 12345"),
            ["Hello", "World", " XMLHttp", " i", "Phone", " I'M", " they'LL", " ", "123", "45"]
        );
        assert_eq!(split("gpt-4o", "ABC def"), ["ABC", " def"]);
        assert_eq!(
            split("gpt-4o", "a/b//\n\n  x"),
            ["a", "/b", "//\n\n", " ", " x"]
        );
        assert_eq!(split("gpt-4o", "\"Éclair\""), ["\"Éclair", "\""]);
    }

    #[test]
    fn default_stages() {
        assert_eq!(
            split("default", "a+b 12345"),
            ["a", "+", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn unknown_names_are_none() {
        assert!(PreTokenizer::from_name("no-such-pre").is_none());
    }
}
