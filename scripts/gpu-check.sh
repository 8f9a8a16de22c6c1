#!/usr/bin/env bash
# The GPU machine's whole check-and-measure sequence, in one call (see BENCHMARKS.md):
# conformance of the CUDA and wgpu backends against the CPU, greedy generation of the test
# model on cuda:0 and wgpu:0 against llama.cpp's tokens, tessera bench on each device (the test
# model, and the synthetic Llama-8B shape on the GPUs), op perf, and PyTorch anchors measured in
# the same run (TORCH=0 leaves them out: the call then fits well inside the device tool's 600 s).
# Long logs go under $OUT; a short table is printed last.
#
# Before it (from the checkout, on the build machine):
#   cargo build --release --all-features -p tessera-cli
#   cargo bench -p tessera-cuda --bench gpu --no-run                   # prints target/release/deps/gpu-<hash>
#   cargo bench -p tessera-wgpu --bench mat_vec --bench mat_mat --bench read_peak --no-run
#   mkdir -p .gpu/F && strip -o /tmp/tessera target/release/tessera && xz -c /tmp/tessera > .gpu/F/tessera.xz
#   xz -c target/release/deps/gpu-<hash> > .gpu/F/bench.xz   (the CUDA benchmarks, named bench here)
#   and xz each wgpu bench executable (target/release/deps/<name>-<hash>) to .gpu/F/mat_vec.xz,
#   mat_mat.xz, read_peak.xz
#   (compressed, everything fits the 64 MiB a call carries beside the model's two parts)
#   cp ../shared/reference/smollm2-greedy.json .gpu/ &&
#     (cd .gpu && split -b 49000000 ~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf part-)
# Call 1 (device tool): carry .gpu/part-aa; command: mkdir -p /root/m && cp .gpu/part-aa /root/m/
# Call 2, at once (the machine stays warm 30 s): carry .gl, .gpu/F, .gpu/part-ab, .gpu/part-ac,
#   .gpu/smollm2-greedy.json; command: bash scripts/gpu-check.sh
#   (Only after call 1 has returned its listing: where call 1 could not start a machine, call 2
#   gets a fresh one without part-aa, and the model's steps are skipped.)
# (Without .gpu/F it runs target/release/tessera, and the benchmark executables named by BENCH,
# WGPU_MV, WGPU_MM and WGPU_RP where set.)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
if [ -d .gpu/F ]; then
  mkdir -p /root/bin
  for b in tessera bench mat_vec mat_mat read_peak; do
    [ -f ".gpu/F/$b.xz" ] && xz -dc ".gpu/F/$b.xz" > "/root/bin/$b" && chmod +x "/root/bin/$b"
  done
  [ -x /root/bin/tessera ] && BIN=${BIN:-/root/bin/tessera}
  [ -x /root/bin/bench ] && BENCH=${BENCH:-/root/bin/bench}
  [ -x /root/bin/mat_vec ] && WGPU_MV=${WGPU_MV:-/root/bin/mat_vec}
  [ -x /root/bin/mat_mat ] && WGPU_MM=${WGPU_MM:-/root/bin/mat_mat}
  [ -x /root/bin/read_peak ] && WGPU_RP=${WGPU_RP:-/root/bin/read_peak}
fi
BIN=${BIN:-./target/release/tessera}
MODEL=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export NODEVICE_SELECT=1
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig

summary=()
row() { summary+=("| $1 | $2 |"); }

# A model that does not check out (call 1 did not run on this machine, or a part is missing)
# is removed, and the steps that need it are skipped (a model that does not check out fails
# every greedy prompt instead).
if [ ! -f "$MODEL" ]; then
  cat /root/m/part-aa .gpu/part-ab .gpu/part-ac > "$MODEL"
