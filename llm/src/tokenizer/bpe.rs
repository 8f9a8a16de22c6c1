//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the byte-to-character map and the merge
//! loop over one pre-tokenized word.
//!
//! A word's bytes are first written as characters (GPT-2's byte encoder: printable Latin-1
//! bytes stand for themselves, the other 68 bytes for U+0100..U+0143 in byte order), so that
//! every token of the vocabulary is a string of such characters. The merge loop then joins the
//! adjacent pair with the lowest merge rank, the leftmost among equals, until no pair has a
//! rank. A final symbol that is not a token falls back to its single bytes where those are
//! tokens, and is dropped otherwise, as llama.cpp does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::symbols::{self, Symbol};

/// Whether GPT-2's byte encoder writes byte `b` as the character of the same value.
fn printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's byte encoder: the character each byte is written as.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in (0..=255u8).zip(map.iter_mut()) {
        let cp = if printable(b) {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every value is below 0x144, so always a valid scalar value.
        *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    map
}

/// The byte a GPT-2 byte character stands for (the inverse of [`byte_chars`]).
pub(crate) fn char_byte(c: char) -> Option<u8> {
    match u8::try_from(c as u32) {
        Ok(b) if printable(b) => Some(b),
        Ok(_) => None,
        // U+0100 + n stands for the n-th non-printable byte, in byte order.
        Err(_) => {
            let n = (c as u32).checked_sub(0x100)? as usize;
            (0..=255u8).filter(|&b| !printable(b)).nth(n)
        }
    }
}

/// The merge table: the rank of each pair of symbol strings.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    /// Every string that appears in a merge, numbered.
    names: HashMap<String, u32>,
    /// (left, right) names to the merge's rank (its line in the table; the first one wins).
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Reads merge lines `"left right"`. A line without a space past its first byte merges
    /// nothing and is skipped.
    pub(crate) fn new(lines: &[String]) -> Self {
        let mut m = Merges::default();
        for (rank, line) in lines.iter().enumerate() {
            // The separator is searched from the second byte on, so a symbol may be a space.
            let Some(split) = line.bytes().skip(1).position(|b| b == b' ').map(|i| i + 1) else {
                continue;
            };
            let (left, right) = (&line[..split], &line[split + 1..]);
            let l = m.intern(left);
            let r = m.intern(right);
            m.ranks.entry((l, r)).or_insert(rank as u32);
        }
        m
    }

    fn intern(&mut self, s: &str) -> u32 {
        let n = self.names.len() as u32;
        *self.names.entry(s.to_owned()).or_insert(n)
    }

    /// The rank of merging `left` and `right`, if they merge.
    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.names.get(left)?;
        let r = *self.names.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }

    /// The number of merges.
    pub(crate) fn len(&self) -> usize {
        self.ranks.len()
    }
}

/// Merges one encoded word into symbols; calls `emit` with each final symbol's text in order.
pub(crate) fn merge_word(word: &str, merges: &Merges, emit: impl FnMut(&str)) {
    let mut syms = symbols::chars(word);

    // Queue entries (rank, left, right, left length, right length): lowest rank first, then
    // leftmost; the lengths they were made with tell whether they are still current.
    type Entry = Reverse<(u32, usize, usize, usize, usize)>;
    let mut queue: BinaryHeap<Entry> = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<_>, syms: &[Symbol], left: usize, right: usize| {
        if let Some(rank) = merges.rank(syms[left].text(word), syms[right].text(word)) {
            queue.push(Reverse((
                rank,
                left,
                right,
                syms[left].len,
                syms[right].len,
            )));
        }
    };
    for i in 1..syms.len() {
        push(&mut queue, &syms, i - 1, i);
    }
    while let Some(Reverse((_, left, right, left_len, right_len))) = queue.pop() {
        let (l, r) = (syms[left], syms[right]);
        if l.len == 0 || r.len == 0 || l.len != left_len || r.len != right_len {
            continue;
        }
        let (before, after) = symbols::merge_pair(&mut syms, left, right);
        if let Some(p) = before {
            push(&mut queue, &syms, p, left);
        }
        if let Some(n) = after {
            push(&mut queue, &syms, left, n);
        }
    }
    symbols::emit_all(word, &syms, emit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_encoder_matches_gpt2() {
        let m = byte_chars();
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[0], '\u{100}');
        assert_eq!(m[0xAD], '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_byte(m[b as usize]), Some(b));
        }
        assert_eq!(char_byte('\u{144}'), None);
        assert_eq!(char_byte(' '), None);
        let mut all: Vec<char> = m.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    fn merged(word: &str, lines: &[&str]) -> Vec<String> {
        let lines: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        let m = Merges::new(&lines);
        let mut out = Vec::new();
        merge_word(word, &m, |s| out.push(s.to_owned()));
        out
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        assert_eq!(merged("abc", &["b c", "a b"]), ["a", "bc"]);
        assert_eq!(merged("abc", &["a b", "b c"]), ["ab", "c"]);
        assert_eq!(merged("aaa", &["a a"]), ["aa", "a"]);
        assert_eq!(merged("aaaa", &["a a", "aa aa"]), ["aaaa"]);
        assert_eq!(merged("ab", &[]), ["a", "b"]);
        assert_eq!(merged("", &["a b"]), Vec::<String>::new());
        // A line with no separator is skipped, a duplicate keeps its first rank.
        assert_eq!(merged("abc", &["ab", "b c", "a b", "b c"]), ["a", "bc"]);
        // Symbols of two-byte characters.
        assert_eq!(merged("ĠĠa", &["Ġ Ġ", "ĠĠ a"]), ["ĠĠa"]);
    }
}
