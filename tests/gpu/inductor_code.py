"""The code Inductor generates for a bench row, to read beside kiln's
(kiln_dump_code --target=cuda, or profile_kernels.py --traces).

    python3 tests/gpu/inductor_code.py ROW:DTYPE:MODE... --out DIR

Each row is compiled by Inductor with a cache directory of its own under
DIR, run once, and its generated modules (the Triton kernels and the
wrapper that launches them) are copied to DIR/ROW.DTYPE.MODE/.
"""

import argparse
import glob
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_kernels  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="+", help="ROW:DTYPE:MODE (sum_columns:bfloat16:inference)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for spec in args.rows:
        row, dtype, training = profile_kernels.parse_row(spec)
        label = spec.replace(":", ".")
        cache = os.path.abspath(os.path.join(args.out, "cache", label))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()
        fn, _, xs = profile_kernels.prepared(row, dtype, training, "inductor")
        profile_kernels.step(fn, xs, training)
        torch.cuda.synchronize()
        target = os.path.join(args.out, label)
        os.makedirs(target, exist_ok=True)
        copied = 0
        for path in glob.glob(os.path.join(cache, "**", "*.py"), recursive=True):
            with open(path) as f:
                text = f.read()
            if "@triton.jit" in text or "def call(" in text:
                shutil.copy(path, target)
                copied += 1
        print(f"{label}: {copied} modules in {target}")


if __name__ == "__main__":
    main()
