"""Training cases written as users write them, beyond the suite's models:
torch.compile with the kiln backend against eager CUDA, float32 and
bfloat16, outputs and the gradients of inputs and parameters.

    KILN_SERVER=127.0.0.1:50151 python3 tests/gpu/training_cases.py

(tests/gpu/run.sh --run="python3 tests/gpu/training_cases.py" starts kilnd
and runs it.) A case passes when kiln compiled every graph (none ran
eagerly) and matched eager. The backends are not tiered, so that every step
runs kiln's kernels (a tiered compile's first steps run the graph through
ATen). Prints a line per case; exits 1 if any failed.
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

DEVICE = "cuda"
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


class GPT(nn.Module):
    """Token and position embeddings (the head's weight tied to the
    token embedding), causal SDPA, RMSNorm, and the cross-entropy loss."""

    def __init__(self, vocab=100, d=64, heads=4, layers=2, tokens=16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(tokens, d)
        self.heads = heads
        self.blocks = nn.ModuleList([nn.ModuleDict(dict(
            ln1=nn.LayerNorm(d), qkv=nn.Linear(d, 3 * d), proj=nn.Linear(d, d),
            ln2=nn.RMSNorm(d), fc=nn.Linear(d, 4 * d), out=nn.Linear(4 * d, d)))
            for _ in range(layers)])
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, target):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], -1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x))))
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), target.view(-1))


def activations(x):
    return (F.softplus(x) + F.mish(x) + F.elu(x) + F.selu(x) + F.celu(x) + F.logsigmoid(x)
            + F.hardsigmoid(x) + F.relu6(x) + F.glu(x.repeat(1, 2), -1) + F.leaky_relu(x, 0.2)
            + F.hardswish(x) + torch.trunc(x) * x)


def losses(x, y, target):
    return (F.mse_loss(x, y) + F.l1_loss(x, y) + F.smooth_l1_loss(x, y) + F.huber_loss(x, y)
            + F.binary_cross_entropy_with_logits(x, y.sigmoid())
            + F.kl_div(F.log_softmax(x, -1), F.softmax(y, -1), reduction="batchmean")
            + F.cosine_similarity(x, y).sum()
            + F.binary_cross_entropy(x.float().sigmoid(), target.float()))


def norms(x):
    return (F.normalize(x, dim=-1).sum() + torch.linalg.vector_norm(x, dim=1).sum() + x.norm()
            + x.std(0).sum() + torch.logsumexp(x, 0).sum() + x.amin(0).sum())


def indexing(x):
    rows = torch.arange(3, device=x.device) * 2 % x.shape[0]
    spread = (torch.arange(x.shape[1], device=x.device) * 5 % 6).unsqueeze(0)
    scattered = torch.zeros(6, x.shape[1], device=x.device, dtype=x.dtype)
    return (x.index_select(0, rows).sum(0) * torch.topk(x, 2, 1).values.sum()
            + torch.sort(x, 0)[0][:2].sum(0) + torch.cumsum(x, 1).flip(1).sum(0)
            + torch.cummax(x, 1).values.sum(0) + torch.median(x, 1).values.sum()
            + torch.roll(x, 1, 0).sum(0) + scattered.scatter_add(0, spread, x[:1]).sum(0)
            + scattered.scatter(0, spread, x[:1] * 3).sum(0)
            + x.masked_scatter(x > 0, x.flip(0) * 2).sum(0))


def pads(x):
    return (F.pad(x, (1, 2, 1, 0), mode="reflect").sum()
            + F.pad(x, (1, 1, 2, 2), mode="replicate").sum()
            + F.adaptive_max_pool2d(x, (2, 3)).sum())


class BagsAndScans(nn.Module):
    """Embedding bags (mean with padding, sum with per-sample weights),
    cumprod over zeros, prod, min along a dim, round, diagonal, grid_sample,
    a slice assignment, scatter_reduce and 3-d pooling. Eager CUDA has no
    16-bit backward for per-sample weights: those are float32 alone."""

    def __init__(self, weighted):
        super().__init__()
        self.weighted = weighted
        self.bags = nn.EmbeddingBag(20, 6, mode="mean", padding_idx=0)
        self.register_buffer("ids", torch.tensor([3, 0, 7, 7, 1, 9, 2, 19]))
        self.register_buffer("offsets", torch.tensor([0, 2, 2, 5]))
        self.register_buffer("slots", torch.tensor([[0, 2, 0, 1, 1, 2, 0, 0]] * 4))

    def forward(self, x):
        mean = self.bags(self.ids, self.offsets)
        summed = F.embedding_bag(self.ids, self.bags.weight, self.offsets, mode="sum",
                                 per_sample_weights=x[0, :8] if self.weighted else None)
        y = x * 1
        y[:, 1:4] = (mean + summed)[:3].sum(1)
        grid = torch.tanh(x[:2, :8].reshape(1, 2, 4, 2)) * 1.2
        sampled = F.grid_sample(y[:4].reshape(1, 2, 2, 8), grid, align_corners=False)
        return (torch.cumprod(torch.relu(x), 1).sum(0) * sampled.sum()
                + torch.prod(torch.relu(x[:, :3]) + 0.5, 1).sum() + x.min(1).values.sum()
                + torch.round(x * 3) * x + torch.diagonal(y, 1).sum()
                + x[:3].scatter_reduce(0, self.slots, x[4:] * 2, "amax", include_self=False).sum(0)
                + x[:3].scatter_reduce(0, self.slots, x[4:], "mean").sum(0)
                + F.avg_pool3d(x.reshape(1, 2, 4, 8), (2, 2, 2)).sum())


class StopGradients(nn.Module):
    """detach(), `.data`, a no_grad region (a scale and a buffer updated
    from activations) and a straight-through estimator; nn.Bilinear and a
    max over every element."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.bilinear = nn.Bilinear(8, 8, 4)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x):
        h = self.linear(x)
        with torch.no_grad():
            scale = h.abs().amax() + 1.0
            self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        quantized = h + (torch.round(h * 4) / 4 - h).detach()
        return (quantized / scale + (h - (h.data * 0.5).tanh()) ** 2 + h * self.ema
                + h.detach().sigmoid() * x + self.bilinear(x, h).sum() * h.max())


