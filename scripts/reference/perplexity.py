#!/usr/bin/env python3
"""Records llama.cpp's perplexity of a GGUF model on a text, as test data for tessera.

Two ways to get llama.cpp's value, both writing the same JSON record:

* --tool PATH: run llama.cpp's own `llama-perplexity` (built from the llama.cpp that
  llama-cpp-python vendors, see perplexity-build.sh) as `PATH -m MODEL -f TEXT -c CTX -t THREADS`
  (its defaults otherwise) and read the running values and the final estimate it prints; with
  --fa-off-too, also its final estimate with `-fa off`.
* without --tool: compute it here from llama.cpp's logits through llama-cpp-python (flash
  attention off, one chunk a batch; this reproduces `llama-perplexity -fa off`), by the rules
  of llama.cpp's tools/perplexity (default mode, no stride): the text read as `-f` reads it (one
  trailing newline dropped), tokenized once with special tokens added as the vocabulary says and
  special-token text not parsed; cut into non-overlapping chunks of CTX tokens (a remainder
  dropped; fewer than 2*CTX tokens is an error); each chunk evaluated from an empty cache in one
  batch, its first token replaced by BOS when the vocabulary adds BOS; the logits at positions
  CTX/2 .. CTX-2 score the tokens after them, with llama.cpp's log-softmax (the maximum and the
  exponentials in float32, their sum in float64). PPL = exp(mean NLL), its error
  PPL * sqrt(var(NLL) / (count - 1)).

The token count of the text (recorded for the test's tokenizer check) always comes from
llama-cpp-python's tokenizer, which is llama.cpp's.

Usage (with llama-cpp-python 0.3.36 and numpy in the Python that runs it):
    perplexity.py --name NAME MODEL.gguf TEXT.txt --ctx 128 --ctx 512 [--threads 2]
                  [--tool llama-perplexity [--fa-off-too]] --out OUT.json
"""
import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama


def read_text(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text[:-1] if text.endswith("\n") else text


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def count_tokens(model, text):
    llm = Llama(model_path=model, vocab_only=True, verbose=False)
    return len(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))


def log_softmax(row, tok):
    """llama.cpp's log_softmax: float32 max and expf, a float64 sum, log in float64."""
    mx = np.float32(row.max())
    s = np.exp(row - mx, dtype=np.float32).astype(np.float64).sum()
    return float(np.float32(row[tok] - mx)) - math.log(s)


def by_python(model, text, ctx, threads):
    llm = Llama(
        model_path=model,
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
    first = ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in range(len(tokens) // ctx):
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
    ppl = math.exp(mean)
    err = math.sqrt((nll2 / count - mean * mean) / (count - 1)) * ppl
    print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}")
    return running, ppl, err, f"perplexity.py (llama-cpp-python) n_ctx={ctx} n_batch={ctx} n_threads={threads}"


def by_tool(tool, model, text_path, ctx, threads, extra=()):
    cmd = [tool, "-m", model, "-f", text_path, "-c", str(ctx), "-t", str(threads), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    running = [float(v) for _, v in re.findall(r"\[(\d+)\](\d+\.\d+),", log)]
    m = re.search(r"Final estimate: PPL = (\d+\.\d+) \+/- (\d+\.\d+)", log)
    if not running or not m:
        sys.exit(f"no perplexity in the output of {' '.join(cmd)}:\n{log}")
    print(f"ctx {ctx}: {running[-1]} ({m.group(0)})")
    shown = [os.path.basename(tool), "-m", os.path.basename(model), "-f", os.path.basename(text_path)]
    return running, float(m.group(1)), float(m.group(2)), " ".join(shown + cmd[5:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--name", required=True, help="the model's name in tessera's table")
    ap.add_argument("--ctx", type=int, action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tool", help="llama.cpp's llama-perplexity binary")
    ap.add_argument("--fa-off-too", action="store_true",
                    help="with --tool, also record each run with flash attention off")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    text = read_text(a.text)
    n_tokens = count_tokens(a.model, text)
    runs = []
    for ctx in a.ctx:
        if a.tool:
            running, ppl, err, command = by_tool(a.tool, a.model, a.text, ctx, a.threads)
        else:
            running, ppl, err, command = by_python(a.model, text, ctx, a.threads)
        run = {
            "n_ctx": ctx,
            "n_tokens": n_tokens,
            "n_chunks": len(running),
            "command": command,
            "running": running,
            "ppl": ppl,
            "error": err,
        }
        if a.tool and a.fa_off_too:
            _, ppl, err, command = by_tool(a.tool, a.model, a.text, ctx, a.threads, ["-fa", "off"])
            run["flash_attn_off"] = {"command": command, "ppl": ppl, "error": err}
        runs.append(run)
    record = {
        "model": a.name,
        "file": os.path.basename(a.model),
        "sha256": sha256(a.model),
        "text": os.path.basename(a.text),
        "text_sha256": sha256(a.text),
        "method": ("llama.cpp's llama-perplexity, its default settings (flash attention auto, "
                   "so on for the CPU; batch 2048)" if a.tool else
                   "llama.cpp's logits through llama-cpp-python (flash attention off), "
                   "llama.cpp's perplexity rules"),
        "llama_cpp": ("llama.cpp as vendored in llama-cpp-python " + llama_cpp.__version__
                      + (", built by perplexity-build.sh" if a.tool else "")
                      + "; CPU, default KV cache (F16)"),
        "runs": runs,
    }
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
