#!/usr/bin/env bash
# One call that checks every open issue's GPU side at once, most important first, each step
# under its own time limit and skipped once the call's budget (LIMIT seconds, default 540) is
# near: the whole conformance suite on cuda:0 and wgpu:0; the small architecture models'
# greedy ids against llama.cpp's (dense and MoE; meta devices in tensor mode, so that tensor
# and expert parallelism run), the host all-reduce between cuda:0 and wgpu:0, and two of them
# split by layers; the Llama-8B shape's speed
# alone, split by layers and with 8 layers on the CPU; batched decoding of it at 1, 4, 16 and
# 64 sequences (examples/batched_bench), and at 16 and 64 split by layers over cuda:0 and wgpu:0
# (one group a step, then two groups in flight); and the CUDA mat-vec over 1-64 columns for each build
# in .gpu/A and .gpu/B (bench mat_vec_batch).
#
# Before it (on the build machine):
#   cargo build --release --all-features -p tessera-cli
#   cargo build --release --features cuda,wgpu --example batched_bench
#   mkdir -p .gpu/F && strip -o /tmp/t target/release/tessera && xz -c /tmp/t > .gpu/F/tessera.xz
#   xz -c target/release/examples/batched_bench > .gpu/F/batched_bench.xz
#   (optional) the CUDA benchmark of two builds as .gpu/A/bench.xz and .gpu/B/bench.xz
#   (cargo bench -p tessera-cuda --bench gpu --no-run prints the executable)
# One call: carry .gl, .gpu/F, .gpu/A, .gpu/B; command: bash scripts/gpu-all.sh
# OPS (a comma-separated op list) limits the conformance step and MODELS (names of
# llm/tests/data/arch, space-separated) the greedy step.
# STEPS (default: all of them) picks groups of steps by name, so that the check can also go as
# two calls back to back on the warm machine (/root/m is kept between them), e.g.
#   STEPS="ops greedy" bash scripts/gpu-all.sh, then STEPS="allreduce split bench batched profile"
# (profile: the per-kernel GPU time of a 16-sequence batched decode; serve: time to first token
# under load through `tessera serve`; mmt: backend-cuda/tests/mmt.rs's executable as
# .gpu/A/mmt.xz, from `cargo test --release -p tessera-cuda --test mmt --no-run`; none of the
# three in the default).
# Prints RESULT lines; the logs go to $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-all}; L=/tmp/gpu-all-logs; mkdir -p "$OUT" "$L" /root/bin /root/m
LIMIT=${LIMIT:-540}; t0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
# step NAME SECONDS: whether there is time for a step of about SECONDS.
STEPS=${STEPS:-ops greedy allreduce split bench batched mvb}
# want GROUP: whether STEPS names the group.
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() { if [ "$(left)" -lt "$2" ]; then echo "RESULT $1 skipped (time)"; return 1; fi; echo "== $1 at $(( $(date +%s) - t0 ))s" >&2; }
for b in tessera batched_bench; do
  [ -f ".gpu/F/$b.xz" ] && xz -dc ".gpu/F/$b.xz" > "/root/bin/$b" && chmod +x "/root/bin/$b"
done
for s in A B; do [ -f ".gpu/$s/bench.xz" ] && xz -dc ".gpu/$s/bench.xz" > "/root/bin/bench-$s" && chmod +x "/root/bin/bench-$s"; done
BIN=/root/bin/tessera
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/RESULT gpu /'

for b in cuda:0 wgpu:0; do
  want ops || break
  step "ops $b" 60 || continue
  timeout 300 $BIN ops test --backend "$b" ${OPS:+--op "$OPS"} > "$L/ops-${b%%:*}.log" 2>&1
  echo "RESULT ops $b $(tail -1 "$L/ops-${b%%:*}.log")"
  grep -E "FAIL" "$L/ops-${b%%:*}.log" | head -5 | sed "s/^/RESULT ops $b /"
done

