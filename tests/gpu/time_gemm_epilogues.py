"""What cuBLASLt's activation epilogue (aten._addmm_activation, which
compiler/pipeline/addmm_activation.h makes of an inference graph's linear
layer and its tanh GELU) saves at the bench's linear layers with a
GELU: the GEMM with the epilogue against the plain GEMM plus one pointwise
pass over its product (what a fused bias-and-GELU kernel reads and
writes), and the epilogue's error against a float64 reference beside
that of the unfused form.

    python3 tests/gpu/time_gemm_epilogues.py

Prints one line per (dtype, shape): the median over seven turns of 50
back-to-back calls between CUDA events, in microseconds. Float32 runs at
full precision (no TF32), as the bench's rows do.
"""

import statistics

import torch
import torch.nn.functional as F

# (rows, in, out): gpt2_6_blocks', gpt2_block's and mlp_gelu's first linear.
LINEARS = [(4096, 768, 3072), (8192, 768, 3072), (8192, 1024, 4096)]


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    turns = []
    for _ in range(7):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        turns.append(start.elapsed_time(end) / reps * 1000)
    return statistics.median(turns)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.bfloat16):
        for rows, k, n in LINEARS:
            x = torch.randn(rows, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype) * k ** -0.5
            b = torch.randn(n, device="cuda", dtype=dtype)
            y = torch.mm(x, w.t())
            z = torch.empty_like(y)
            mm = timed(lambda: torch.mm(x, w.t()))
            addmm = timed(lambda: torch.addmm(b, x, w.t()))
            epilogue = timed(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
            one_pass = timed(lambda: torch.add(y, b, out=z))
            ref = F.gelu(torch.mm(x.double(), w.double().t()) + b.double(), approximate="tanh")
            fused = torch._addmm_activation(b, x, w.t(), use_gelu=True).double()
            unfused = F.gelu(torch.addmm(b, x, w.t()), approximate="tanh").double()
            print(f"{str(dtype)[6:]:8s} [{rows}, {k}] x [{k}, {n}]: mm {mm:.1f} us, addmm "
                  f"{addmm:.1f}, GELU epilogue {epilogue:.1f}, one pass over the product "
                  f"{one_pass:.1f}; mm and the pass {mm + one_pass:.1f} against the epilogue "
                  f"{epilogue:.1f}; largest error against float64: epilogue "
                  f"{(fused - ref).abs().max().item():.2e}, unfused "
                  f"{(unfused - ref).abs().max().item():.2e}", flush=True)


if __name__ == "__main__":
    main()