fi
model_ok=1
if [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" != "$SHA" ]; then
  echo "model checksum mismatch"; rm -f "$MODEL"; model_ok=0
  row "test model" "CHECKSUM MISMATCH (part-aa not in /root/m?): greedy and test-model benches skipped"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
$BIN devices 2>&1 | tee "$OUT/devices.txt"

for b in cuda:0 wgpu:0; do
  timeout 300 $BIN ops test --backend "$b" > "$OUT/ops-${b%%:*}.log" 2>&1
  row "ops test --backend $b" "$(tail -1 "$OUT/ops-${b%%:*}.log")"
done

if [ "$model_ok" = 1 ]; then
  timeout 300 python3 scripts/gpu_greedy.py $BIN "$MODEL" .gpu/smollm2-greedy.json cpu cuda:0 wgpu:0 > "$OUT/greedy.log" 2>&1
  while read -r line; do row "greedy vs llama.cpp" "$line"; done < <(grep 'prompts match' "$OUT/greedy.log")
  for d in cuda:0 wgpu:0 cpu; do
    timeout 240 $BIN bench --model "$MODEL" --device "$d" -p 512 -n 128 -r 3 > "$OUT/bench-${d%%:*}.log" 2>&1
    while read -r line; do row "bench $d" "$line"; done < <(grep 'pp512\|tg128' "$OUT/bench-${d%%:*}.log" | awk -F'|' '{print $4 $5}')
  done
fi

for b in cuda:0 wgpu:0; do
  timeout 150 $BIN ops perf --backend "$b" --op MUL_MAT --name 'm=4096' > "$OUT/perf-${b%%:*}.log" 2>&1
  # Prompt attention: the causal 512 x 512 model-shaped cases.
  timeout 100 $BIN ops perf --backend "$b" --op FLASH_ATTN_EXT --name 'nb=512' > "$OUT/perf-fa-${b%%:*}.log" 2>&1
done

# The synthetic Llama-8B-shape Q4_0 model (generated here, ~20-60 s), on each GPU backend.
M8=/root/syn/llama-8b-q4_0.gguf; mkdir -p /root/syn
[ -f "$M8" ] || timeout 300 $BIN gguf synth --like llama-8b --type q4_0 --out "$M8" > "$OUT/synth8.log" 2>&1
for d in cuda:0 wgpu:0; do
  timeout 200 $BIN bench --model "$M8" --device "$d" -p 512 -n 128 -r 3 > "$OUT/bench8-${d%%:*}.log" 2>&1
  while read -r line; do row "bench 8B $d" "$line"; done < <(grep 'pp512\|tg128' "$OUT/bench8-${d%%:*}.log" | awk -F'|' '{print $4 $5}')
done

# The bandwidth benchmarks first, before the GEMMs and PyTorch: run after them, the wgpu
# mat-vec's later shapes came out slower than in calls that ran them alone (BENCHMARKS.md).
# The wgpu mat-vec (WGPU_MV: `cargo bench -p tessera-wgpu --bench mat_vec --no-run`):
# quantized mat-vec GB/s at the model's shapes.
if [ -n "${WGPU_MV:-}" ] && [ -x "$WGPU_MV" ]; then
  timeout 120 "$WGPU_MV" --ignored --nocapture bench_model_sizes > "$OUT/wgpu-mv.log" 2>&1
fi
# The read bandwidth one dispatch gets (the mat-vec's ceiling), when its test executable is
# carried (WGPU_RP: `cargo bench -p tessera-wgpu --bench read_peak --no-run`).
if [ -n "${WGPU_RP:-}" ] && [ -x "$WGPU_RP" ]; then
  timeout 60 "$WGPU_RP" --ignored --nocapture bench_read_peak > "$OUT/wgpu-rp.log" 2>&1
fi
if [ "${TORCH:-1}" != 0 ]; then
  timeout 120 python3 scripts/torch_anchors.py > "$OUT/torch.md" 2>&1
fi
# The CUDA backend's own GPU benchmarks (GEMM f16/bf16 8192^3 and the quantized mat-vecs), when
# their executable is carried (BENCH=path: `cargo bench -p tessera-cuda --bench gpu --no-run`
# prints it).
if [ -n "${BENCH:-}" ] && [ -x "$BENCH" ]; then
  timeout 200 "$BENCH" gemm_throughput mat_vec > "$OUT/cuda-bench.log" 2>&1
fi
# The wgpu GEMM (WGPU_MM: `cargo bench -p tessera-wgpu --bench mat_mat --no-run`):
# square f16/f32 TFLOP/s.
if [ -n "${WGPU_MM:-}" ] && [ -x "$WGPU_MM" ]; then
  timeout 120 "$WGPU_MM" --ignored --nocapture bench_square > "$OUT/wgpu-mm.log" 2>&1
fi

echo; echo "== perf (mul_mat m=4096 k=14336; flash_attn_ext causal 512 x 512) =="
grep -h 'runs' "$OUT"/perf-*.log | sed 's/^ *//' | cut -c1-160
[ -f "$OUT/torch.md" ] && { echo; cat "$OUT/torch.md"; }
if [ -f "$OUT/cuda-bench.log" ]; then
  echo; echo "== tessera CUDA benchmarks (same call) =="; grep -E 'gemm |rotated|fused|K\+V' "$OUT/cuda-bench.log"
fi
# The mat-vec's rotated figures (weights from DRAM) only; the read ceiling's figures.
for f in "$OUT/wgpu-mv.log" "$OUT/wgpu-mm.log" "$OUT/wgpu-rp.log"; do
  [ -f "$f" ] && { echo; echo "== $(basename "$f" .log) (same call) =="; grep -E 'rotated|TFLOP/s|^read ' "$f"; }
done
# The headline figures also go into the table printed last (a call returns only the tail of
# its output, and only a few of the files under $OUT).
pct() { awk -v g="$1" 'BEGIN { printf "%.1f%% of 3.95 TB/s", g / 39.5 }'; }
if [ -f "$OUT/wgpu-mv.log" ]; then
  while read -r ty us gbs; do row "wgpu mat-vec $ty m=4096 k=14336, rotated" "$us µs, $gbs GB/s, $(pct "$gbs")"; done \
    < <(grep 'm=4096 k=14336 8 weights rotated' "$OUT/wgpu-mv.log" | awk '{print $1, $(NF-3), $(NF-1)}')
fi
[ -f "$OUT/wgpu-mm.log" ] && while read -r line; do row "wgpu GEMM" "$line"; done < <(grep '8192^3' "$OUT/wgpu-mm.log")
if [ -f "$OUT/cuda-bench.log" ]; then
  while read -r line; do row "CUDA GEMM" "$line"; done < <(grep -E 'gemm (f16xf16|bf16xbf16) 8192' "$OUT/cuda-bench.log")
  while read -r line; do row "CUDA mat-vec" "$line"; done < <(grep -E 'm=4096 k=14336 n=1 8 weights rotated' "$OUT/cuda-bench.log" | sed 's/mul_mat //')
fi
[ -f "$OUT/torch.md" ] && while read -r line; do row "PyTorch" "$line"; done < <(grep -iE 'gemm|gemv' "$OUT/torch.md" | grep -E '8192|4096' | tr -d '|' | sed 's/  */ /g' | head -6)
echo; echo "| check | result |"; echo "|---|---|"
printf '%s\n' "${summary[@]}"