devs=(cuda:0 wgpu:0 meta:cuda:0,wgpu:0)
for ref in llm/tests/data/arch/*.json; do
  want greedy || break
  name=$(basename "$ref" .json); f=/root/m/$name.gguf
  [ -z "${MODELS:-}" ] || [[ " $MODELS " == *" $name "* ]] || continue
  step "greedy $name" 40 || continue
  ty=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["synth"]["type"])' "$ref")
  $BIN gguf synth --like "$name" --type "$ty" --out "$f" > /dev/null 2>&1 || { echo "RESULT synth $name FAILED"; continue; }
  GREEDY_ARGS="--split-mode tensor" timeout 90 python3 scripts/gpu_greedy.py "$BIN" "$f" "$ref" "${devs[@]}" > "$L/greedy-$name.log" 2>&1
  grep 'prompts match\|FAILED\|MISMATCH' "$L/greedy-$name.log" | sed "s/^/RESULT $name /"
done

# The host all-reduce between unlike devices (tensor parallelism's sum over cuda:0 and
# wgpu:0; issue 36 asks at most 50 us at 16 KiB and at least 10 GB/s at 64 MiB).
if want allreduce && step "all-reduce" 40; then
  timeout 60 $BIN all-reduce --device meta:cuda:0,wgpu:0 --kib 16,1024,65536 --seconds 0.3 > "$L/allreduce.log" 2>&1
  grep -E '^\| [0-9]+ [KM]iB' "$L/allreduce.log" | sed "s/^/RESULT all-reduce cuda:0,wgpu:0 /"
  grep -q '^| 16 KiB' "$L/allreduce.log" || echo "RESULT all-reduce FAILED: $(tail -1 "$L/allreduce.log")"
fi

# The layer split against llama.cpp's ids (two small models, each half of the layers on each
# part), then the Llama-8B shape's speed split by layers and partially offloaded.
for name in llama3-small qwen3-small; do
  ref=llm/tests/data/arch/$name.json; f=/root/m/$name.gguf
  want split && [ -f "$f" ] || continue
  step "layer split $name" 30 || continue
  GREEDY_ARGS="--split-mode layer --split 0.5,0.5" timeout 60 python3 scripts/gpu_greedy.py "$BIN" "$f" "$ref" meta:cuda:0,wgpu:0 meta:cuda:0,cpu > "$L/split-$name.log" 2>&1
  grep 'prompts match\|FAILED\|MISMATCH' "$L/split-$name.log" | sed "s/^/RESULT split $name /"
done
B8=/root/m/llama-8b-q4_0.gguf
if { want bench || want batched || want profile || want serve; } && [ ! -f "$B8" ] && step "8b synth" 120; then
  $BIN gguf synth --like llama-8b --type q4_0 --out "$B8" > /dev/null 2>&1
fi
if want bench && [ -f "$B8" ]; then
  for a in "cuda:0" "wgpu:0" "meta:cuda:0,wgpu:0 --split-mode layer --split 0.5,0.5" "cuda:0 --gpu-layers 24"; do
    step "bench 8b $a" 30 || continue
    timeout 60 $BIN bench --model "$B8" --device $a -p 512 -n 64 -r 2 2>&1 | grep -E 'pp512|tg64' | sed "s/^/RESULT bench 8b $a /"
  done
fi

if want batched && [ -x /root/bin/batched_bench ] && [ -f "$B8" ]; then
  # Each device's default route, then the other route of its few-column products (the A/B
  # that decides the default: CUDA's direct kernel, wgpu's per-workgroup quantization).
  for run in "cuda:0" "cuda:0 --cuda-few-columns=direct16" "wgpu:0" "wgpu:0 --wgpu-old-mat-vec"; do
    d=${run%% *}; tag=$(echo "$run" | tr ' :=' '_--')
    step "batched $run" 40 || continue
    timeout 100 /root/bin/batched_bench "$B8" $run 128 64 1,4,16,64 > "$L/batched-$tag.log" 2>&1
    tail -6 "$L/batched-$tag.log" | sed "s/^/RESULT batched $run /"
  done
  # Batched decoding over a layer split: one group a step, then two groups in flight.
  for g in 1 2; do
    step "batched layer split groups=$g" 40 || continue
    timeout 100 /root/bin/batched_bench "$B8" meta:cuda:0,wgpu:0 128 32 16,64 $g 0.5,0.5 > "$L/batched-split-$g.log" 2>&1
    grep RESULT "$L/batched-split-$g.log" | sed "s/^/RESULT batched split /" || echo "RESULT batched split groups=$g FAILED: $(tail -1 "$L/batched-split-$g.log")"
  done
fi

# Time to first token and aggregate decode under load: `tessera serve` on cuda:0 with 16 slots,
# 16 clients streaming 48 requests (issue 35).
if want serve && [ -f "$B8" ] && step "serve" 60; then
  $BIN serve --model "$B8" --device cuda:0 --parallel 16 --port 18080 > "$L/serve.log" 2>&1 &
  sp=$!
  for i in $(seq 90); do python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:18080/health")' 2> /dev/null && break; sleep 1; done
  timeout 120 python3 scripts/serve_load.py --url http://127.0.0.1:18080 --clients 16 --requests 48 --tag "8b cuda:0" > "$L/serve-load.log" 2>&1
  grep RESULT "$L/serve-load.log" || echo "RESULT serve FAILED: $(tail -2 "$L/serve.log" | tr '\n' ' ')"
  kill $sp; wait $sp 2> /dev/null
fi

if want profile && [ -x /root/bin/batched_bench ] && [ -f "$B8" ] && step "profile" 150; then
  TESSERA_CUDA_PROFILE=1 RUST_LOG=tessera_cuda=debug timeout 240 /root/bin/batched_bench "$B8" cuda:0 128 48 16 > "$L/profile-16.log" 2>&1
  grep -E "profile of|us/run" "$L/profile-16.log" | head -30 | sed "s/^/RESULT profile /"
fi

# The direct few-column CUDA kernel against the CPU, every FewColumns choice (the test
# executable of backend-cuda/tests/mmt.rs as .gpu/A/mmt.xz).
if want mmt && [ -f .gpu/A/mmt.xz ] && step "mmt test" 60; then
  xz -dc .gpu/A/mmt.xz > /root/bin/mmt && chmod +x /root/bin/mmt
  timeout 120 /root/bin/mmt --nocapture > "$L/mmt.log" 2>&1
  echo "RESULT mmt rc=$? $(grep 'test result' "$L/mmt.log")"
  grep -iE "panicked|mismatch" "$L/mmt.log" | head -4 | sed "s/^/RESULT mmt /"
fi

for s in A B; do
  want mvb && [ -x /root/bin/bench-$s ] || continue
  # The first run of each build compiles its kernels (~40 s).
  step "mat_vec_batch $s" 90 || continue
  timeout 150 /root/bin/bench-$s mat_vec_batch --types q4_0,q4_K,q6_K > "$L/mvb-$s.log" 2>&1
  grep "mul_mat batch" "$L/mvb-$s.log" | sed "s/^/RESULT mvb $s /"
  # The one-column read bandwidth of the i-quants' mat-vecs beside Q4_K's (issue 34's goal:
  # the same share of the bandwidth).
  step "mat_vec_bandwidth $s" 40 || continue
  timeout 60 /root/bin/bench-$s mat_vec_bandwidth --types iq4_xs,iq4_nl,iq3_s,iq2_xs,mxfp4,q4_K > "$L/mvbw-$s.log" 2>&1
  grep "GB/s" "$L/mvbw-$s.log" | grep " n=1 " | sed "s/^/RESULT mvbw $s /"
done
echo "RESULT done at $(( $(date +%s) - t0 ))s"
tar czf "$OUT/logs.tgz" -C "$L" .
