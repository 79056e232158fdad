"""How ATen's ways to run a linear layer's matmul compare on this GPU: the
bench models' matmul shapes, each as at::mm (cuBLAS), at::addmm with a 1-D
bias (cuBLASLt with the bias in its epilogue, eager's linear), and both with
torch's preferred BLAS library set to cuBLASLt.

    python3 tests/gpu/time_gemms.py [--reps N]

Prints one line per (dtype, shape, operand layout): the median time of each
way in microseconds (CUDA events around N back-to-back calls, five turns).
Float32 runs at full precision (no TF32), as the bench's rows do.
"""

import argparse
import statistics

import torch

# (rows, in, out): the linears of the bench's MLP and GPT-2 rows, forward
# (x @ W^T), and the two matmuls of their backward.
LINEARS = [
    (8192, 1024, 4096), (8192, 4096, 1024),  # mlp_gelu
    (8192, 768, 2304), (8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768),  # gpt2_block
    (4096, 768, 2304), (4096, 768, 768), (4096, 768, 3072), (4096, 3072, 768),  # gpt2_6_blocks
]


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    turns = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        turns.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(turns)


def ways(a, b, bias):
    """name -> a callable computing a @ b (+ bias)."""
    return {
        "mm": lambda: torch.mm(a, b),
        "addmm": lambda: torch.addmm(bias, a, b),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    libraries = ["cublas", "cublaslt"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("dtype | matmul | " + " | ".join(f"{w} ({lib})" for lib in libraries
                                            for w in ("mm", "addmm")))
    for dtype in (torch.float32, torch.bfloat16):
        for rows, n_in, n_out in LINEARS:
            x = torch.randn(rows, n_in, device="cuda", dtype=dtype)
            w = torch.randn(n_out, n_in, device="cuda", dtype=dtype)
            g = torch.randn(rows, n_out, device="cuda", dtype=dtype)
            bias_out = torch.randn(n_out, device="cuda", dtype=dtype)
            bias_in = torch.randn(n_in, device="cuda", dtype=dtype)
            cases = {
                f"x[{rows},{n_in}] @ W^T[{n_in},{n_out}]": (x, w.t(), bias_out),
                f"g[{rows},{n_out}] @ W[{n_out},{n_in}]": (g, w, bias_in),
                f"g^T[{n_out},{rows}] @ x[{rows},{n_in}]": (g.t(), x, bias_in),
            }
            for name, (a, b, bias) in cases.items():
                times = []
                for lib in libraries:
                    torch.backends.cuda.preferred_blas_library(lib)
                    for fn in ways(a, b, bias).values():
                        times.append(timed(fn, args.reps))
                torch.backends.cuda.preferred_blas_library("cublas")
                cells = " | ".join(f"{t:8.1f}" for t in times)
                print(f"{str(dtype)[6:]} | {name} | {cells}", flush=True)


if __name__ == "__main__":
    main()
