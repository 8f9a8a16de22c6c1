#!/usr/bin/env python3
"""llama.cpp's reference outputs for the small synthetic model of every architecture.

For each small model (`tessera gguf synth --like NAME-small`), this writes the model with the
tessera binary into a temporary folder, runs it in llama.cpp through llama-cpp-python, and
writes llm/tests/data/arch/NAME-small.json: the synth command and the file's sha256 (so the
test can rebuild the very same file), the llama.cpp settings, and per prompt the prompt's
token ids, greedy ids, each step's top-2 gap and top-5 logits, and the full logits of the last
prompt position.

It also runs "controls": copies of each file with one architectural feature removed or
neutralised (rope factors dropped, no sliding window, no soft cap, no biases ...), and records
how far llama.cpp's own logits move, so that the references are shown to tell a correct
implementation from one that leaves the feature out.

Settings as for SmolLM2's references: F16 KV cache, no flash attention, 2 threads, one batch
for the prompt, then one token at a time, ties broken towards the lowest id.

Usage (from the repository root, after `cargo build -p tessera-cli`):
    /work/llamapy/venv/bin/python scripts/reference/make_arch_references.py \
        [--tessera target/debug/tessera] [--gguf-py PATH] [--only NAME ...]
Needs llama-cpp-python 0.3.36, numpy, and gguf-py (for the controls).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "llm", "tests", "data", "arch")

# The weight type of the reference files: F16, so that llama.cpp does not quantize
# activations to 8 bits before each matrix product (with Q8_0 weights its own run-to-run
# noise on these random models is ~0.4 logit on average, with F16 ~0.03).
TYPE = "f16"
# The mixtures of experts in F32: with F16 weights llama.cpp rounds the router's input to F16,
# and a near-tie between two experts' probabilities then picks either (a different expert is a
# large change, which the logits' near-tie rule cannot see). In F32 both sides route alike.
MOE_TYPE = "f32"
MOE_MODELS = (
    "mixtral-small",
    "qwen2moe-small",
    "qwen3moe-small",
    "olmoe-small",
    "gpt-oss-small",
)
N_CTX = 512
STEPS = 32
SETTINGS = dict(
    n_ctx=N_CTX,
    n_batch=N_CTX,
    n_ubatch=N_CTX,
    n_threads=2,
    n_threads_batch=2,
    logits_all=True,
    flash_attn=False,
    n_gpu_layers=0,
    seed=1234,
    verbose=False,
)

# The prompts: a sentence (already past the Gemma models' window of 16), a line of numbers and
# punctuation (Qwen's pre-tokenizer splits digits one by one), a line of code, and a long
# passage (past the window many times over, and long enough that Llama 3.1's rope factors
# change the result).
PROMPTS = [
    (
        "sentence",
        "Once upon a time, in a small village by the sea, there lived an old fisherman "
        "who told stories to the children every evening.",
    ),
    (
        "numbers",
        "In 1984, 42 boats sailed 3,500 miles; only 7 came back (on 12/25).",
    ),
    (
        "code",
        'fn main() { let xs = vec![3, 1, 2]; for x in &xs { println!("{x}"); } }',
    ),
    (
        "passage",
        "The lighthouse stood at the end of a long stone pier, and for as long as anyone in "
        "the town could remember, its keeper had climbed the narrow stairs every evening to "
        "light the lamp. In winter the waves broke over the pier and the spray froze on the "
        "railings, so that the keeper had to walk slowly, holding a rope that ran from the "
        "door of his cottage to the foot of the tower. The children of the town believed "
        "that he never slept. They said that he watched the sea all night, counting the "
        "ships that passed, and that he knew the name of every captain and the cargo of "
        "every hold. When the old keeper finally retired, a young woman from the city took "
        "his place. She brought books, a telescope and a small black cat, and on the first "
        "night she climbed the stairs she found, carved into the wooden frame of the window, "
        "a list of ships and dates that went back more than a hundred years. Some of the "
        "names she knew from the harbour; others she had never heard of, and one of them, "
        "written in a careful hand at the very bottom, carried a date that had not yet come.",
    ),
]

MODELS = [
    "llama3-small",
    "qwen2-small",
    "qwen3-small",
    "gemma2-small",
    "gemma3-small",
    "phi3-small",
    "mixtral-small",
    "qwen2moe-small",
    "qwen3moe-small",
    "olmoe-small",
    "gpt-oss-small",
]


def f32(x):
    """The shortest decimal that reads back as the same float32."""
    return float(str(np.float32(x)))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(path):
    return Llama(model_path=path, **SETTINGS)


def greedy(model, ids):
    """Evaluates the prompt in one batch, then STEPS tokens one at a time by argmax (lowest id
    on ties). Returns the ids, gaps, top-5 per step and the last prompt position's logits."""
    model.reset()
    model.eval(ids)
    logits = np.array(model.scores[len(ids) - 1], dtype=np.float32)
    last_prompt = logits.copy()
    out, gaps, top5 = [], [], []
    for _ in range(STEPS):
        order = np.argsort(-logits, kind="stable")
        t = int(order[0])
        out.append(t)
        gaps.append(f32(logits[order[0]] - logits[order[1]]))
        top5.append([[int(i), f32(logits[i])] for i in order[:5]])
        model.eval([t])
        logits = np.array(model.scores[model.n_tokens - 1], dtype=np.float32)
    return out, gaps, top5, last_prompt


