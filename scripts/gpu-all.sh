#!/usr/bin/env bash
# One call that checks every open issue's GPU side at once, most important first, each step
# under its own time limit and skipped once the call's budget (LIMIT seconds, default 540) is
# near: the whole conformance suite on cuda:0 and wgpu:0; the small architecture models'
# greedy ids against llama.cpp's (dense and MoE; meta devices in tensor mode, so that tensor
# and expert parallelism run); the test model split by layers (scripts/gpu-split.sh's greedy
# and bench steps, short); batched decoding of the Llama-8B shape at 1, 4, 16 and 64
# sequences (examples/batched_bench); and the CUDA mat-vec over 1-64 columns for each build
# in .gpu/A and .gpu/B (bench mat_vec_batch).
#
# Before it (on the build machine):
#   cargo build --release --all-features -p tessera-cli
#   cargo build --release --features cuda,wgpu --example batched_bench
#   mkdir -p .gpu/F && strip -o /tmp/t target/release/tessera && xz -c /tmp/t > .gpu/F/tessera.xz
#   xz -c target/release/examples/batched_bench > .gpu/F/batched_bench.xz
#   (optional) the CUDA benchmark of two builds as .gpu/A/bench.xz and .gpu/B/bench.xz
#   (cargo bench -p tessera-cuda --bench gpu --no-run prints the executable)
#   the test model in parts as scripts/gpu-check.sh says (call 1 copies part-aa to /root/m)
# Call 2: carry .gl, .gpu/F, .gpu/A, .gpu/B, .gpu/part-ab, .gpu/part-ac;
#   command: bash scripts/gpu-all.sh
# Prints RESULT lines; the logs go to $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-all}; L=/tmp/gpu-all-logs; mkdir -p "$OUT" "$L" /root/bin /root/m
LIMIT=${LIMIT:-540}; t0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
# step NAME SECONDS: whether there is time for a step of about SECONDS.
step() { if [ "$(left)" -lt "$2" ]; then echo "RESULT $1 skipped (time)"; return 1; fi; echo "== $1 at $(( $(date +%s) - t0 ))s" >&2; }
for b in tessera batched_bench; do
  [ -f ".gpu/F/$b.xz" ] && xz -dc ".gpu/F/$b.xz" > "/root/bin/$b" && chmod +x "/root/bin/$b"
done
for s in A B; do [ -f ".gpu/$s/bench.xz" ] && xz -dc ".gpu/$s/bench.xz" > "/root/bin/bench-$s" && chmod +x "/root/bin/bench-$s"; done
BIN=/root/bin/tessera
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/RESULT gpu /'
MODEL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] || cat /root/m/part-aa .gpu/part-ab .gpu/part-ac > "$MODEL" 2>/dev/null

for b in cuda:0 wgpu:0; do
  step "ops $b" 60 || continue
  timeout 170 $BIN ops test --backend "$b" > "$L/ops-${b%%:*}.log" 2>&1
  echo "RESULT ops $b $(tail -1 "$L/ops-${b%%:*}.log")"
  grep -E "FAIL" "$L/ops-${b%%:*}.log" | head -5 | sed "s/^/RESULT ops $b /"
done

devs=(cuda:0 wgpu:0 meta:cuda:0,wgpu:0)
for ref in llm/tests/data/arch/*.json; do
  name=$(basename "$ref" .json); f=/root/m/$name.gguf
  step "greedy $name" 40 || continue
  ty=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["synth"]["type"])' "$ref")
  $BIN gguf synth --like "$name" --type "$ty" --out "$f" > /dev/null 2>&1 || { echo "RESULT synth $name FAILED"; continue; }
  TESSERA_SPLIT_MODE=tensor timeout 90 python3 scripts/gpu_greedy.py "$BIN" "$f" "$ref" "${devs[@]}" > "$L/greedy-$name.log" 2>&1
  grep 'prompts match\|FAILED\|MISMATCH' "$L/greedy-$name.log" | sed "s/^/RESULT $name /"
done

if [ -f "$MODEL" ] && step "layer split" 60; then
  gen() { timeout 60 $BIN generate --model "$MODEL" --prompt "The capital of France is" --temp 0 --max-tokens 32 --ignore-eog "$@" 2>/dev/null; }
  want=$(gen --device cuda:0)
  for d in meta:cuda:0,wgpu:0 meta:cuda:0,cpu; do
    got=$(gen --device "$d" --split-mode layer --split 0.5,0.5)
    [ -n "$want" ] && [ "$got" == "$want" ] && echo "RESULT split greedy $d 0.5,0.5: same text as cuda:0" || echo "RESULT split greedy $d 0.5,0.5: MISMATCH"
  done
  for d in cuda:0 wgpu:0 "meta:cuda:0,wgpu:0 --split-mode layer --split 0.5,0.5" "meta:cuda:0,cpu --split-mode layer --split 0.75,0.25" cpu; do
    step "bench $d" 25 || continue
    timeout 60 $BIN bench --model "$MODEL" --device $d -p 512 -n 64 -r 2 2>&1 | grep -E 'pp512|tg64' | sed "s/^/RESULT split bench $d /"
  done
fi

if [ -x /root/bin/batched_bench ] && step "batched" 90; then
  B8=/root/m/llama-8b-q4_0.gguf
  $BIN gguf synth --like llama-8b --type q4_0 --out "$B8" > /dev/null 2>&1
  for d in cuda:0 wgpu:0; do
    step "batched $d" 40 || continue
    timeout 100 /root/bin/batched_bench "$B8" "$d" 128 64 1,4,16,64 > "$L/batched-${d%%:*}.log" 2>&1
    tail -6 "$L/batched-${d%%:*}.log" | sed "s/^/RESULT batched $d /"
  done
fi

for s in A B; do
  [ -x /root/bin/bench-$s ] || continue
  step "mat_vec_batch $s" 30 || continue
  timeout 60 /root/bin/bench-$s mat_vec_batch --types q4_0,q4_K > "$L/mvb-$s.log" 2>&1
  grep "mul_mat batch" "$L/mvb-$s.log" | sed "s/^/RESULT mvb $s /"
done
echo "RESULT done at $(( $(date +%s) - t0 ))s"
tar czf "$OUT/logs.tgz" -C "$L" .