class LlamaAttention(nn.Module):
    """RMSNorm, rotary embeddings through complex numbers as Llama writes
    them (a complex buffer of rotations), causal SDPA."""

    def __init__(self, d=64, heads=4, tokens=16):
        super().__init__()
        self.heads = heads
        self.norm = nn.RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        half = d // heads // 2
        angles = torch.outer(torch.arange(tokens).float(),
                             1.0 / 10000 ** (torch.arange(half).float() / half))
        self.register_buffer("rotations", torch.polar(torch.ones_like(angles), angles),
                             persistent=False)

    def rotate(self, x):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        turn = self.rotations[:x.shape[1]].view(1, x.shape[1], 1, -1)
        return torch.view_as_real(pairs * turn).flatten(3).type_as(x)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm(x)
        q, k, v = (w(h).view(b, t, self.heads, -1) for w in (self.wq, self.wk, self.wv))
        q, k = self.rotate(q), self.rotate(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return x + self.wo(y.transpose(1, 2).reshape(b, t, d))


def llama_attention(dtype):
    """LlamaAttention in `dtype`, its rotations complex still (a module's
    .to(dtype) would keep their real parts alone)."""
    module = LlamaAttention()
    rotations = module.rotations
    module = module.to(DEVICE, dtype)
    module.rotations = rotations.to(DEVICE)
    return module


def reductions_over_symbolic_sizes(x):
    b, t, d = x.shape
    q, k, v = x.view(b, t, 3, d // 3).permute(2, 0, 1, 3)  # heads split from one tensor
    return ((q + 2 * k + 3 * v).square().sum() + x.mean(1).sum()
            + F.layer_norm(x, x.shape[-1:]) * x + x.var(1).sum()
            + F.mse_loss(x.tanh(), torch.zeros_like(x)) + x * x.shape[-1]
            + x.sum(-1, keepdim=True) / (x.shape[-1] - 1) + x / math.sqrt(x.shape[-1])
            # floats of sizes where ATen takes only a number
            + (x.abs() + 0.1).pow(1.0 / x.shape[-1]) + x.clamp(min=-1.0 / x.shape[1])
            + F.leaky_relu(x, 1.0 / x.shape[-1]) + torch.full_like(x, x.shape[1] / 4.0))


def special(x, y):
    """The special functions ATen runs for kiln (in float32: ATen has
    no 16-bit erfcx or ndtri)."""
    x, y = x.float(), y.float()
    a = F.softplus(x) + 0.5
    p = torch.sigmoid(y) * 0.9 + 0.05
    return (torch.lgamma(a) + torch.digamma(a) * 0.5 + torch.polygamma(1, a)
            + torch.erfc(x) + torch.special.erfcx(x.abs()) + torch.special.ndtri(p)
            + torch.i0(y) + torch.special.log_ndtr(x))


def cases(dtype):
    def rand(*shape):
        return torch.randn(*shape, device=DEVICE, dtype=dtype, requires_grad=True)

    target = torch.rand(4, 6, device=DEVICE, dtype=dtype)
    norm_layers = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU(), nn.Upsample(scale_factor=2),
        nn.InstanceNorm2d(8), nn.AdaptiveAvgPool2d((3, 5)), nn.Flatten(), nn.Linear(120, 4))
    tokens = torch.randint(0, 100, (2, 16), device=DEVICE)
    return {
        "gpt": (GPT().to(DEVICE, dtype),
                lambda: (tokens, torch.randint(0, 100, (2, 16), device=DEVICE))),
        "activations": (activations, lambda: (rand(4, 6),)),
        "losses": (losses, lambda: (rand(4, 6), rand(4, 6), target)),
        "special": (special, lambda: (rand(4, 6), rand(4, 6))),
        "norms": (norms, lambda: (rand(4, 6),)),
        "indexing": (indexing, lambda: (rand(4, 6),)),
        "norm_layers": (norm_layers.to(DEVICE, dtype), lambda: (rand(2, 3, 7, 9),)),
        "pads": (pads, lambda: (rand(1, 2, 5, 5),)),
        "bags_and_scans": (BagsAndScans(dtype == torch.float32).to(DEVICE, dtype),
                           lambda: (rand(8, 8),)),
        "stop_gradients": (StopGradients().to(DEVICE, dtype), lambda: (rand(6, 8),)),
        "llama_attention": (llama_attention(dtype), lambda: (rand(2, 16, 64),)),
    }


def run(fn, args):
    """fn's output and the gradients of its inputs and parameters."""
    args = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in args)
    params = list(fn.parameters()) if isinstance(fn, nn.Module) else []
    for p in params:
        p.grad = None
    out = fn(*args)
    out.float().sum().backward()
    return out, [t.grad for t in args if t.requires_grad] + [p.grad for p in params]


