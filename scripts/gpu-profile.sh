#!/usr/bin/env bash
# Where one GPU's time goes, in one call: the CUDA conformance suite (and its mat-vec cases
# under each mat-vec geometry), then for the test model and a synthetic Llama-8B-shape Q4_0
# model, `tessera bench` and a per-kernel profile of the prompt and of decoding
# (TESSERA_CUDA_PROFILE=1: GPU time per kernel name inside the captured graphs, and the host's
# encoding time per step). Logs go under $OUT; the profiles and a short table are
# printed last. Two more steps on request: startup (wall time of `tessera generate --max-tokens 1`
# with a warm kernel cache: an upper bound of the time to the first token) and sanitize (the CUDA
# suite under compute-sanitizer's memcheck).
#
# Setup as scripts/gpu-check.sh describes (release binary, .gl, the test model in parts under
# /root/m and .gpu); then: bash scripts/gpu-profile.sh. STEPS picks steps (default: ops perf
# bench profile; also greedy (the test model's greedy tokens against llama.cpp's), startup,
# sanitize with SAN_TIMEOUT seconds (SAN_ARGS: more arguments of ops test, e.g.
# --skip-large), and wgpu: the suite on wgpu:0, the 8B decode on wgpu:0 with and without its
# fused dispatches, and its GPU time per shader variant).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-profile}; mkdir -p "$OUT"
BIN=${BIN:-./target/release/tessera}
DEV=${DEV:-cuda:0}
MODEL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
SYN=${SYN:-/root/syn}; mkdir -p "$SYN"
M8="$SYN/llama-8b-q4_0.gguf"
STEPS=${STEPS:-ops perf bench profile}
export NODEVICE_SELECT=1
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
[ -f "$MODEL" ] || { [ -f /root/m/part-aa ] && cat /root/m/part-aa .gpu/part-ab .gpu/part-ac > "$MODEL"; }
[ -f "$M8" ] || $BIN gguf synth --like llama-8b --type q4_0 --out "$M8" > "$OUT/synth8.log" 2>&1
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has ops; then
  timeout 300 $BIN ops test --backend "$DEV" > "$OUT/ops.log" 2>&1
  echo "ops test --backend $DEV | $(tail -1 "$OUT/ops.log")" | tee -a "$SUMMARY"
  grep -v 'OK \[\|skipped' "$OUT/ops.log" | head -20
fi

if has greedy; then
  timeout 200 python3 scripts/gpu_greedy.py $BIN "$MODEL" .gpu/smollm2-greedy.json "$DEV" > "$OUT/greedy.log" 2>&1
  echo "greedy vs llama.cpp | $(grep -m1 'prompts match\|MISMATCH\|FAIL' "$OUT/greedy.log")" | tee -a "$SUMMARY"
fi

if has perf; then
  timeout 200 $BIN ops perf --backend "$DEV" --op MUL_MAT --name m=4096 > "$OUT/perf.log" 2>&1
  grep 'runs' "$OUT/perf.log" | sed 's/^ *//' | cut -c1-150
fi

if has bench; then
  for m in "$MODEL" "$M8"; do
    log="$OUT/bench-$(basename "$m" .gguf).log"
    timeout 300 $BIN bench --model "$m" --device "$DEV" -p 512 -n 128 -r 3 > "$log" 2>&1
    echo "bench $(basename "$m") | $(grep -m1 pp512 "$log" | tr -s ' ') | $(grep -m1 tg128 "$log" | tr -s ' ')" \
      | tee -a "$SUMMARY"
  done
fi

if has profile; then
  for m in "$MODEL" "$M8"; do
    for pn in "-p 512 -n 0" "-p 0 -n 64"; do
      log="$OUT/profile-$(basename "$m" .gguf)-${pn// /}.log"
      RUST_LOG=tessera_cuda=debug TESSERA_CUDA_PROFILE=1 timeout 300 \
        $BIN bench --model "$m" --device "$DEV" $pn -r 1 > "$log" 2>&1
      echo "== profile $(basename "$m") $pn"
      grep -A24 'profile of' "$log" | sed 's/^.*\] //' | head -26
    done
  done
fi

if has startup; then
  # The first run fills the kernel cache; the next ones start warm.
  for i in 1 2 3; do
    t0=$(date +%s.%N)
    $BIN generate --model "$MODEL" --device "$DEV" --max-tokens 1 --temp 0 --prompt "Hello" > "$OUT/startup-$i.log" 2>&1
    t1=$(date +%s.%N)
    echo "startup run $i (generate --max-tokens 1, wall) | $(python3 -c "print(round($t1 - $t0, 3))") s" | tee -a "$SUMMARY"
  done
fi

if has sanitize; then
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${SAN_TIMEOUT:-540}" "$SAN" --tool memcheck --print-limit 50 $BIN ops test --backend "$DEV" ${SAN_ARGS:-} > "$OUT/sanitize.log" 2>&1
  echo "compute-sanitizer memcheck, ops test | $(grep -m1 'ERROR SUMMARY' "$OUT/sanitize.log" || echo "stopped after ${SAN_TIMEOUT:-540} s") | cases checked: $(grep -c 'OK \[' "$OUT/sanitize.log") ok, $(grep -c 'FAIL' "$OUT/sanitize.log") failed | memcheck reports: $(grep -c '^========= Invalid\|^========= Program hit' "$OUT/sanitize.log")" | tee -a "$SUMMARY"
fi

if has wgpu; then
  timeout 300 $BIN ops test --backend wgpu:0 > "$OUT/ops-wgpu.log" 2>&1
  echo "ops test --backend wgpu:0 | $(tail -1 "$OUT/ops-wgpu.log")" | tee -a "$SUMMARY"
  for fusion in 1 0; do
    log="$OUT/bench-wgpu-fusion$fusion.log"
    TESSERA_WGPU_FUSION=$fusion timeout 300 $BIN bench --model "$M8" --device wgpu:0 -p 512 -n 128 -r 3 > "$log" 2>&1
    echo "bench 8B wgpu:0 TESSERA_WGPU_FUSION=$fusion | $(grep -m1 pp512 "$log" | tr -s ' ') | $(grep -m1 tg128 "$log" | tr -s ' ')" \
      | tee -a "$SUMMARY"
  done
  # GPU time per shader variant of the 8B decode (each dispatch timed in its own pass).
  log="$OUT/profile-wgpu-8b-decode.log"
  TESSERA_WGPU_PROFILE=1 RUST_LOG=tessera_wgpu=debug timeout 300 \
    $BIN bench --model "$M8" --device wgpu:0 -p 0 -n 16 -r 1 > "$log" 2>&1
  echo "== wgpu profile llama-8b-q4_0 -p 0 -n 16"
  grep -A16 'profile of' "$log" | sed 's/^.*\] //' | head -18
fi

echo "== summary"
cat "$SUMMARY"
