#!/usr/bin/env bash
# The multi-GPU run on a machine of several H200s (nvidia-h200-x2 or -x4), in one call:
#   comm    the all-reduce between the GPUs per size, through each path (peer kernel, NCCL,
#           and the default that picks between them), with its bus bandwidth;
#   ops     the conformance suite on meta:cuda:0,cuda:1 (every case that can be split);
#   greedy  the test model's greedy tokens on meta:cuda:0,cuda:1 against cuda:0 and llama.cpp;
#   bench8  tessera bench -p 512 -n 128 on a synthetic Llama-8B-shape Q4_0 model on 1, 2 (and
#           4) GPUs, with the default all-reduce, with NCCL only and staged through the host;
#   bench70 the same on a synthetic Llama-70B-shape Q4_0 model (40 GB);
#   single  one GPU as a one-part meta device against the plain device (the meta layer's own
#           cost), and the host-staged all-reduce between CUDA and Vulkan on one GPU.
# STEPS picks steps (default: all, in that order). Logs go under $OUT; a short table is printed
# last.
#
# Setup as scripts/gpu-check.sh describes (release binary, .gl, the test model in parts under
# /root/m and .gpu, .gpu/smollm2-greedy.json); then: bash scripts/gpu-multi.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-multi}; mkdir -p "$OUT"
BIN=${BIN:-./target/release/tessera}
MODEL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
SYN=${SYN:-/root/syn}; mkdir -p "$SYN"
STEPS=${STEPS:-comm ops greedy bench8 bench70 single}
export NODEVICE_SELECT=1 NCCL_NVLS_ENABLE=0
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
[ -f "$MODEL" ] || { [ -f /root/m/part-aa ] && cat /root/m/part-aa .gpu/part-ab .gpu/part-ac > "$MODEL"; }
NGPU=$(nvidia-smi -L | wc -l)
TWO=meta:cuda:0,cuda:1
FOUR=meta:cuda:0,cuda:1,cuda:2,cuda:3
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
has() { [[ " $STEPS " == *" $1 "* ]]; }

bench() { # label model device [env...]
  local label=$1 model=$2 dev=$3; shift 3
  local log="$OUT/bench-$label.log"
  env "$@" timeout 400 $BIN bench --model "$model" --device "$dev" -p 512 -n 128 -r 3 > "$log" 2>&1
  local pp tg
  pp=$(grep -m1 'pp512' "$log" | tr -s ' ' | sed 's/^ *//')
  tg=$(grep -m1 'tg128' "$log" | tr -s ' ' | sed 's/^ *//')
  echo "$label | $dev $* | ${pp:-failed: $(tail -1 "$log")} | ${tg:-}" | tee -a "$SUMMARY"
}

if has comm; then
  echo "== one rank: NCCL and the peer kernel on cuda:0" >> "$OUT/comm.txt"
  timeout 120 $BIN all-reduce --device cuda:0 --kib 16,1024,65536 >> "$OUT/comm.txt" 2>&1 \
    || echo "failed" >> "$OUT/comm.txt"
  for path in auto peer nccl; do
    for spec in $TWO $([ "$NGPU" -ge 4 ] && echo $FOUR); do
      echo "== all-reduce $spec TESSERA_ALLREDUCE=$path" >> "$OUT/comm.txt"
      TESSERA_ALLREDUCE=$path timeout 300 $BIN all-reduce --device "$spec" --peer-mib 1024 \
        >> "$OUT/comm.txt" 2>&1 || echo "failed" >> "$OUT/comm.txt"
    done
  done
  cat "$OUT/comm.txt"
fi

if has ops; then
  for spec in $TWO $([ "$NGPU" -ge 4 ] && echo $FOUR); do
    timeout 400 $BIN ops test --backend "$spec" --split $([ "$spec" = "$TWO" ] && echo 0.5,0.5 || echo 0.25,0.25,0.25,0.25) > "$OUT/ops-${spec//[:,]/_}.log" 2>&1
    echo "ops test --backend $spec: $(tail -1 "$OUT/ops-${spec//[:,]/_}.log")" | tee -a "$SUMMARY"
    grep -v 'OK \[' "$OUT/ops-${spec//[:,]/_}.log" | head -20
  done
fi

if has greedy; then
  timeout 400 python3 scripts/gpu_greedy.py "$BIN" "$MODEL" .gpu/smollm2-greedy.json cuda:0 $TWO \
    > "$OUT/greedy.log" 2>&1
  grep 'prompts match\|MISMATCH\|FAILED' "$OUT/greedy.log" | tee -a "$SUMMARY"
fi

if has bench8; then
  M8="$SYN/llama-8b-q4_0.gguf"
  [ -f "$M8" ] || $BIN gguf synth --like llama-8b --type q4_0 --out "$M8" > "$OUT/synth8.log" 2>&1
  bench 8b-1gpu "$M8" cuda:0
  bench 8b-2gpu "$M8" $TWO
  bench 8b-2gpu-nccl "$M8" $TWO TESSERA_ALLREDUCE=nccl
  bench 8b-2gpu-host "$M8" $TWO TESSERA_ALLREDUCE=host
  [ "$NGPU" -ge 4 ] && bench 8b-4gpu "$M8" $FOUR
fi

if has bench70; then
  M70="$SYN/llama-70b-q4_0.gguf"
  [ -f "$M70" ] || $BIN gguf synth --like llama-70b --type q4_0 --out "$M70" > "$OUT/synth70.log" 2>&1
  bench 70b-1gpu "$M70" cuda:0
  bench 70b-2gpu "$M70" $TWO
  [ "$NGPU" -ge 4 ] && bench 70b-4gpu "$M70" $FOUR
fi

if has single; then
  M8="$SYN/llama-8b-q4_0.gguf"
  [ -f "$M8" ] || $BIN gguf synth --like llama-8b --type q4_0 --out "$M8" > "$OUT/synth8.log" 2>&1
  bench 8b-meta1 "$M8" meta:cuda:0
  timeout 300 $BIN all-reduce --device meta:cuda:0,wgpu:0 --kib 16,1024,65536 > "$OUT/comm-host.txt" 2>&1
  cat "$OUT/comm-host.txt" | tee -a "$SUMMARY"
fi

echo "== summary ($NGPU GPUs; label | device | pp512 | tg128)"
cat "$SUMMARY"
