//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`): merges by token score.
//!
//! The text (spaces already written as `▁`) starts as one symbol per character. The adjacent
//! pair whose concatenation is a token with the highest score (the leftmost among equals) is
//! merged, until no pair forms a token. A final symbol that is a token gives its id; any other
//! gives the byte tokens (`<0xXX>`) of its UTF-8 bytes.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use super::symbols::{self, Symbol};

/// A candidate merge: higher score first, then the leftmost.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Bigram {
    fn key(&self) -> (f32, Reverse<usize>) {
        (self.score, Reverse(self.left))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.key(), other.key());
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
    }
}

/// Merges `text` by score; calls `emit` with each final symbol's text in order.
pub(crate) fn merge(
    text: &str,
    token_to_id: &HashMap<String, u32>,
    scores: &[f32],
    emit: impl FnMut(&str),
) {
    let mut syms = symbols::chars(text);
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram>, syms: &[Symbol], left: usize, right: usize| {
        let (l, r) = (syms[left], syms[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(&id) = token_to_id.get(joined) {
            let score = scores.get(id as usize).copied().unwrap_or(0.0);
            queue.push(Bigram {
                score,
                left,
                right,
                size: joined.len(),
            });
        }
    };
    for i in 1..syms.len() {
        push(&mut queue, &syms, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (syms[b.left], syms[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        let (before, after) = symbols::merge_pair(&mut syms, b.left, b.right);
        if let Some(p) = before {
            push(&mut queue, &syms, p, b.left);
        }
        if let Some(n) = after {
            push(&mut queue, &syms, b.left, n);
        }
    }
    symbols::emit_all(text, &syms, emit);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(text: &str, vocab: &[(&str, f32)]) -> Vec<String> {
        let map: HashMap<String, u32> = vocab
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (t.to_string(), i as u32))
            .collect();
        let scores: Vec<f32> = vocab.iter().map(|v| v.1).collect();
        let mut out = Vec::new();
        merge(text, &map, &scores, |s| out.push(s.to_owned()));
        out
    }

    #[test]
    fn merges_highest_score_first() {
        let v = [("ab", -1.0), ("bc", -0.5), ("cd", -3.0)];
        assert_eq!(merged("abcd", &v), ["a", "bc", "d"]);
        let v = [("ab", -0.1), ("bc", -0.5), ("abc", -3.0)];
        assert_eq!(merged("abc", &v), ["abc"]);
        // Equal scores: the leftmost pair.
        assert_eq!(merged("aaa", &[("aa", -1.0)]), ["aa", "a"]);
        assert_eq!(merged("", &[("aa", -1.0)]), Vec::<String>::new());
    }
}
