"""Writes compiler/ops/core_aten_ops.txt: the ops of the installed torch that
carry torch.Tag.core (torch 2's core ATen opset), one target per line, in
kiln's spelling ("aten.add.Tensor").

    .venv/bin/python tests/data/core_aten_ops.py

kiln_ops_doc reads the file to measure the op registry against the opset
(docs/ops.md); tests/python/test_core_ops.py checks that it is current.
"""

import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                   "compiler", "ops", "core_aten_ops.txt")


def core_ops():
    """Sorted targets of every core-tagged ATen overload the dispatcher knows
    (torch.ops.aten itself only lists the packets touched so far)."""
    targets = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, full = qualified.partition("::")
        if namespace != "aten":
            continue
        name, _, overload = full.partition(".")
        packet = getattr(torch.ops.aten, name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None and torch.Tag.core in op.tags:
            targets.add(f"aten.{name}.{overload or 'default'}")
    return sorted(targets)


def main():
    with open(OUT, "w") as f:
        f.write(f"# torch {torch.__version__.split('+')[0]}'s core ATen opset "
                "(tests/data/core_aten_ops.py writes this file)\n")
        f.write("\n".join(core_ops()) + "\n")


if __name__ == "__main__":
    main()
