#!/usr/bin/env bash
# A/B of environment switches (or of builds: EXE=) on the wgpu mat-vec and decode, one GPU call.
# Each side is "name:VAR=value[+VAR=value...]" (`+` joins two settings of one side); rounds
# alternate the sides and reverse their order in round 2 (the side run second tends to lead a
# decode A/B by about a percent).
#
# Before it (on the build machine):
#   cargo build --release --all-features -p tessera-cli
#   cargo bench -p tessera-wgpu --bench mat_vec --bench mat_mat --no-run   # prints the executables
#   mkdir -p .gpu/F && strip -o /tmp/tessera target/release/tessera &&
#     xz -c /tmp/tessera > .gpu/F/tessera.xz && xz -c <mat_vec executable> > .gpu/F/mat_vec.xz
# (the bench executables are target/release/deps/mat_vec-<hash> and mat_mat-<hash>: harness-less,
# each runs its whole measurement and ignores its arguments).
# Call (device tool): carry .gl and .gpu/F; command, e.g.:
#   SIDES="base:N=1 idea:EXE=idea nosub:TESSERA_WGPU_SUBGROUPS=0" bash scripts/gpu-wgpu-ab.sh
# (an experiment is a build of its own, EXE=idea below: main reads no experiment switches; its
# variables are TESSERA_WGPU_COOP, _SUBGROUPS, _FUSION and _PROFILE.)
# Settings: TYPES (mat-vec types, default q4_0,q4_K,q8_0,q6_K); MV= (empty: no mat-vec runs);
# DEC= (empty: no decode runs); DECS="a b" (decode only these sides); PP=1 (the 8B's 512-token
# prompt, `bench -p 512 -n 0`, and `ops perf --op $PP_OP --name $PP_NAME`, by default MUL_MAT
# and n=512, each side); MM=1
# (the `mat_mat` bench, each side: carry .gpu/F/mat_mat.xz too); SUITE="VAR=value ..." (the
# wgpu suite once with each setting before the rounds; SUITE_ARGS: more `ops test` arguments,
# e.g. "--op FLASH_ATTN_EXT"). The 8B model is made when DEC or PP
# asks for it. Prints MV, DEC, PP, MMP, MM and SUITE lines; the logs go to $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1 WGPU_BACKEND=vulkan
OUT=${OUT:-/tmp/gpu-wgpu-ab}; L=$OUT/logs; mkdir -p "$L" /root/bin /root/syn
for f in .gpu/F/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > "/root/bin/$b"; chmod +x "/root/bin/$b"; done
T=/root/bin/tessera
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
M=/root/syn/llama-8b-q4_0.gguf
if { [ -n "${DEC-1}" ] || [ -n "${PP:-}" ]; } && [ ! -f "$M" ]; then
  timeout 120 $T gguf synth --like llama-8b --type q4_0 --out "$M" > "$L/synth.log" 2>&1
fi
read -ra S <<< "${SIDES:?SIDES=\"name:VAR=value ...\"}"
# Takes up a side: its settings into ENVS, and its executables into $T, $MV and $MMX (EXE=x
# among the settings picks .gpu/F/tessera-x.xz, mat_vec-x and mat_mat-x for that side).
side() {
  local e=${1#*:} x=""
  ENVS=()
  for w in ${e//+/ }; do
    case $w in EXE=*) x=-${w#EXE=} ;; *) ENVS+=("$w") ;; esac
  done
  T=/root/bin/tessera$x MV=/root/bin/mat_vec$x MMX=/root/bin/mat_mat$x
}
mv1() {
  local n=${1%%:*}
  side "$1"
  env "${ENVS[@]}" TESSERA_BENCH_TYPES="${TYPES:-q4_0,q4_K,q8_0,q6_K}" $MV > "$L/mv-$n-$2.log" 2>&1
  grep rotated "$L/mv-$n-$2.log" | grep "k=14336" | sed "s/^/MV $n r$2 /"
}
dec() {
  local n=${1%%:*}
  side "$1"
  env "${ENVS[@]}" timeout 120 $T bench --model "$M" --device wgpu:0 -p 0 -n 128 -r 3 > "$L/dec-$n-$2.log" 2>&1
  grep tg "$L/dec-$n-$2.log" | tail -1 | sed "s/^/DEC $n r$2 /"
}
pp() {
  local n=${1%%:*}
  side "$1"
  env "${ENVS[@]}" timeout 120 $T bench --model "$M" --device wgpu:0 -p 512 -n 0 -r 3 > "$L/pp-$n-$2.log" 2>&1
  grep pp "$L/pp-$n-$2.log" | tail -1 | sed "s/^/PP $n r$2 /"
  env "${ENVS[@]}" timeout 120 $T ops perf --backend wgpu:0 --op "${PP_OP:-MUL_MAT}" --name "${PP_NAME:-n=512}" > "$L/mmp-$n-$2.log" 2>&1
  grep "GPU median" "$L/mmp-$n-$2.log" | sed "s/^/MMP $n r$2 /"
}
mm() {
  local n=${1%%:*}
  side "$1"
  env "${ENVS[@]}" $MMX > "$L/mm-$n-$2.log" 2>&1
  grep gemm "$L/mm-$n-$2.log" | sed "s/^/MM $n r$2 /"
}
for e in ${SUITE:-}; do
  # shellcheck disable=SC2086
  env "$e" timeout 240 $T ops test --backend wgpu:0 ${SUITE_ARGS:-} > "$L/suite-$e.log" 2>&1
  echo "SUITE $e rc=$? $(grep -c FAIL "$L/suite-$e.log") failed"
done
for r in 1 2; do
  if [ $r = 1 ]; then ord=("${S[@]}"); else mapfile -t ord < <(printf '%s\n' "${S[@]}" | tac); fi
  if [ -n "${MV-1}" ]; then for s in "${ord[@]}"; do mv1 "$s" $r; done; fi
  if [ -n "${MM:-}" ]; then for s in "${ord[@]}"; do mm "$s" $r; done; fi
  if [ -n "${PP:-}" ]; then for s in "${ord[@]}"; do pp "$s" $r; done; fi
  if [ -n "${DEC-1}" ]; then
    for s in "${ord[@]}"; do
      n=${s%%:*}
      if [ -z "${DECS:-}" ] || [[ " $DECS " == *" $n "* ]]; then dec "$s" $r; fi
    done
  fi
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
