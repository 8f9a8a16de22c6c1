#!/usr/bin/env python3
"""Greedy generation of a model on each given device against llama.cpp's tokens, to the first
step where llama.cpp's top-2 gap is below 0.5. The reference is smollm2-greedy.json's format
(`prompts`), gemma3-270m-reference.json's (`greedy`) or an architecture's small model's
(llm/tests/data/arch/NAME.json).
Usage: gpu_greedy.py BINARY MODEL REFERENCE_JSON DEVICE [DEVICE...]
GREEDY_ARGS (environment) adds arguments to the generate commands of meta devices (e.g. a
split mode: a single device refuses one).
Prints one line per prompt and device, and a summary line per device; exits 1 on a mismatch.
A near-tie is a gap below 0.5 (as llm/tests/arch_reference.rs)."""
import json
import os
import subprocess
import sys

binary, model, ref_path, devices = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ref = json.load(open(ref_path))
if "greedy" in ref:
    prompts = [{"name": g["name"], "prompt_text": g["prompt"], "prompt_ids": g["prompt_ids"],
                "generated_ids": g["ids"], "gaps": g["gaps"]} for g in ref["greedy"]]
elif "synth" in ref:  # llm/tests/data/arch/NAME.json
    prompts = [{"name": g["name"], "prompt_text": g["text"], "prompt_ids": g["prompt_ids"],
                "generated_ids": g["ids"], "gaps": g["gaps"]} for g in ref["prompts"]]
else:
    prompts = [dict(p, gaps=[s["margin_top1_top2"] for s in p["steps"]]) for p in ref["prompts"]]
near_tie = 0.5
bad = 0
for dev in devices:
    ok = 0
    for p in prompts:
        want = p["generated_ids"]
        tie = next((i for i, g in enumerate(p["gaps"]) if g < near_tie), len(want))
        cmd = [binary, "generate", "--model", model, "--device", dev, "--prompt", p["prompt_text"],
               "--temp", "0", "--max-tokens", str(len(want)), "--ignore-eog", "--json"]
        if dev.startswith("meta:"):
            cmd += os.environ.get("GREEDY_ARGS", "").split()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{dev} {p['name']}: FAILED to run: {r.stderr.strip()[-300:]}")
            bad += 1
            continue
        out = json.loads(r.stdout.strip().splitlines()[-1])
        if out["prompt_ids"] != p["prompt_ids"]:
            print(f"{dev} {p['name']}: prompt tokenized differently")
            bad += 1
            continue
        got = out["ids"]
        matched = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        verdict = "ok" if matched >= tie else "MISMATCH"
        if matched >= tie:
            ok += 1
        else:
            bad += 1
        print(f"{dev} {p['name']}: matched {matched}/{len(want)}, first near-tie {tie}: {verdict}; "
              f"{out['gen_tokens_per_sec']:.1f} tok/s")
    print(f"{dev}: {ok}/{len(prompts)} prompts match llama.cpp to the first near-tie")
sys.exit(1 if bad else 0)
