#!/usr/bin/env bash
# The real Gemma 3 270M file on the GPU machine: greedy ids against llama.cpp's on each device,
# then pp512 / tg128 per device. The file (253 MB) comes in 62 MB parts, one call each, since a
# call carries at most 64 MiB:
#   (cd .gpu && split -b 62000000 ~/.cache/tessera/models/gemma-3-270m-q4_k_m.gguf g-)
#   calls 1-4 (back to back, the machine stays warm): carry .gpu/g-aN; command:
#     mkdir -p /root/m && cp .gpu/g-a* /root/m/
#   call 5: carry .gl, .gpu/F (tessera.xz), .gpu/g-ae, .gpu/gemma3-270m-reference.json;
#     command: bash scripts/gpu-models.sh [DEVICE...]   (default: cuda:0 wgpu:0 meta:cuda:0,wgpu:0)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-models}; mkdir -p "$OUT"
mkdir -p /root/bin /root/m
[ -f .gpu/F/tessera.xz ] && xz -dc .gpu/F/tessera.xz > /root/bin/tessera && chmod +x /root/bin/tessera
BIN=${BIN:-/root/bin/tessera}
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export NODEVICE_SELECT=1
MODEL=/root/m/gemma-3-270m-q4_k_m.gguf
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -f "$MODEL" ]; then cp .gpu/g-ae /root/m/ 2>/dev/null; cat /root/m/g-a? > "$MODEL"; fi
if [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" != "$SHA" ]; then
  echo "RESULT gemma3 checksum mismatch: parts missing"; rm -f "$MODEL"; exit 1
fi
devs=("$@"); [ ${#devs[@]} -eq 0 ] && devs=(cuda:0 wgpu:0 meta:cuda:0,wgpu:0)
timeout 240 python3 scripts/gpu_greedy.py "$BIN" "$MODEL" .gpu/gemma3-270m-reference.json "${devs[@]}" > "$OUT/greedy.log" 2>&1
grep 'prompts match\|FAILED\|MISMATCH' "$OUT/greedy.log" | sed 's/^/RESULT greedy /'
for d in "${devs[@]}"; do
  timeout 120 "$BIN" bench --model "$MODEL" --device "$d" -p 512 -n 128 -r 3 > "$OUT/bench-${d//[:,]/_}.log" 2>&1
  grep -E "pp512|tg128" "$OUT/bench-${d//[:,]/_}.log" | sed "s/^/RESULT bench $d /"
done
# Every architecture's small random-weight model (synth writes the file llama.cpp ran; its
# references are llm/tests/data/arch/NAME.json).
for ref in llm/tests/data/arch/*.json; do
  name=$(basename "$ref" .json); f=/root/m/$name.gguf
  ty=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["synth"]["type"])' "$ref")
  "$BIN" gguf synth --like "$name" --type "$ty" --out "$f" > /dev/null 2>&1 || { echo "RESULT synth $name FAILED"; continue; }
  timeout 120 python3 scripts/gpu_greedy.py "$BIN" "$f" "$ref" "${devs[@]}" > "$OUT/greedy-$name.log" 2>&1
  grep 'prompts match\|FAILED\|MISMATCH' "$OUT/greedy-$name.log" | sed "s/^/RESULT $name /"
done
