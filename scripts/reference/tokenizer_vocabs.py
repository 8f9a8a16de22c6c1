"""Small synthetic vocabularies and llama.cpp's token ids for them, as tokenizer test data.

Byte-level BPE (`gpt2`) vocabularies with the pre-tokenizers `qwen2` (Qwen 2, 2.5 and 3),
`llama-bpe` (Llama 3) and `gpt-4o` (gpt-oss), and a SentencePiece-style (`llama`) vocabulary
named like a Phi 3 file, are written as vocabulary-only GGUF files and tokenized by llama.cpp (llama-cpp-python 0.3.36,
`vocab_only=True`). The BPE merges make every word of the test strings one token and join
every two neighbouring words, so that a word boundary placed differently from llama.cpp's
changes the ids. Writes
llm/tests/data/tokenizer/vocabs.json (the merges, pieces, ids and llama.cpp's decoding of the
ids; the Rust test rebuilds the vocabularies from them).

Run (with the `gguf` and `regex` packages importable):
    python scripts/reference/tokenizer_vocabs.py OUT.json
"""

import collections
import ctypes
import json
import os
import sys
import tempfile

import gguf
import llama_cpp
import regex

TEXTS = [
    "Hello world's  end!?  \n x",
    "I'M ok, YOU'RE fine; they'LL see 'tis 's'S 're' 'VE",
    "12345 3.14159 1,000,000 \u0661\u0662\u0663 \u00bd \u216b x2y",
    "na\u00efve caf\u00e9 fa\u00e7ade \u2014 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u53e5\u8aad\u70b9\u3002",
    "emoji \U0001f680\U0001f525\U0001f44d\U0001f3fd a",
    "tabs\tand\nnewlines\r\n\r\n  \n",
    "   leading and trailing   ",
    "def f(x):\n    return x ** 2\n",
    "a\u00a0b\u3000c\u2028d \u0085e",
    "<|im_start|>user\nhi<|im_end|>\n",
    "x  <|im_end|>  y <|im_end|>",
    "$100+ <=> ^~| `code` ...!!",
    "combining: e\u0301 a\u0308\u0308b",
    "abc123def ABC_DEF-ghi.jkl\n\n\nend.\n",
    "aaaaaaaaaaaaaaaaaaaaaaaa",
    "HelloWorld XMLHttpRequest iPhone I'M they'LL \"\u00c9clair\" a/b//\n\n  x",
    "",
    " ",
    "\n",
]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_chars():
    """GPT-2's byte encoder: the character each byte is written as."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


# The pre-tokenizer patterns of Qwen 2, Llama 3 and GPT-4o as their tokenizer.json files write them
# (the `regex` module reads them as the Hugging Face tokenizers library does). They only shape
# the vocabulary: the ids in the data are llama.cpp's.
PATTERNS = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def words_of(text, pattern):
    """The words of `text` (special tokens cut out first), byte-encoded."""
    bc = byte_chars()
    parts = [text]
    for s in SPECIALS:
        parts = [q for p in parts for q in p.split(s)]
    return [
        [bc[b] for b in w.encode()] for p in parts for w in regex.findall(pattern, p)
    ]


def learn_merges(texts):
    """BPE merges that make each word of either pattern one token (trained the usual way,
    most frequent pair first, so that tokenizing a word repeats its training), then merges
    joining each two neighbouring words: a word boundary missed shows as a joined token, one
    too many as a word left in pieces."""
    seqs = [w for t in texts for p in PATTERNS for w in words_of(t, p)]
    merges = []
    while True:
        pairs = collections.Counter()
        for s in seqs:
            pairs.update(zip(s, s[1:]))
        if not pairs:
            break
        # Most frequent, then first seen: deterministic.
        (a, b), _ = max(pairs.items(), key=lambda kv: kv[1])
        merges.append(f"{a} {b}")
        for s in seqs:
            i = 0
            while i + 1 < len(s):
                if s[i] == a and s[i + 1] == b:
                    s[i : i + 2] = [a + b]
                i += 1
    for t in texts:
        for p in PATTERNS:
            words = ["".join(w) for w in words_of(t, p)]
            for a, b in zip(words, words[1:]):
                m = f"{a} {b}"
                if m not in merges:
                    merges.append(m)
    return merges


def bpe_tokens(merges):
    tokens = byte_chars()
    seen = set(tokens)
    for m in merges:
        # Byte characters are never a space, so the one space separates the pair.
        a, b = m.split(" ")
        t = a + b
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    return tokens + SPECIALS


def write_common(w, n_vocab):
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)


def write_bpe(path, pre, tokens, merges):
    w = gguf.GGUFWriter(path, "qwen2")
    write_common(w, len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    n_normal = len(tokens) - len(SPECIALS)
    w.add_token_types([1] * n_normal + [3] * len(SPECIALS))
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 3)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


PHI3_SPECIALS = ["<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"]
PHI3_TEXTS = [
    "<|user|>\n  Hello there <|end|>\n<|assistant|>",
    "<|user|> \t hi<|end|>  \n\n<|assistant|>   x",
    "a </s>  b <s>  c <unk>  d <|endoftext|>  e",
    "  two leading spaces",
    "caf\u00e9 \U0001f680",
]


def spm_pieces(texts):
    """Pieces for a SentencePiece-style vocabulary: every character of the texts (as `▁` for a
    space) and the words with their leading `▁`, scored so that longer pieces merge first."""
    chars, words = set(), set()
    for t in texts:
        for s in PHI3_SPECIALS + ["</s>", "<s>", "<unk>"]:
            t = t.replace(s, " ")
        t = t.replace(" ", "\u2581")
        # The emoji is left out, for byte fallback.
        chars.update(c for c in t if c != "\U0001f680")
        for w in t.split("\u2581"):
            if len(w) > 1:
                words.add("\u2581" + w)
                for i in range(2, len(w) + 1):
                    words.add(w[:i])
    pieces = sorted(chars) + sorted(words, key=lambda w: (len(w), w))
    return [(p, float(i + 1 - len(pieces))) for i, p in enumerate(pieces)]


def write_phi3(path, pieces):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for p, s in pieces:
        tokens.append(p)
        types.append(1)
        scores.append(s)
    for s in PHI3_SPECIALS:
        tokens.append(s)
        types.append(3)
        scores.append(0.0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("Phi3 tokenizer test")
    write_common(w, len(tokens))
    w.add_rope_dimension_count(8)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def detokenize(llm, ids):
    """llama.cpp's detokenizer, special tokens written as their text."""
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, size, False, True)
    assert 0 <= n < size
    return buf.raw[:n].decode()


