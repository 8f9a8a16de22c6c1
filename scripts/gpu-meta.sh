#!/usr/bin/env bash
# The meta layer on the GPU machine, in one call: the H200 through CUDA and through Vulkan as one
# meta device (meta:cuda:0,wgpu:0). Conformance of the splittable op cases against the CPU,
# greedy generation of the test model against llama.cpp's tokens (beside cuda:0 alone and a
# one-part meta:cuda:0), and tessera bench of meta:cuda:0 (the single-part overhead against
# cuda:0 from scripts/gpu-check.sh in the same call, goal <= 5%) and meta:cuda:0,wgpu:0.
#
# Setup exactly as scripts/gpu-check.sh describes (release binary, .gl, the model in parts under
# /root/m and .gpu, .gpu/smollm2-greedy.json); then: bash scripts/gpu-meta.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-meta}; mkdir -p "$OUT"
BIN=${BIN:-./target/release/tessera}
MODEL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
export NODEVICE_SELECT=1
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
[ -f "$MODEL" ] || cat /root/m/part-aa .gpu/part-ab .gpu/part-ac > "$MODEL"

$BIN devices --meta cuda:0,wgpu:0 2>&1 | tee "$OUT/devices.txt"
timeout 300 $BIN ops test --backend meta:cuda:0,wgpu:0 --split 0.5,0.5 > "$OUT/ops.log" 2>&1
echo "ops test --backend meta:cuda:0,wgpu:0: $(tail -1 "$OUT/ops.log")"
grep -v 'OK \[' "$OUT/ops.log" | head -40
timeout 400 python3 scripts/gpu_greedy.py "$BIN" "$MODEL" .gpu/smollm2-greedy.json meta:cuda:0 meta:cuda:0,wgpu:0 \
  > "$OUT/greedy.log" 2>&1
grep 'prompts match\|MISMATCH\|FAILED' "$OUT/greedy.log"
for d in meta:cuda:0 meta:cuda:0,wgpu:0; do
  timeout 240 $BIN bench --model "$MODEL" --device "$d" -p 512 -n 128 -r 3 2>&1 | grep 'pp512\|tg128'
done
