"""Captures a few small models and writes them to tests/data/graphs/ as the
protobuf JSON mapping of kiln.v1.GraphFile (the format kilnctl reads).

    .venv/bin/python tests/data/capture_graphs.py   (after ./setup.sh build)

The weights and inputs come from fixed seeds; only metadata is stored, so the
files change only when the capture (or torch) does. resnet_block.json and
transformer_block.json are training graphs: the modules are in training mode
(batch statistics, dropout) and their parameters require grad.
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


class ResNetBlock(nn.Module):
    """ResNet's basic block: conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus the
    identity, then ReLU."""

    def __init__(self, channels=8):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class TransformerBlock(nn.Module):
    """Pre-LN transformer block: x + dropout(attention(LN(x))), then
    x + dropout(MLP(LN(x))) with a GELU MLP; multi-head self-attention
    written with matmuls and softmax."""

    def __init__(self, dim=32, heads=4, hidden=64, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(batch, seq, dim)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


def cases():
    """Yields (file name, function or module, example inputs) for every test
    graph, built from fixed seeds."""
    torch.manual_seed(0)
    yield "mlp.json", MLP(), (torch.randn(8, 32),)

    torch.manual_seed(1)
    yield "rmsnorm.json", RMSNorm(32), (torch.randn(8, 32),)

    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 16, 32) for _ in range(3))
    yield "attention.json", attention, (q, k, v)

    torch.manual_seed(3)
    block = ConvBlock()
    with torch.no_grad():  # running statistics that are not the defaults
        block.bn.running_mean.uniform_(-0.5, 0.5)
        block.bn.running_var.uniform_(0.5, 1.5)
    block.eval()
    yield "conv_block.json", block, (torch.randn(1, 3, 16, 16),)

    torch.manual_seed(4)
    yield "resnet_block.json", ResNetBlock(8).train(), (torch.randn(2, 8, 8, 8),)

    torch.manual_seed(5)
    yield "transformer_block.json", TransformerBlock().train(), (torch.randn(2, 8, 32),)


def graphs():
    """Yields (file name, kiln.v1.Graph) for every test graph."""
    for file_name, fn, inputs in cases():
        yield file_name, kiln.capture(fn, *inputs)


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
