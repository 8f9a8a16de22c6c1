//! The symbol list that both merging tokenizers work on (BPE merging by rank, SentencePiece by
//! score): the text's characters as byte ranges, each linked to its neighbours, merged in pairs
//! until no pair of neighbours forms a known token.

/// A symbol: a byte range of the text, linked to its neighbours; `len == 0` once merged into
/// its left neighbour.
#[derive(Clone, Copy)]
pub(super) struct Symbol {
    /// Its first byte in the text.
    pub start: usize,
    /// Its length in bytes (0: merged away).
    pub len: usize,
    /// The symbol before it, if any.
    pub prev: Option<usize>,
    /// The symbol after it, if any.
    pub next: Option<usize>,
}

impl Symbol {
    /// Its text within `text`.
    pub fn text<'a>(&self, text: &'a str) -> &'a str {
        &text[self.start..self.start + self.len]
    }
}

/// One symbol per character of `text`, linked in order.
pub(super) fn chars(text: &str) -> Vec<Symbol> {
    let n = text.chars().count();
    text.char_indices()
        .enumerate()
        .map(|(i, (start, c))| Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: (i + 1 < n).then_some(i + 1),
        })
        .collect()
}

/// Merges symbol `right` into `left`, its left neighbour. Returns the merged symbol's new
/// neighbours (before, after): the pairs it now forms.
pub(super) fn merge_pair(
    syms: &mut [Symbol],
    left: usize,
    right: usize,
) -> (Option<usize>, Option<usize>) {
    let r = syms[right];
    syms[left].len += r.len;
    syms[left].next = r.next;
    syms[right].len = 0;
    if let Some(n) = r.next {
        syms[n].prev = Some(left);
    }
    (syms[left].prev, r.next)
}

/// Calls `emit` with the text of each symbol left after merging, in order.
pub(super) fn emit_all(text: &str, syms: &[Symbol], mut emit: impl FnMut(&str)) {
    for s in syms.iter().filter(|s| s.len > 0) {
        emit(s.text(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chars_link_and_merge() {
        let text = "aé b";
        let mut syms = chars(text);
        assert_eq!(syms.len(), 4);
        assert_eq!((syms[1].start, syms[1].len), (1, 2));
        assert_eq!((syms[0].prev, syms[3].next), (None, None));
        assert_eq!(merge_pair(&mut syms, 1, 2), (Some(0), Some(3)));
        assert_eq!(merge_pair(&mut syms, 0, 1), (None, Some(3)));
        let mut out = Vec::new();
        emit_all(text, &syms, |s| out.push(s.to_string()));
        assert_eq!(out, ["aé ", "b"]);
        assert_eq!(syms[3].prev, Some(0));
        assert!(chars("").is_empty());
    }
}
