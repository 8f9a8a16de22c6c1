#!/usr/bin/env python3
"""llama.cpp's perplexity of a GGUF model on a text, from llama.cpp's own logits.

llama-cpp-python has no perplexity tool, so this follows the rules of llama.cpp's
tools/perplexity (the default mode, no stride): the text is read as `-f` reads it (one trailing
newline dropped), tokenized once with special tokens added as the vocabulary says and
special-token text not parsed; cut into non-overlapping chunks of CTX tokens (a remainder
dropped; fewer than 2*CTX tokens is an error); each chunk evaluated from an empty cache in one
batch, its first token replaced by BOS when the vocabulary adds BOS; the logits at positions
CTX/2 .. CTX-2 score the tokens after them. The log-softmax is llama.cpp's: the maximum and the
exponentials in float32, their sum in float64. PPL = exp(mean NLL) and its error
PPL * sqrt(var(NLL) / (count - 1)).

Usage (llama-cpp-python 0.3.36 and numpy in the Python that runs it):
    perplexity.py MODEL.gguf TEXT.txt --ctx 128 [--ctx 512 ...] [--threads 2] [--out OUT.json]
"""
import argparse
import json
import math
import sys

import numpy as np
from llama_cpp import Llama, llama_cpp


def read_text(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text[:-1] if text.endswith("\n") else text


def log_softmax(row, tok):
    """llama.cpp's log_softmax: float32 max and expf, a float64 sum, log in float64."""
    mx = np.float32(row.max())
    s = np.exp(row - mx, dtype=np.float32).astype(np.float64).sum()
    return float(np.float32(row[tok] - mx)) - math.log(s)


def perplexity(path, text, ctx, threads):
    llm = Llama(
        model_path=path,
        n_ctx=ctx,
        n_batch=ctx,
        n_ubatch=ctx,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        n_gpu_layers=0,
        verbose=False,
    )
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llama_cpp.llama_vocab_bos(vocab)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    if len(tokens) < 2 * ctx:
        sys.exit(f"{len(tokens)} tokens: need at least {2 * ctx} for a context of {ctx}")
    n_chunk = len(tokens) // ctx
    first = ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in range(n_chunk):
        chunk = list(tokens[i * ctx:(i + 1) * ctx])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        scores = np.asarray(llm.scores[:ctx], dtype=np.float32)
        for p in range(first, ctx - 1):
            v = -log_softmax(scores[p], chunk[p + 1])
            nll += v
            nll2 += v * v
        count += ctx - 1 - first
        running.append(math.exp(nll / count))
        print(f"[{i + 1}]{running[-1]:.4f},", end="", flush=True)
    print()
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl
    print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}")
    return {
        "n_ctx": ctx,
        "n_tokens": len(tokens),
        "n_chunks": n_chunk,
        "n_scored": count,
        "add_bos": add_bos,
        "running": running,
        "ppl": ppl,
        "error": err,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    text = read_text(a.text)
    runs = [perplexity(a.model, text, c, a.threads) for c in a.ctx]
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"runs": runs}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
