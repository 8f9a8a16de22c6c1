#!/usr/bin/env python3
"""llama.cpp's reference outputs for one small random-weight model per quant type.

For each type (every newer GGUF quant type, and llama.cpp's IQ4_XS mix), this writes
`tessera gguf synth --like quant-small --type TYPE` into a temporary folder, and runs it in
llama.cpp through llama-cpp-python as scripts/reference/make_arch_references.py runs the
architecture models (same prompts, settings and JSON layout; no controls), writing
llm/tests/data/quant/TYPE.json, which llm/tests/quant_models.rs compares against.

llama.cpp runs a copy of the file with every quantized tensor dequantized to F32 by gguf-py
(whose dequantize is ggml's, bit for bit, for every one of these types: see
make_quant_references.py). Run on the quantized file itself, llama.cpp quantizes the
activations to 8 bits before each product, and on these random models that alone moves its
logits by up to 9 (Q8_0 weights included), far past what tells a wrong block layout from a
right one; with F32 weights of the same values it does not, and tessera's precise mode (f32
activations, each weight block dequantized as it is read) computes the same products from the
quantized file.

Usage (from the repository root, after `cargo build -p tessera-cli`):
    /work/llamapy/venv/bin/python scripts/reference/make_quant_model_references.py \
        [--tessera target/debug/tessera] [--only TYPE ...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_arch_references as arch  # noqa: E402

OUT_DIR = os.path.join(arch.ROOT, "llm", "tests", "data", "quant")
LIKE = "quant-small"
TYPES = ["iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl",
         "iq4_xs", "tq1_0", "tq2_0", "mxfp4", "iq4_xs_mix"]


def dequantized_copy(src):
    """A copy of GGUF file `src` with every quantized tensor dequantized to F32."""
    sys.path.insert(0, arch.GGUF_PY)
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    dst = src[: -len(".gguf")] + "-f32.gguf"
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        if vt == GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), vt)
    for t in r.tensors:
        kind = t.tensor_type
        if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=kind)
        else:
            values = np.ascontiguousarray(dequantize(t.data, kind), dtype=np.float32)
            w.add_tensor(t.name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=os.path.join(arch.ROOT, "target", "debug", "tessera"))
    ap.add_argument("--gguf-py", default="/work/pygguf")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args()
    arch.GGUF_PY = a.gguf_py
    # The architecture's controls test features of the architectures, not of the weight types.
    arch.controls = lambda *_: []
    load = arch.load
    arch.load = lambda path: load(dequantized_copy(path))
    commit = subprocess.run(
        ["git", "-C", arch.ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    version = subprocess.run(
        [a.tessera, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    os.makedirs(OUT_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for ty in a.only or TYPES:
            arch.TYPE = ty
            ref = arch.make(LIKE, a.tessera, tmp, commit, version)
            ref["llama_cpp"]["weights"] = (
                "every quantized tensor dequantized to F32 by gguf-py (ggml's dequantize)"
            )
            # Per-tensor types, as llama.cpp read them, are in metadata.tensors.
            with open(os.path.join(OUT_DIR, f"{ty}.json"), "w") as f:
                json.dump(ref, f, separators=(",", ":"))
                f.write("\n")
            gaps = [p["gaps"] for p in ref["prompts"]]
            print(f"{ty}: first near-ties " + ", ".join(str(arch.first_tie(g)) for g in gaps))


if __name__ == "__main__":
    main()
