#!/usr/bin/env bash
# Mixtures of experts on the GPU machine (issue 34): the MoE ops' conformance cases, the small
# MoE models' greedy ids against llama.cpp's on each device (expert parallelism on the meta
# devices), then a Qwen3-30B-A3B-shape Q4_K_M file's pp512 / tg128 on cuda:0, wgpu:0 and with its
# experts split between cuda:0 and the CPU, a Mixtral-8x7B-shape file's on cuda:0, and a
# gpt-oss-20b-shape file's (MXFP4 experts, the rest Q8_0) on cuda:0 and wgpu:0.
# One call: carry .gl and .gpu/F (tessera.xz, built with --features cuda,wgpu);
#   command: bash scripts/gpu-moe.sh [DEVICE...]
#   (default devices: cuda:0 wgpu:0 meta:cuda:0,wgpu:0 meta:cuda:0,cpu)
# Synthesizing the large files takes a few minutes of the call's time (17 and 26 GB); set
# BIG=0 to leave them out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-moe}; mkdir -p "$OUT"
mkdir -p /root/bin /root/m
[ -f .gpu/F/tessera.xz ] && xz -dc .gpu/F/tessera.xz > /root/bin/tessera && chmod +x /root/bin/tessera
BIN=${BIN:-/root/bin/tessera}
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1
devs=("$@"); [ ${#devs[@]} -eq 0 ] && devs=(cuda:0 wgpu:0 meta:cuda:0,wgpu:0 meta:cuda:0,cpu)
for b in cuda:0 wgpu:0; do
  for op in MUL_MAT_ID MOE_GLU ADD_ID ARGSORT TOP_K MOE_ROUTER MOE_FFN SWIGLU_OAI; do
    timeout 300 "$BIN" ops test --backend "$b" --op "$op" > "$OUT/ops-${b%%:*}-$op.log" 2>&1
    echo "RESULT ops $b $op $(tail -1 "$OUT/ops-${b%%:*}-$op.log")"
  done
done
for b in cuda:0 wgpu:0; do
  timeout 300 "$BIN" ops test --backend "$b" --op FLASH_ATTN_EXT --name sinks > "$OUT/ops-${b%%:*}-sinks.log" 2>&1
  echo "RESULT ops $b FLASH_ATTN_EXT sinks $(tail -1 "$OUT/ops-${b%%:*}-sinks.log")"
done
for name in mixtral-small qwen2moe-small qwen3moe-small olmoe-small gpt-oss-small; do
  ref=llm/tests/data/arch/$name.json; f=/root/m/$name.gguf
  ty=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["synth"]["type"])' "$ref")
  "$BIN" gguf synth --like "$name" --type "$ty" --out "$f" > /dev/null 2>&1 || { echo "RESULT synth $name FAILED"; continue; }
  timeout 300 python3 scripts/gpu_greedy.py "$BIN" "$f" "$ref" "${devs[@]}" > "$OUT/greedy-$name.log" 2>&1
  grep 'prompts match\|FAILED\|MISMATCH' "$OUT/greedy-$name.log" | sed "s/^/RESULT $name /"
done
[ "${BIG:-1}" = 0 ] && exit 0
bench() { # MODEL DEVICE [SPLIT]
  local tag="$(basename "$1" .gguf)-${2//[:,]/_}"
  timeout 400 "$BIN" bench --model "$1" --device "$2" ${3:+--split "$3"} -p 512 -n 128 -r 3 > "$OUT/bench-$tag.log" 2>&1
  grep -E "pp512|tg128" "$OUT/bench-$tag.log" | sed "s/^/RESULT bench $tag ${3:-} /"
  tail -2 "$OUT/bench-$tag.log" | grep -i error | sed "s/^/RESULT bench $tag /"
}
q=/root/m/qwen3-30b-a3b-q4_k_m.gguf
timeout 600 "$BIN" gguf synth --like qwen3-30b-a3b --type q4_k_m --out "$q" > "$OUT/synth-qwen3.log" 2>&1 || echo "RESULT synth qwen3-30b-a3b FAILED"
bench "$q" cuda:0
bench "$q" wgpu:0
# Experts split: a quarter on the CPU (attention split the same way), as a model larger than
# the GPU would run.
bench "$q" meta:cuda:0,cpu 0.75,0.25
rm -f "$q"
m=/root/m/mixtral-8x7b-q4_k_m.gguf
timeout 600 "$BIN" gguf synth --like mixtral-8x7b --type q4_k_m --out "$m" > "$OUT/synth-mixtral.log" 2>&1 || echo "RESULT synth mixtral-8x7b FAILED"
bench "$m" cuda:0
rm -f "$m"
g=/root/m/gpt-oss-20b-q8_0.gguf
timeout 600 "$BIN" gguf synth --like gpt-oss-20b --type q8_0 --out "$g" > "$OUT/synth-gpt-oss.log" 2>&1 || echo "RESULT synth gpt-oss-20b FAILED"
bench "$g" cuda:0
bench "$g" wgpu:0
rm -f "$g"
