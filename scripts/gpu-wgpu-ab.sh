#!/usr/bin/env bash
# A/B of environment switches on the wgpu mat-vec and decode, one build, one GPU call (see
# BENCHMARKS.md, sessions 18-19). Each side is "name:VAR=value[+VAR=value...]" (`+` joins two
# settings of one side); rounds alternate the sides and reverse their order in round 2 (the side
# run second led decode A/Bs by ~1%: session 15).
#
# Before it (on the build machine):
#   cargo build --release --all-features -p tessera-cli
#   cargo test --release -p tessera-wgpu --test mat_vec --no-run      # prints the executable
#   mkdir -p .gpu/F && strip -o /tmp/tessera target/release/tessera &&
#     xz -c /tmp/tessera > .gpu/F/tessera.xz && xz -c <mat_vec executable> > .gpu/F/mat_vec.xz
# Call (device tool): carry .gl and .gpu/F; command, e.g.:
#   SIDES="base:N=1 idea:TESSERA_WGPU_X=IDEA shape:TESSERA_WGPU_MVQ=16,512" bash scripts/gpu-wgpu-ab.sh
# (TESSERA_WGPU_X is what an experiment build reads in `mat_vec_q_sized` to add a define; main
# reads no such switch. TESSERA_WGPU_MVQ=ROWS,WG is main's own shape override.)
# Settings: TYPES (mat-vec types, default q4_0,q4_K,q8_0,q6_K); DEC= (empty: no decode runs, and
# the 8B model is not made); DECS="a b" (decode only these sides); SUITE="VAR=value ..." (the
# wgpu suite once with each setting before the rounds). Prints MV, DEC and SUITE lines; the
# logs go to $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1 WGPU_BACKEND=vulkan
OUT=${OUT:-/tmp/gpu-wgpu-ab}; L=$OUT/logs; mkdir -p "$L" /root/bin /root/syn
for b in tessera mat_vec; do xz -dc ".gpu/F/$b.xz" > "/root/bin/$b"; chmod +x "/root/bin/$b"; done
T=/root/bin/tessera; MV=/root/bin/mat_vec
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
M=/root/syn/llama-8b-q4_0.gguf
if [ -n "${DEC-1}" ] && [ ! -f "$M" ]; then
  timeout 120 $T gguf synth --like llama-8b --type q4_0 --out "$M" > "$L/synth.log" 2>&1
fi
read -ra S <<< "${SIDES:?SIDES=\"name:VAR=value ...\"}"
settings() { local e=${1#*:}; echo "${e//+/ }"; }
mv1() {
  local n=${1%%:*}
  # shellcheck disable=SC2046
  env $(settings "$1") TESSERA_BENCH_TYPES="${TYPES:-q4_0,q4_K,q8_0,q6_K}" $MV bench_model_sizes --ignored --nocapture > "$L/mv-$n-$2.log" 2>&1
  grep rotated "$L/mv-$n-$2.log" | grep "k=14336" | sed "s/^/MV $n r$2 /"
}
dec() {
  local n=${1%%:*}
  # shellcheck disable=SC2046
  env $(settings "$1") timeout 120 $T bench --model "$M" --device wgpu:0 -p 0 -n 128 -r 3 > "$L/dec-$n-$2.log" 2>&1
  grep tg "$L/dec-$n-$2.log" | tail -1 | sed "s/^/DEC $n r$2 /"
}
for e in ${SUITE:-}; do
  env "$e" timeout 240 $T ops test --backend wgpu:0 > "$L/suite-$e.log" 2>&1
  echo "SUITE $e rc=$? $(grep -c FAIL "$L/suite-$e.log") failed"
done
for r in 1 2; do
  if [ $r = 1 ]; then ord=("${S[@]}"); else mapfile -t ord < <(printf '%s\n' "${S[@]}" | tac); fi
  for s in "${ord[@]}"; do mv1 "$s" $r; done
  if [ -n "${DEC-1}" ]; then
    for s in "${ord[@]}"; do
      n=${s%%:*}
      if [ -z "${DECS:-}" ] || [[ " $DECS " == *" $n "* ]]; then dec "$s" $r; fi
    done
  fi
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