def describe(model_path):
    """The architecture's hyper-parameters, from the file."""
    sys.path.insert(0, GGUF_PY)
    from gguf import GGUFReader

    r = GGUFReader(model_path)
    keep = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer.ggml.") and k.endswith(
            ("tokens", "token_type", "merges")
        ):
            continue
        if k == "tokenizer.chat_template":
            continue
        v = f.contents()
        keep[k] = f32(v) if isinstance(v, float) else v
    keep["tensors"] = {t.name: [t.tensor_type.name, [int(n) for n in t.shape]] for t in r.tensors}
    return keep


def variant(src, dst, drop=(), set_keys=None, fill=None):
    """Copies a GGUF file, dropping tensors, overriding metadata values and filling tensors
    with a constant."""
    sys.path.insert(0, GGUF_PY)
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    set_keys = dict(set_keys or {})
    fill = fill or {}
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        if k in set_keys:
            v = set_keys.pop(k)
            if vt == GGUFValueType.UINT32:
                w.add_uint32(k, int(v))
            else:
                w.add_float32(k, float(v))
            continue
        if vt == GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), vt)
    assert not set_keys, f"keys not in the file: {set_keys}"
    for t in r.tensors:
        if t.name in drop:
            continue
        data = t.data
        if t.name in fill:
            data = np.full_like(data, fill[t.name])
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def controls(name, path, tmp, n_layer):
    """Variants of the file that leave one feature out: (what, kwargs for variant)."""
    blocks = range(n_layer)
    c = []
    if name == "llama3-small":
        c.append(("rope_freqs.weight ignored", dict(drop={"rope_freqs.weight"})))
    if name == "qwen2-small":
        c.append(
            (
                "Q/K/V biases ignored",
                dict(
                    fill={f"blk.{i}.attn_{p}.bias": 0.0 for i in blocks for p in "qkv"}
                ),
            )
        )
    if name == "qwen3-small":
        c.append(
            (
                "Q/K norm weights ignored (all 1)",
                dict(
                    fill={
                        f"blk.{i}.attn_{p}_norm.weight": 1.0 for i in blocks for p in "qk"
                    }
                ),
            )
        )
    if name in ("gemma2-small", "gemma3-small"):
        arch = name[:6]
        c.append(
            (
                "no sliding window",
                dict(set_keys={f"{arch}.attention.sliding_window": 1 << 20}),
            )
        )
    if name == "gemma2-small":
        c.append(
            (
                "no attention soft cap",
                dict(set_keys={"gemma2.attn_logit_softcapping": 1e9}),
            )
        )
        c.append(
            (
                "no final soft cap",
                dict(set_keys={"gemma2.final_logit_softcapping": 1e9}),
            )
        )
    if name == "gemma3-small":
        c.append(
            (
                "no linear rope scaling on the global layers",
                dict(set_keys={"gemma3.rope.scaling.factor": 1.0}),
            )
        )
    if name == "phi3-small":
        c.append(
            (
                "LongRoPE short factors ignored (all 1)",
                dict(fill={"rope_factors_short.weight": 1.0}),
            )
        )
        c.append(
            (
                "rope attention factor ignored (1)",
                dict(set_keys={"phi3.rope.scaling.attn_factor": 1.0}),
            )
        )
    moe = {
        "mixtral-small": "llama",
        "qwen2moe-small": "qwen2moe",
        "qwen3moe-small": "qwen3moe",
        "olmoe-small": "olmoe",
        "gpt-oss-small": "gpt-oss",
    }
    if name in moe:
        c.append(
            (
                "one expert per token instead of the file's count",
                dict(set_keys={f"{moe[name]}.expert_used_count": 1}),
            )
        )
        c.append(
            (
                "router ignored (all logits 0)",
                dict(fill={f"blk.{i}.ffn_gate_inp.weight": 0.0 for i in blocks}),
            )
        )
    if name == "qwen2moe-small":
        c.append(
            (
                # Not 0: llama.cpp computes the sigmoid as silu(x) / x.
                "shared expert's gate ignored (weights 1e-6: a factor of about 1/2)",
                dict(fill={f"blk.{i}.ffn_gate_inp_shexp.weight": 1e-6 for i in blocks}),
            )
        )
    if name == "olmoe-small":
        c.append(
            (
                "Q/K norm weights ignored (all 1)",
                dict(
                    fill={
                        f"blk.{i}.attn_{p}_norm.weight": 1.0 for i in blocks for p in "qk"
                    }
                ),
            )
        )
    if name == "gpt-oss-small":
        c.append(
            (
                "attention sinks ignored (all -1e4)",
                dict(fill={f"blk.{i}.attn_sinks.weight": -1e4 for i in blocks}),
            )
        )
        c.append(
            (
                "no sliding window",
                dict(set_keys={"gpt-oss.attention.sliding_window": 1 << 20}),
            )
        )
        c.append(
            (
                "router and expert biases ignored",
                dict(
                    fill={
                        f"blk.{i}.ffn_{p}.bias": 0.0
                        for i in blocks
                        for p in ("gate_inp", "gate_exps", "up_exps", "down_exps")
                    }
                ),
            )
        )
        c.append(
            (
                "attention output bias ignored",
                dict(fill={f"blk.{i}.attn_output.bias": 0.0 for i in blocks}),
            )
        )
        c.append(
            (
                "no YaRN (factor 1)",
                dict(set_keys={"gpt-oss.rope.scaling.factor": 1.0}),
            )
        )
    out = []
    for i, (what, kw) in enumerate(c):
        vpath = os.path.join(tmp, f"{name}-control{i}.gguf")
        variant(path, vpath, **kw)
        out.append((what, vpath))
    return out


