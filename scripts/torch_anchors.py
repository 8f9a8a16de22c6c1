#!/usr/bin/env python3
"""PyTorch ceilings measured beside tessera in the same run (ANCHORS.md's method): median of
timed runs after warm-up. Prints a markdown table."""
import statistics
import torch

def bench(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return statistics.median(ts)

dev = "cuda"
rows = []
n = 1 << 28  # 1 GiB of f32
a = torch.empty(n, dtype=torch.float32, device=dev); b = torch.empty_like(a)
t = bench(lambda: b.copy_(a), 20)
rows.append(("device-to-device copy, bytes read + written", f"{2 * a.numel() * 4 / t / 1e9:,.0f} GB/s"))
del a, b
for m, k in [(14336, 4096), (4096, 14336)]:
    w = [torch.randn(m, k, dtype=torch.float16, device=dev) for _ in range(8)]
    x = torch.randn(k, dtype=torch.float16, device=dev)
    i = [0]
    def gemv():
        i[0] = (i[0] + 1) % 8
        torch.mv(w[i[0]], x)
    t = bench(gemv)
    rows.append((f"f16 GEMV {m}x{k}, 8 matrices rotated", f"{m * k * 2 / t / 1e9:,.0f} GB/s ({t * 1e6:.1f} µs)"))
    del w
torch.backends.cuda.matmul.allow_tf32 = False
for n, dt, name in [(4096, torch.float16, "f16"), (4096, torch.float32, "f32 (no TF32)"),
                    (8192, torch.float16, "f16"), (8192, torch.bfloat16, "bf16")]:
    x = torch.randn(n, n, dtype=dt, device=dev); y = torch.randn(n, n, dtype=dt, device=dev)
    t = bench(lambda: x @ y, 20)
    rows.append((f"GEMM {n}^3 {name}", f"{2 * n ** 3 / t / 1e12:.1f} TFLOP/s"))
    del x, y
print("| PyTorch anchor (same run) | figure |")
print("|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} |")