def tokenize(path, texts):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    out = []
    for t in texts:
        plain = llm.tokenize(t.encode(), add_bos=False, special=False)
        special = llm.tokenize(t.encode(), add_bos=False, special=True)
        out.append(
            {
                "text": t,
                "ids": plain,
                "ids_parse_special": special,
                "decoded": detokenize(llm, plain),
                "decoded_parse_special": detokenize(llm, special),
            }
        )
    return out


def main(out_path):
    merges = learn_merges(TEXTS)
    tokens = bpe_tokens(merges)
    data = {
        "made_with": f"llama-cpp-python {llama_cpp.__version__} (vocab_only)",
        "bpe": {"merges": merges, "specials": SPECIALS, "cases": {}},
    }
    with tempfile.TemporaryDirectory() as d:
        for pre in ["qwen2", "llama-bpe", "gpt-4o"]:
            path = os.path.join(d, f"{pre}.gguf")
            write_bpe(path, pre, tokens, merges)
            data["bpe"]["cases"][pre] = tokenize(path, TEXTS)
        pieces = spm_pieces(PHI3_TEXTS)
        path = os.path.join(d, "phi3.gguf")
        write_phi3(path, pieces)
        data["phi3"] = {
            "name": "Phi3 tokenizer test",
            "pieces": pieces,
            "specials": PHI3_SPECIALS,
            "cases": tokenize(path, PHI3_TEXTS),
        }
    with open(out_path, "w") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
