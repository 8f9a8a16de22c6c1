#!/usr/bin/env python3
"""Writes core/tests/data/quants/<type>.gguf: ggml's quantization and dequantization of random
rows for each newer quant type, the reference tessera's quantizers and dequantizers are checked
against (core/tests/quant_reference.rs).

Each file holds three tensors of 2 rows x 512: `input` (f32, random values with a different
scale per 32 values, some groups all zero), `quant` (the input quantized by ggml's
`ggml_quantize_chunk`, as llama-quantize does; with a random importance matrix for the types
that require one) and `dequant` (f32, `quant` dequantized by ggml's `to_float`, checked equal
to the gguf package's dequantize where it has the type).

Run with llama-cpp-python's interpreter (it ships ggml's shared libraries):
    PYTHONPATH=/work/pygguf /work/llamapy/venv/bin/python scripts/reference/make_quant_references.py
"""
import ctypes
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

import llama_cpp

TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL",
         "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4"]
ROWS, COLS = 2, 512


class Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


def main() -> None:
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    out_dir = Path(__file__).resolve().parents[2] / "core/tests/data/quants"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TYPES:
        qt = T[name]
        rng = np.random.default_rng(34 + qt.value)
        scales = rng.uniform(0.01, 2.0, size=(ROWS, COLS // 32, 1)).astype(np.float32)
        scales[0, 3] = 0.0  # a group of zeros
        x = (rng.standard_normal((ROWS, COLS // 32, 32)).astype(np.float32) * scales)
        x = np.ascontiguousarray(x.reshape(ROWS, COLS))
        imatrix = None
        if lib.ggml_quantize_requires_imatrix(qt.value):
            imatrix = np.ascontiguousarray(rng.uniform(0.1, 4.0, COLS).astype(np.float32))
        block, size = gguf.GGML_QUANT_SIZES[qt]
        q = np.zeros(ROWS * COLS // block * size, dtype=np.uint8)
        n = lib.ggml_quantize_chunk(qt.value, x.ctypes.data, q.ctypes.data, 0, ROWS, COLS,
                                    None if imatrix is None else imatrix.ctypes.data)
        assert n == q.size, (name, n, q.size)
        traits = lib.ggml_get_type_traits(qt.value).contents
        deq = np.zeros((ROWS, COLS), dtype=np.float32)
        to_float_t(traits.to_float)(q.ctypes.data, deq.ctypes.data, ROWS * COLS)
        try:
            py = dequantize(q.reshape(ROWS, -1), qt)
            assert np.array_equal(py.astype(np.float32), deq), f"{name}: gguf-py disagrees"
            checked = "checked against gguf-py"
        except NotImplementedError:
            checked = "gguf-py has no dequantize"
        w = gguf.GGUFWriter(str(out_dir / f"{name.lower()}.gguf"), arch="quant-reference")
        w.add_tensor("input", x)
        w.add_tensor("quant", q.reshape(ROWS, -1), raw_dtype=qt)
        w.add_tensor("dequant", deq)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(f"{name}: {q.size} bytes, imatrix={imatrix is not None}, {checked}")


if __name__ == "__main__":
    sys.exit(main())
