#!/usr/bin/env bash
# llama.cpp's figures beside tessera's, in one call on the GPU machine, on the same synthetic
# files: the Llama-8B shape Q4_0 whole on the GPU and with 8 of its 32 layers on the CPU
# (llama-bench -ngl 24 against --gpu-layers 24, issue 36), its batched decoding at 1, 4, 16
# and 64 sequences (llama-batched-bench against examples/batched_bench, issue 35), and a
# Qwen3-30B-A3B-shape Q4_K_M file (issue 34). Each step runs under its own time limit and is
# skipped once the call's budget (LIMIT seconds, default 560) is near.
#
# Before it (on the build machine):
#   the tessera binaries in .gpu/F as scripts/gpu-all.sh says;
#   llama.cpp (the commit of docs/anchors.md) built for sm_90 with CUDA 13.0 by
#   scripts/reference/llama-cuda-build.sh, which leaves .gpu/llama/bin.tar.xz.
# One call: carry .gl, .gpu/F and .gpu/llama; command: bash scripts/gpu-anchors.sh
# STEPS (default "full ngl24 batched moe") picks the steps, so that they can go as two calls
# back to back on the warm machine (/root/m is kept between them).
# Prints RESULT lines; the logs go to $OUT/anchors.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-anchors}; L=/tmp/gpu-anchors-logs; mkdir -p "$OUT" "$L" /root/bin /root/m /root/llama
LIMIT=${LIMIT:-560}; t0=$(date +%s)
STEPS=${STEPS:-full ngl24 batched moe}
want() { [[ " $STEPS " == *" $1 "* ]]; }
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
step() { if [ "$(left)" -lt "$2" ]; then echo "RESULT $1 skipped (time)"; return 1; fi; echo "== $1 at $(( $(date +%s) - t0 ))s" >&2; }
for b in tessera batched_bench; do
  [ -f ".gpu/F/$b.xz" ] && xz -dc ".gpu/F/$b.xz" > "/root/bin/$b" && chmod +x "/root/bin/$b"
done
BIN=/root/bin/tessera
[ -f .gpu/llama/bin.tar.xz ] && tar xJf .gpu/llama/bin.tar.xz -C /root/llama
export LD_LIBRARY_PATH=/root/llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/RESULT gpu /'
nproc | sed 's/^/RESULT cores /'

# llama-bench's markdown rows: "| model | size | params | backend | ngl | fa | test | t/s |".
lb() { # TAG ARGS...
  local tag=$1; shift
  timeout 200 /root/llama/llama-bench -o md "$@" > "$L/lb-$tag.log" 2>&1
  grep -E "pp[0-9]+|tg[0-9]+" "$L/lb-$tag.log" | awk -F'|' '{print $(NF-2), $(NF-1)}' | sed "s/^/RESULT llama.cpp $tag /"
  grep -iE "error|failed" "$L/lb-$tag.log" | head -2 | sed "s/^/RESULT llama.cpp $tag /"
}
tb() { # TAG MODEL ARGS...
  local tag=$1 m=$2; shift 2
  timeout 200 $BIN bench --model "$m" "$@" > "$L/tb-$tag.log" 2>&1
  grep -E "pp[0-9]+|tg[0-9]+" "$L/tb-$tag.log" | sed "s/^/RESULT tessera $tag /"
  grep -iE "error" "$L/tb-$tag.log" | head -2 | sed "s/^/RESULT tessera $tag /"
}

B8=/root/m/llama-8b-q4_0.gguf
if { want full || want ngl24 || want batched; } && [ ! -f "$B8" ] && step "8b synth" 100; then
  $BIN gguf synth --like llama-8b --type q4_0 --out "$B8" > "$L/synth-8b.log" 2>&1 || echo "RESULT synth 8b FAILED"
fi
if [ -f "$B8" ]; then
  want full && step "8b full" 60 && { lb 8b-ngl99 -m "$B8" -ngl 99 -fa 1 -p 512 -n 128 -r 3; tb 8b-cuda "$B8" --device cuda:0 -p 512 -n 128 -r 3; }
  want ngl24 && step "8b ngl24" 90 && { lb 8b-ngl24 -m "$B8" -ngl 24 -fa 1 -p 512 -n 32 -r 2; tb 8b-gpu-layers-24 "$B8" --device cuda:0 --gpu-layers 24 -p 512 -n 32 -r 2; tb 8b-gpu-layers-24-no-op-offload "$B8" --device cuda:0 --gpu-layers 24 --op-offload 0 -p 512 -n 0 -r 1; }
  if want batched && step "8b batched" 120; then
    timeout 150 /root/llama/llama-batched-bench -m "$B8" -ngl 99 -fa 1 -c 20480 -b 2048 -ub 512 \
      -npp 128 -ntg 64 -npl 1,4,16,64 > "$L/llama-batched.log" 2>&1
    grep -E "^\|\s+128" "$L/llama-batched.log" | sed "s/^/RESULT llama.cpp batched /"
    [ -x /root/bin/batched_bench ] && timeout 100 /root/bin/batched_bench "$B8" cuda:0 128 64 1,4,16,64 > "$L/batched.log" 2>&1
    tail -6 "$L/batched.log" 2>/dev/null | sed "s/^/RESULT tessera batched /"
  fi
fi

Q=/root/m/qwen3-30b-a3b-q4_k_m.gguf
if want moe && [ ! -f "$Q" ] && step "30b-a3b synth" 260; then
  timeout 240 $BIN gguf synth --like qwen3-30b-a3b --type q4_k_m --out "$Q" > "$L/synth-30b.log" 2>&1 || { echo "RESULT synth 30b-a3b FAILED"; rm -f "$Q"; }
fi
if want moe && [ -f "$Q" ] && step "30b-a3b" 80; then
  lb 30b-a3b -m "$Q" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  tb 30b-a3b-cuda "$Q" --device cuda:0 -p 512 -n 128 -r 2
fi
echo "RESULT done at $(( $(date +%s) - t0 ))s"
tar czf "$OUT/anchors.tgz" -C "$L" .