def first_tie(gaps):
    return next((i for i, g in enumerate(gaps) if g < 0.5), len(gaps))


def make(name, tessera, tmp, commit, version):
    path = os.path.join(tmp, f"{name}.gguf")
    ty = MOE_TYPE if name in MOE_MODELS else TYPE
    cmd = [tessera, "gguf", "synth", "--like", name, "--type", ty, "--out", path]
    subprocess.run(cmd, check=True, capture_output=True)
    meta = describe(path)
    arch = meta["general.architecture"]
    model = load(path)
    prompts = []
    for pname, text in PROMPTS:
        ids = model.tokenize(text.encode(), add_bos=True, special=True)
        out, gaps, top5, last = greedy(model, ids)
        prompts.append(
            dict(
                name=pname,
                text=text,
                prompt_ids=ids,
                ids=out,
                gaps=gaps,
                top5=top5,
                last_prompt_logits=[f32(x) for x in last],
            )
        )
        print(
            f"{name} {pname}: {len(ids)} prompt tokens; first gap < 0.5 at step "
            f"{first_tie(gaps)}; gaps > 0.5: {sum(g > 0.5 for g in gaps)}/{len(gaps)}; "
            f"min gap {min(gaps):.3f}"
        )
    del model

    ctl = []
    for what, vpath in controls(name, path, tmp, meta[f"{arch}.block_count"]):
        vm = load(vpath)
        per = []
        for p in prompts:
            v_ids = vm.tokenize(p["text"].encode(), add_bos=True, special=True)
            out, gaps, _, last = greedy(vm, v_ids)
            d = float(np.abs(last - np.array(p["last_prompt_logits"], dtype=np.float32)).max())
            same = next(
                (i for i, (a, b) in enumerate(zip(out, p["ids"])) if a != b), len(out)
            )
            per.append(
                dict(
                    prompt=p["name"],
                    last_prompt_logits_max_abs_diff=f32(d),
                    greedy_same_until=same,
                    reference_first_tie=first_tie(p["gaps"]),
                )
            )
        del vm
        ctl.append(dict(what=what, prompts=per))
        print(
            f"  control '{what}': last-position max |d| "
            + ", ".join(f"{c['last_prompt_logits_max_abs_diff']:.2f}" for c in per)
            + "; greedy same until "
            + ", ".join(
                f"{c['greedy_same_until']} (tie {c['reference_first_tie']})" for c in per
            )
        )

    return dict(
        model=name,
        synth=dict(
            command=f"tessera gguf synth --like {name} --type {ty} --out FILE",
            like=name,
            type=ty,
            tessera_version=version,
            tessera_commit=commit,
            sha256=sha256(path),
            bytes=os.path.getsize(path),
        ),
        llama_cpp=dict(
            llama_cpp_python=llama_cpp.__version__,
            system_info=llama_cpp.llama_print_system_info().decode().strip(),
            settings={k: v for k, v in SETTINGS.items() if k != "verbose"},
            kv_cache="f16",
            steps=STEPS,
            tokenize="add_bos=True (BOS only where the file asks for it), special=True",
            greedy="prompt in one batch, then one token at a time; argmax, lowest id on ties",
        ),
        metadata=meta,
        prompts=prompts,
        controls=ctl,
    )


def main():
    global GGUF_PY
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=os.path.join(ROOT, "target", "debug", "tessera"))
    ap.add_argument("--gguf-py", default="/work/pygguf")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args()
    GGUF_PY = a.gguf_py
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    version = subprocess.run(
        [a.tessera, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    os.makedirs(OUT_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only or MODELS:
            ref = make(name, a.tessera, tmp, commit, version)
            with open(os.path.join(OUT_DIR, f"{name}.json"), "w") as f:
                json.dump(ref, f, separators=(",", ":"))
                f.write("\n")


if __name__ == "__main__":
    main()
