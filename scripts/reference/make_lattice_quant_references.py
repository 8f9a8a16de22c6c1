#!/usr/bin/env python3
"""Writes core/tests/data/quants/lattice_quant.gguf: ggml's quantization of varied rows to each
lattice i-quant (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), the bytes tessera's
lattice quantizers must reproduce (core/tests/quant_reference.rs).

The rows (512 values each) are of several kinds: normal values with a different scale per 32,
uniform values, heavy-tailed values, values of about 1e-6, rows with an all-zero 32-value
sub-block at different places, rows of small values with one large outlier per block, and
rows with many equal values (half zeros; values on a coarse grid).
`input` holds them (f32), `imatrix` one importance weight per column (f32, random), and
`quant_<type>` ggml's `ggml_quantize_chunk` of `input` (with `imatrix` for the types for which
`ggml_quantize_requires_imatrix` holds, without one otherwise, as llama-quantize does).

Run with llama-cpp-python's interpreter (it ships ggml's shared libraries):
    PYTHONPATH=/work/pygguf /work/llamapy/venv/bin/python \
        scripts/reference/make_lattice_quant_references.py
"""
import ctypes
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T

import llama_cpp

TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]
COLS = 512


def rows(rng: np.random.Generator) -> np.ndarray:
    """The input rows, two of each kind."""
    out = []
    for _ in range(2):
        scales = rng.uniform(0.01, 2.0, size=(COLS // 32, 1))
        out.append((rng.standard_normal((COLS // 32, 32)) * scales).reshape(COLS))
        out.append(rng.uniform(-1.0, 1.0, COLS))
        out.append(rng.standard_normal(COLS) / np.sqrt(rng.uniform(0.05, 1.0, COLS)))
        out.append(rng.standard_normal(COLS) * 1e-6)
    for zero in (0, 5, 7, 12):
        x = rng.standard_normal(COLS)
        x[32 * zero:32 * zero + 32] = 0.0
        out.append(x)
    for _ in range(2):
        x = rng.standard_normal(COLS) * 0.01
        x[rng.integers(0, 256)] = 5.0
        x[256 + rng.integers(0, 256)] = -7.0
        out.append(x)
    # Ties: half the values exactly zero, and values on a coarse grid (the sorts of the IQ1
    # searches must order equal values as ggml does).
    x = rng.standard_normal(COLS)
    x[rng.random(COLS) < 0.5] = 0.0
    out.append(x)
    out.append(np.round(rng.standard_normal(COLS) * 4.0) / 4.0)
    return np.ascontiguousarray(np.stack(out).astype(np.float32))


def main() -> None:
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]

    rng = np.random.default_rng(2734)
    x = rows(rng)
    imatrix = np.ascontiguousarray(rng.uniform(0.1, 4.0, COLS).astype(np.float32))
    n_rows = x.shape[0]
    out = Path(__file__).resolve().parents[2] / "core/tests/data/quants/lattice_quant.gguf"
    w = gguf.GGUFWriter(str(out), arch="quant-reference")
    w.add_tensor("input", x)
    w.add_tensor("imatrix", imatrix)
    for name in TYPES:
        qt = T[name]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        q = np.zeros(n_rows * COLS // block * size, dtype=np.uint8)
        needs = lib.ggml_quantize_requires_imatrix(qt.value)
        n = lib.ggml_quantize_chunk(qt.value, x.ctypes.data, q.ctypes.data, 0, n_rows, COLS,
                                    imatrix.ctypes.data if needs else None)
        assert n == q.size, (name, n, q.size)
        w.add_tensor(f"quant_{name.lower()}", q.reshape(n_rows, -1), raw_dtype=qt)
        print(f"{name}: {q.size} bytes, imatrix={needs}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    sys.exit(main())