def buffers(fn):
    """The floating-point buffers of module `fn` (state a call may update)."""
    if not isinstance(fn, nn.Module):
        return []
    return [b for b in fn.buffers() if b.is_floating_point()]


def close(a, b, tol):
    scale = max(1.0, b.float().abs().max().item()) if b.numel() else 1.0
    return torch.allclose(a.float(), b.float(), atol=tol * scale, rtol=tol)


def main():
    failed = 0
    for dtype in (torch.float32, torch.bfloat16):
        tol = TOL[dtype]
        for name, (fn, make) in cases(dtype).items():
            torch._dynamo.reset()
            backend = kiln.backend(os.environ["KILN_SERVER"], on_unavailable="raise", tiered=False)
            torch.manual_seed(1)
            args = make()
            initial = [b.clone() for b in buffers(fn)]
            try:
                got, got_grads = run(torch.compile(fn, backend=backend), args)
                got_grads = [g.clone() for g in got_grads]
                got_buffers = [b.clone() for b in buffers(fn)]
                for b, value in zip(buffers(fn), initial):  # eager starts where kiln did
                    b.copy_(value)
                want, want_grads = run(fn, args)
            except Exception as e:  # a refusal names the node and the op
                failed += 1
                print(f"{name} {dtype}: ERROR {type(e).__name__}: {str(e)[:500]}", flush=True)
                continue

            ok = (close(got, want, tol) and len(got_grads) == len(want_grads)
                  and all(a is not None and close(a, b, tol)
                          for a, b in zip(got_grads, want_grads))
                  and all(close(a, b, tol) for a, b in zip(got_buffers, buffers(fn)))
                  and backend.stats["eager"] == 0)
            failed += not ok
            print(f"{name} {dtype}: {'OK' if ok else 'FAILED'} {backend.stats} "
                  f"{[why[:120] for _, why in backend.unsupported]}", flush=True)
    # dynamic=True: one symbolic graph serves every shape, gradients
    # through reductions over symbolic sizes; then an empty batch.
    for dtype in (torch.float32, torch.bfloat16):
        torch._dynamo.reset()
        backend = kiln.backend(os.environ["KILN_SERVER"], on_unavailable="raise", tiered=False)
        compiled = torch.compile(reductions_over_symbolic_sizes, backend=backend, dynamic=True)
        ok = True
        for shape in ((2, 5, 6), (3, 7, 12), (2, 9, 33)):
            x = torch.randn(shape, device=DEVICE, dtype=dtype, requires_grad=True)
            got, (got_grad,) = run(compiled, (x,))
            want, (want_grad,) = run(reductions_over_symbolic_sizes, (x,))
            ok = ok and close(got, want, TOL[dtype]) and close(got_grad, want_grad, TOL[dtype])
        # Batch norm over a dynamic batch: n / (n - 1) of the sizes, and its
        # momentum a float Dynamo passes as a tensor.
        torch._dynamo.reset()
        conv = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4),
                             nn.Tanh()).to(DEVICE, dtype)
        initial = [b.clone() for b in buffers(conv)]
        compiled = torch.compile(conv, backend=backend, dynamic=True)
        for batch in (2, 3, 5):
            x = torch.randn(batch, 3, 8, 8, device=DEVICE, dtype=dtype, requires_grad=True)
            got, got_grads = run(compiled, (x,))
            got_grads = [g.clone() for g in got_grads]
            got_buffers = [b.clone() for b in buffers(conv)]
            for b, value in zip(buffers(conv), initial):
                b.copy_(value)
            want, want_grads = run(conv, (x,))
            ok = ok and close(got, want, TOL[dtype]) and all(
                close(a, b, TOL[dtype]) for a, b in zip(got_grads + got_buffers,
                                                         want_grads + buffers(conv)))
            initial = [b.clone() for b in buffers(conv)]
        empty = torch.randn(0, 8, device=DEVICE, dtype=dtype, requires_grad=True)
        torch._dynamo.reset()
        got, (got_grad,) = run(torch.compile(lambda x: F.layer_norm(x, (8,)).softmax(-1),
                                             backend=backend), (empty,))
        ok = ok and got.shape == (0, 8) and got_grad.shape == (0, 8)
        ok = ok and backend.stats["eager"] == 0 and backend.stats["graphs"] <= 4
        failed += not ok
        print(f"symbolic sizes, batch norm and an empty batch {dtype}: {'OK' if ok else 'FAILED'} "
              f"{backend.stats}", flush=True)
    print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
