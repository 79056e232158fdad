"""Captures a few small models and writes them to tests/data/graphs/ as the
protobuf JSON mapping of kiln.v1.GraphFile (the format kilnctl reads).

    PYTHONPATH=client/python:<build>/python /usr/bin/python3 tests/data/capture_graphs.py

The weights and inputs come from fixed seeds; only metadata is stored, so the
files change only when the capture (or torch) does.
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from google.protobuf import json_format

import kiln
from kiln.v1 import service_pb2

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "graphs")


class MLP(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear."""

    def __init__(self, features=32, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, features)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2, -1) + eps) * weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def attention(q, k, v):
    """Single-head softmax attention."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


class ConvBlock(nn.Module):
    """Conv2d -> BatchNorm2d -> ReLU."""

    def __init__(self, cin=3, cout=8):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


def graphs():
    """Yields (file name, kiln.v1.Graph) for every test graph."""
    torch.manual_seed(0)
    yield "mlp.json", kiln.capture(MLP(), torch.randn(8, 32))

    torch.manual_seed(1)
    yield "rmsnorm.json", kiln.capture(RMSNorm(32), torch.randn(8, 32))

    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 16, 32) for _ in range(3))
    yield "attention.json", kiln.capture(attention, q, k, v)

    torch.manual_seed(3)
    block = ConvBlock()
    with torch.no_grad():  # running statistics that are not the defaults
        block.bn.running_mean.uniform_(-0.5, 0.5)
        block.bn.running_var.uniform_(0.5, 1.5)
    block.eval()
    yield "conv_block.json", kiln.capture(block, torch.randn(1, 3, 16, 16))


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for file_name, graph in graphs():
        text = json_format.MessageToJson(service_pb2.GraphFile(graph=graph), indent=1)
        with open(os.path.join(OUT_DIR, file_name), "w") as f:
            f.write(text + "\n")
        print(f"{file_name}: {len(graph.inputs)} inputs, {len(graph.nodes)} nodes, "
              f"{len(text)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
