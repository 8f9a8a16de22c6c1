#!/usr/bin/env bash
# Builds llama.cpp's llama-perplexity (that target only, CPU, native) from the llama.cpp that
# llama-cpp-python 0.3.36 vendors, so that its value is the one the Python bindings' library
# computes with. About 20 minutes on 2 cores. cmake and ninja come from PyPI when not installed.
#
#   scripts/reference/perplexity-build.sh llama_cpp_python-0.3.36.tar.gz BUILD_DIR
#   -> BUILD_DIR/bin/llama-perplexity
set -euo pipefail
sdist=${1:?the llama-cpp-python sdist (pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36)}
build=${2:?a build directory}
mkdir -p "$build"
build=$(cd "$build" && pwd)
tar xzf "$sdist" -C "$build"
src=$(echo "$build"/llama_cpp_python-*/vendor/llama.cpp)
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  python3 -m venv "$build/tools"
  "$build/tools/bin/pip" install -q cmake ninja
  export PATH="$build/tools/bin:$PATH"
fi
# Tools on, everything else that is not needed off (no HTTPS, no subprocesses, static libraries).
cmake -S "$src" -B "$build/out" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_SUBPROCESS=OFF \
  -DBUILD_SHARED_LIBS=OFF
ninja -C "$build/out" -j "$(nproc)" llama-perplexity
mkdir -p "$build/bin"
cp "$build/out/bin/llama-perplexity" "$build/bin/"
echo "$build/bin/llama-perplexity"
