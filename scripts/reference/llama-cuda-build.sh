#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-batched-bench with CUDA for sm_90 (the H100 and H200)
# on a machine without a GPU, for scripts/gpu-anchors.sh: the CUDA 13.0 compiler, runtime,
# cuBLAS and CCCL come from PyPI (NVIDIA's wheels), the driver library is a stub that only names
# the symbols ggml links against (the GPU machine's own libcuda.so.1 is loaded at run time).
# The source is the llama.cpp that llama-cpp-python 0.3.36 vendors (docs/anchors.md's commit).
# About 1.5 hours on 2 busy cores (niced beside other work); ninja resumes where it stopped.
#
#   scripts/reference/llama-cuda-build.sh LLAMA_CPP_SOURCE WORK_DIR
#   -> .gpu/llama/bin.tar.xz (executables and shared libraries, for /root/llama there)
set -euo pipefail
src=$(cd "${1:?llama.cpp source (vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist)}" && pwd)
work=${2:?a work directory}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work" && work=$(cd "$work" && pwd)
cuda=$work/x/nvidia/cu13
if [ ! -x "$cuda/bin/nvcc" ]; then
  (cd "$work" && pip download --no-deps -q "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cublas==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" &&
    for w in *.whl; do python3 -m zipfile -e "$w" x/; done && rm -f ./*.whl)
  chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
  (cd "$cuda/lib" && ln -sf libcudart.so.13 libcudart.so && ln -sf libcublas.so.13 libcublas.so &&
    ln -sf libcublasLt.so.13 libcublasLt.so)
  ln -sfn lib "$cuda/lib64"
fi
mkdir -p "$cuda/lib/stubs"
syms=$(grep -ohE "\bcu[A-Z][A-Za-z0-9_]*\s*\(" "$src"/ggml/src/ggml-cuda/*.cu "$src"/ggml/src/ggml-cuda/*.cuh |
  sed 's/\s*(//' | grep -v '^cuBLAS$' | sort -u)
for s in $syms; do echo "int $s(void) { return 0; }"; done > "$work/cuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda/lib/stubs/libcuda.so" "$work/cuda_stub.c"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  pip install -q --target "$work/tools" cmake ninja
  export PATH="$work/tools/bin:$PATH" PYTHONPATH="$work/tools"
fi
export PATH="$cuda/bin:$PATH"
# The CPU part (layers left on the CPU by -ngl) for AVX2, which every x86-64 GPU host has.
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
  -DCUDAToolkit_ROOT="$cuda" -DCMAKE_LIBRARY_PATH="$cuda/lib/stubs" \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
# The executables link against libggml-cuda, whose CUDA libraries the linker finds through
# LD_LIBRARY_PATH (-rpath-link).
LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ninja -C "$work/build" -j "$(nproc)" llama-bench llama-batched-bench
mkdir -p "$repo/.gpu/llama"
(cd "$work/build/bin" && tar cJf "$repo/.gpu/llama/bin.tar.xz" llama-bench llama-batched-bench ./*.so*)
echo "$repo/.gpu/llama/bin.tar.xz"
