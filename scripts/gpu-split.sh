#!/usr/bin/env bash
# The layer split and partial offload (issue 36) on the GPU machine, in one call: the plans,
# greedy text against cuda:0's, tessera bench of each device alone and of the layer splits
# (the ideal rate of a split with a fraction f of the work on a part of rate a and the rest on
# one of rate b is 1 / (f/a + (1-f)/b), from the single-device figures of the same call), the
# 8B shape with 8 of its 32 layers on the CPU (--gpu-layers 24) beside all 32 on the GPU, and
# the all-reduce table of meta:cuda:0,wgpu:0.
#
# Setup exactly as scripts/gpu-check.sh describes (release binary, .gl, the test model in parts
# under /root/m and .gpu); then: bash scripts/gpu-split.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-split}; mkdir -p "$OUT"
BIN=${BIN:-./target/release/tessera}
MODEL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
export NODEVICE_SELECT=1
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
[ -f "$MODEL" ] || cat /root/m/part-aa .gpu/part-ab .gpu/part-ac > "$MODEL"

for d in cuda:0,wgpu:0 cuda:0,cpu; do
  $BIN devices --meta "$d" --split-mode layer --split 0.5,0.5 --model "$MODEL" 2>&1 | tail -4
  $BIN devices --meta "$d" --split-mode layer --model "$MODEL" 2>&1 | tail -3
done

prompt="The capital of France is"
gen() { $BIN generate --model "$MODEL" --prompt "$prompt" --temp 0 --max-tokens 32 --ignore-eog "$@" 2>/dev/null; }
want=$(gen --device cuda:0)
for d in meta:cuda:0,wgpu:0 meta:cuda:0,cpu; do
  for s in 0.5,0.5 0.8,0.2 auto; do
    if [ "$(gen --device "$d" --split-mode layer --split "$s")" == "$want" ]; then
      echo "RESULT greedy $d --split $s: same text as cuda:0"
    else
      echo "RESULT greedy $d --split $s: MISMATCH"
    fi
  done
done

bench() { timeout 240 $BIN bench --model "$@" -r 3 2>&1 | grep -E 'pp|tg' ; }
for d in cuda:0 wgpu:0 cpu; do
  bench "$MODEL" --device "$d" -p 512 -n 128 | sed "s/^/RESULT bench $d /"
done
for d in meta:cuda:0,wgpu:0 meta:cuda:0,cpu; do
  for s in 0.5,0.5 0.75,0.25; do
    bench "$MODEL" --device "$d" --split-mode layer --split "$s" -p 512 -n 128 | sed "s/^/RESULT bench $d layer $s /"
    # The prompt in 4 micro-batches of 128, flowing through the parts.
    bench "$MODEL" --device "$d" --split-mode layer --split "$s" -p 512 -n 0 --ubatch 128 | sed "s/^/RESULT bench $d layer $s ubatch128 /"
  done
done

# The Llama-8B shape (random Q4_0 weights, ~4.3 GB): all layers on the GPU, then 24 of 32.
BIG=/root/m/llama-8b-q4_0.gguf
[ -f "$BIG" ] || $BIN gguf synth --like llama-8b --type q4_0 --out "$BIG" > "$OUT/synth.log" 2>&1
bench "$BIG" --device cuda:0 -p 512 -n 128 | sed "s/^/RESULT bench 8b cuda:0 /"
bench "$BIG" --device cuda:0 --gpu-layers 24 -p 512 -n 128 | sed "s/^/RESULT bench 8b cuda:0 --gpu-layers 24 /"
bench "$BIG" --device meta:cuda:0,wgpu:0 --split-mode layer --split 0.5,0.5 -p 512 -n 128 | sed "s/^/RESULT bench 8b meta:cuda:0,wgpu:0 layer 0.5,0.5 /"

timeout 240 $BIN all-reduce --device meta:cuda:0,wgpu:0 2>&1 | sed 's/^/RESULT all-reduce /'
