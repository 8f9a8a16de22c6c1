"""PyTorch's cuBLAS GEMM rate on this GPU, the anchor tessera's GEMM figures are compared with
(run beside the tessera benchmark in one command: machines are shared and noisy)."""
import time

import torch


def gemm(n, dtype, iters=20):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    s = sorted(times)[len(times) // 2]
    print(f"torch gemm {str(dtype).split('.')[-1]} {n}^3: {s * 1e3:.3f} ms, {2 * n**3 / s / 1e12:.1f} TFLOP/s")


for n in (4096, 8192):
    for dt in (torch.float16, torch.bfloat16):
        gemm(n, dt)
