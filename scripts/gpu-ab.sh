#!/usr/bin/env bash
# A/B of two builds on the GPU machine in one call, rounds alternated (and the order within a
# round reversed every other round) so that both see the same machine (H200s of the same kind
# differ by up to 15% on some kernels: compare only within a call). Each build is a folder
# holding `tessera` and the CUDA benchmark executable as `bench`, plain or xz-compressed
# (`tessera.xz`, `bench.xz`), built here:
#   cargo build --release --all-features -p tessera-cli
#   cargo bench -p tessera-cuda --bench gpu --no-run   # prints target/release/deps/gpu-<hash>
#   mkdir -p .gpu/A && xz -c target/release/tessera > .gpu/A/tessera.xz &&
#     xz -c target/release/deps/gpu-<hash> > .gpu/A/bench.xz
# Then carry .gl, .gpu/A, .gpu/B and this script; command: A=.gpu/A B=.gpu/B bash scripts/gpu-ab.sh
#
# Steps (STEPS, default "mv dec"):
#   mv   quantized mat-vec, m=4096 k=14336 n=1, 8 weights rotated through DRAM and one repeated
#        (L2), plus the fused gate+up+swiglu (`bench mat_vec`; TYPES limits the types);
#   dec  tessera bench -p 0 -n 128 -r 3 on the synthetic Llama-8B-shape model (MODEL8 type,
#        default q4_0; a q4_k model takes ~2 minutes to generate) on DEV (default cuda:0;
#        wgpu:0 for the wgpu backend);
#   prof the per-kernel (cuda) or per-dispatch (wgpu) GPU time of one 8B decode run on DEV for
#        each side (TESSERA_CUDA_PROFILE / TESSERA_WGPU_PROFILE), its costliest lines;
#   ops  tessera ops test --backend DEV (the whole suite) with B.
# ENV_A / ENV_B add environment settings to one side (e.g. ENV_B="TESSERA_CUDA_GRAPHS=0").
# C and D (optional) name more builds for the mv step only (e.g. one commit of a series each).
# Prints RESULT lines; every log goes into $OUT/logs.tgz (the device tool returns few files).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-ab}; L=/tmp/gpu-ab-logs; mkdir -p "$OUT" "$L"
export NODEVICE_SELECT=1 NCCL_NVLS_ENABLE=0
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
STEPS=${STEPS:-mv dec}; ROUNDS=${ROUNDS:-2}; TYPES=${TYPES:-q4_0,q4_1,q8_0,q4_K,q5_K,q6_K}
MODEL8=${MODEL8:-q4_0}; DEV=${DEV:-cuda:0}
has() { [[ " $STEPS " == *" $1 "* ]]; }
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 ))s"; }
unpack() { # folder name -> /root/ab/name/{tessera,bench}
  local d=/root/ab/$2; mkdir -p "$d"
  for b in tessera bench; do
    if [ -f "$1/$b.xz" ]; then xz -dc "$1/$b.xz" > "$d/$b"; elif [ -f "$1/$b" ]; then cp "$1/$b" "$d/$b"; fi
    [ -f "$d/$b" ] && chmod +x "$d/$b"
  done
}
unpack "${A:?A=folder of build A}" A; unpack "${B:?B=folder of build B}" B
MVSIDES="A B"; for s in C D; do [ -n "${!s:-}" ] && unpack "${!s}" $s && MVSIDES="$MVSIDES $s"; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | sed 's/^/RESULT gpu /'
side_env() { local v=ENV_$1; echo "${!v:-}"; }
# The sides of round $1 in turn: as given in odd rounds, reversed in even ones (the side run
# second in a round led decode A/Bs whatever it was: BENCHMARKS.md).
order() {
  local r=$1; shift
  if (( r % 2 )); then echo "$@"; else printf '%s\n' "$@" | tac | tr '\n' ' '; fi
}
# The synthetic Llama-8B-shape model of type MODEL8 at $M (made once, by build A).
M=/root/syn/llama-8b-$MODEL8.gguf
synth8() {
  mkdir -p /root/syn
  [ -f "$M" ] || timeout 300 /root/ab/A/tessera gguf synth --like llama-8b --type "$MODEL8" --out "$M" > "$L/synth.log" 2>&1
}
if has mv; then
  for r in $(seq "$ROUNDS"); do
    for s in $(order "$r" $MVSIDES); do
      log=$L/mv-$s-$r.log
      env $(side_env $s) timeout 200 /root/ab/$s/bench --types "$TYPES" mat_vec > "$log" 2>&1
      echo "RESULT mv $s$r $(grep -o 'mul_mat [a-zA-Z0-9_]* m=4096 k=14336 n=1 [^:]*: [0-9.]* us' "$log" \
        | awk '{printf "%s%s=%s ", $2, ($6=="one"?"(L2)":""), $(NF-1)}')$(grep -o 'swiglu[^:]*: [0-9.]* us' "$log" \
        | awk '{printf "glu=%s", $(NF-1)}') ($(el))"
    done
  done
fi
if has dec; then
  synth8
  for r in $(seq "$ROUNDS"); do
    for s in $(order "$r" A B); do
      log=$L/dec-$s-$r.log
      env $(side_env $s) timeout 150 /root/ab/$s/tessera bench --model "$M" --device "$DEV" -p 0 -n 128 -r 3 > "$log" 2>&1
      echo "RESULT dec $DEV $s$r $(grep tg128 "$log" | awk -F'|' '{print $5}') ($(el))"
    done
  done
fi
if has prof; then
  synth8
  for s in A B; do
    log=$L/prof-$s.log
    env $(side_env $s) TESSERA_CUDA_PROFILE=1 TESSERA_WGPU_PROFILE=1 RUST_LOG=tessera_cuda=debug,tessera_wgpu=debug \
      timeout 150 /root/ab/$s/tessera bench --model "$M" --device "$DEV" -p 0 -n 32 -r 1 > "$log" 2>&1
    grep -E 'profile of|us each' "$log" | head -8 | sed "s/^.*\] /RESULT prof $s /"
  done
fi
if has ops; then
  env $(side_env B) timeout 300 /root/ab/B/tessera ops test --backend "$DEV" > "$L/ops-B.log" 2>&1
  echo "RESULT ops B $(tail -1 "$L/ops-B.log") ($(el))"
fi
tar czf "$OUT/logs.tgz" -C "$L" .
echo "done $(el)"
