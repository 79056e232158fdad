"""Models the suite and the bench do not have, written as their users write
them: a BERT encoder with a padding mask, nn.TransformerEncoderLayer and
nn.MultiheadAttention, a ViT, a MobileNet block with squeeze-and-excitation,
a U-Net with transposed convolutions, a T5 attention with relative position
buckets, a mixture of experts, a 1-d conv net, GRU and LSTM cells, a
ConvNeXt block, DLRM, CLIP's loss, a diffusion model's residual block, a
sub-pixel super-resolution net, and an MLP with dropout. Each through
torch.compile with the kiln backend against eager, in inference (eval, no
grad) and training (outputs, and the gradients of inputs and parameters); a 16-bit case that
differs from eager must be as close to the float32 run as eager is.

    KILN_SERVER=127.0.0.1:50151 python3 tests/gpu/model_zoo.py [--device cuda|cpu]
        [--dtypes float32,bfloat16] [--models bert,vit,...]

(tests/gpu/run.sh --run="python3 tests/gpu/model_zoo.py" starts kilnd and
runs it.) A case passes when it matched eager and no graph kiln was given
ran eagerly. Prints a line per case; exits 1 if any failed.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


class BertLayer(nn.Module):
    """Word, position and token-type embeddings, an additive padding mask,
    post-norm attention and a tanh-GELU feed-forward, and the pooler."""

    def __init__(self, vocab=100, d=64, heads=4, seq=32):
        super().__init__()
        self.heads = heads
        self.word = nn.Embedding(vocab, d, padding_idx=0)
        self.position = nn.Embedding(seq, d)
        self.token_type = nn.Embedding(2, d)
        self.norm0 = nn.LayerNorm(d, eps=1e-12)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d, eps=1e-12)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-12)
        self.pooler = nn.Linear(d, d)
        self.drop = nn.Dropout(0.0)

    def forward(self, ids, mask):
        b, t = ids.shape
        positions = torch.arange(t, device=ids.device).expand(b, t)
        x = self.word(ids) + self.position(positions) + self.token_type(torch.zeros_like(ids))
        x = self.drop(self.norm0(x))
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores + (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        attn = scores.softmax(-1) @ v
        x = self.norm1(x + self.out(attn.transpose(1, 2).reshape(b, t, -1)))
        x = self.norm2(x + self.down(F.gelu(self.up(x), approximate="tanh")))
        return torch.tanh(self.pooler(x[:, 0])), x


class TorchTransformer(nn.Module):
    """nn.TransformerEncoderLayer (its fused path in inference) and
    nn.MultiheadAttention with a key padding mask."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, 128, dropout=0.0, batch_first=True,
                                                activation="gelu", norm_first=True)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x, padding):
        y = self.layer(x)
        z, _ = self.mha(y, y, y, key_padding_mask=padding, need_weights=False)
        return z


class ViT(nn.Module):
    """Patches by a strided convolution, a class token, learned positions,
    pre-norm blocks with SDPA, the class token's head."""

    def __init__(self, d=64, heads=4, depth=2, classes=10):
        super().__init__()
        self.heads = heads
        self.patch = nn.Conv2d(3, d, 8, stride=8)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "n1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d),
            "n2": nn.LayerNorm(d), "fc1": nn.Linear(d, 4 * d), "fc2": nn.Linear(4 * d, d),
        }) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        b, t, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["n1"](x)).reshape(b, t, 3, self.heads, -1).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2))
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, d))
            x = x + blk["fc2"](F.gelu(blk["fc1"](blk["n2"](x))))
        return self.head(self.norm(x)[:, 0])


class MobileBlock(nn.Module):
    """MobileNetV3's inverted residual: expansion, a depthwise convolution,
    squeeze-and-excitation with hardsigmoid, hardswish, projection."""

    def __init__(self, c=16, expand=4):
        super().__init__()
        e = c * expand
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(c), nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False),
                                       nn.BatchNorm2d(e), nn.Hardswish())
        self.squeeze = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(e, e // 4, 1), nn.ReLU(),
                                     nn.Conv2d(e // 4, e, 1), nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.depthwise(self.expand(x))
        y = self.project(y * self.squeeze(y))
        return self.head((x + y).mean((2, 3)))


class UNet(nn.Module):
    """Two levels down by max pooling, up by a transposed convolution and
    by bilinear upsampling, skip connections concatenated."""

    def __init__(self, c=8):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

        self.down0, self.down1, self.mid = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.up1 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec1 = block(4 * c, 2 * c)
        self.dec0 = block(3 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        s0 = self.down0(x)
        s1 = self.down1(F.max_pool2d(s0, 2))
        m = self.mid(F.max_pool2d(s1, 2))
        d1 = self.dec1(torch.cat([self.up1(m), s1], 1))
        up = F.interpolate(d1, scale_factor=2, mode="bilinear", align_corners=True)
        return self.out(self.dec0(torch.cat([up, s0], 1)))


class T5Attention(nn.Module):
    """T5's self-attention: relative positions bucketed (logarithmically
    beyond half the buckets), a learned bias per bucket and head, no
    scaling, RMS-normed input without bias, and a ReLU feed-forward."""

    def __init__(self, d=64, heads=4, buckets=32, max_distance=128):
        super().__init__()
        self.heads, self.buckets, self.max_distance = heads, buckets, max_distance
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.bias = nn.Embedding(buckets, heads)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d, bias=False), nn.ReLU(),
                                nn.Linear(2 * d, d, bias=False))

    def bucket(self, relative):
        half = self.buckets // 2
        ret = (relative > 0).long() * half
        n = relative.abs()
        exact = half // 2
        large = exact + (torch.log(n.float() / exact) / math.log(self.max_distance / exact)
                         * (half - exact)).long()
        large = torch.min(large, torch.full_like(large, half - 1))
        return ret + torch.where(n < exact, n, large)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm(x)
        q, k, v = (f(h).view(b, t, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        pos = torch.arange(t, device=x.device)
        bias = self.bias(self.bucket(pos[None, :] - pos[:, None])).permute(2, 0, 1)
        attn = (q @ k.transpose(-1, -2) + bias).softmax(-1) @ v
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.norm(x))


class MoE(nn.Module):
    """A router's top-2 of 4 experts, each token's outputs weighted by the
    softmax of its two scores and summed with index_add."""

    def __init__(self, d=32, experts=4, hidden=64):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, d, hidden) / math.sqrt(d))
        self.down = nn.Parameter(torch.randn(experts, hidden, d) / math.sqrt(hidden))

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        scores, chosen = self.router(tokens).topk(2, dim=-1)
        weights = scores.softmax(-1)
        out = torch.zeros_like(tokens)
        for e in range(self.up.shape[0]):
            hit = (chosen == e)
            w = (weights * hit).sum(-1, keepdim=True)
            y = F.silu(tokens @ self.up[e]) @ self.down[e]
            out = out + w * y
        return out.view_as(x)


class Conv1dNet(nn.Module):
    """Audio-style: a strided 1-d convolution, group norm, a gated linear
    unit, a dilated convolution, and mean over time."""

    def __init__(self, c=16):
        super().__init__()
        self.conv0 = nn.Conv1d(1, 2 * c, 9, stride=4, padding=4)
        self.norm = nn.GroupNorm(4, 2 * c)
        self.conv1 = nn.Conv1d(c, c, 3, padding=2, dilation=2)
        self.head = nn.Linear(c, 5)

    def forward(self, wave):
        x = F.glu(self.norm(self.conv0(wave)), dim=1)
        x = x + F.gelu(self.conv1(x))
        return F.log_softmax(self.head(x.mean(-1)), dim=-1)


class RecurrentTagger(nn.Module):
    """An embedding, a GRU cell and an LSTM cell stepped in a Python loop
    (which Dynamo unrolls into one graph), and a tag head."""

    def __init__(self, vocab=50, d=32, tags=7):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.gru = nn.GRUCell(d, d)
        self.lstm = nn.LSTMCell(d, d)
        self.head = nn.Linear(d, tags)

    def forward(self, ids):
        x = F.layer_norm(self.embed(ids), (self.embed.embedding_dim,))
        h = torch.zeros(x.shape[0], x.shape[2], device=x.device, dtype=x.dtype)
        c, g, ys = h, h, []
        for t in range(x.shape[1]):
            g = self.gru(x[:, t], g)
            h, c = self.lstm(g, (h, c))
            ys.append(h)
        return F.log_softmax(self.head(torch.stack(ys, 1)), dim=-1)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt: a 7x7 depthwise convolution, channels-last layer norm, an
    inverted bottleneck of linears with GELU, a learned layer scale."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, stride=4)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.up, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))
        self.head = nn.Linear(c, 10)

    def forward(self, img):
        x = self.stem(img)
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = (self.gamma * self.down(F.gelu(self.up(y)))).permute(0, 3, 1, 2)
        return self.head((x + y).mean((-2, -1)))


class DLRM(nn.Module):
    """Recommendation: dense features through an MLP, sparse ones through
    embedding bags, their pairwise dot products (bmm, the upper triangle)
    and a top MLP with a logit."""

    def __init__(self, dense=8, d=16, tables=3, rows=40):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 32), nn.ReLU(), nn.Linear(32, d), nn.ReLU())
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, d, mode="sum") for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(d + pairs, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        features = torch.stack([x] + [bag(indices[k], offsets) for k, bag in
                                      enumerate(self.bags)], 1)
        dots = features @ features.transpose(1, 2)
        i, j = torch.triu_indices(features.shape[1], features.shape[1], 1, device=x.device)
        return torch.sigmoid(self.top(torch.cat([x, dots[:, i, j]], 1)))


class CLIPLoss(nn.Module):
    """Two towers, normalized embeddings, a learned temperature and the
    symmetric cross-entropy of the similarity matrix."""

    def __init__(self, d=24, e=16):
        super().__init__()
        self.image, self.text = nn.Linear(d, e), nn.Linear(d, e)
        self.scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images, texts):
        a = F.normalize(self.image(images), dim=-1)
        b = F.normalize(self.text(texts), dim=-1)
        logits = self.scale.exp() * a @ b.t()
        labels = torch.arange(a.shape[0], device=a.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


class DiffusionBlock(nn.Module):
    """A diffusion U-Net's residual block: sinusoidal timestep embeddings
    through an MLP, group norm, SiLU, the embedding added per channel."""

    def __init__(self, c=16, t=32):
        super().__init__()
        self.t = t
        self.time = nn.Sequential(nn.Linear(t, 4 * t), nn.SiLU(), nn.Linear(4 * t, c))
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.norm1, self.norm2 = nn.GroupNorm(4, c), nn.GroupNorm(4, c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x, steps):
        half = self.t // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=x.device) / half)
        angles = steps[:, None].float() * freqs[None]
        emb = self.time(torch.cat([angles.sin(), angles.cos()], -1).to(x.dtype))
        h = self.conv_in(x)
        y = self.conv1(F.silu(self.norm1(h))) + emb[:, :, None, None]
        y = self.conv2(F.silu(self.norm2(y)))
        return self.out(h + y)


class SuperResolution(nn.Module):
    """ESPCN-style: convolutions with tanh, sub-pixel upsampling by
    pixel_shuffle, a bicubic skip connection."""

    def __init__(self, scale=2):
        super().__init__()
        self.scale = scale
        self.body = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.Tanh(),
                                  nn.Conv2d(16, 3 * scale * scale, 3, padding=1))

    def forward(self, x):
        skip = F.interpolate(x, scale_factor=self.scale, mode="bicubic", align_corners=False)
        return F.pixel_shuffle(self.body(x), self.scale) + skip


class DropoutMLP(nn.Module):
    """Dropout in training (ATen's kernel, the same random stream as
    eager's when the seed is), a padded-token loss with ignore_index."""

    def __init__(self, d=32, classes=9):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(64, classes))

    def forward(self, x, target):
        logits = self.net(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=-100)
        return loss, logits


def cases(device, dtype):
    def rand(*shape, grad=True):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    def ids(*shape, high=100):
        return torch.randint(1, high, shape, device=device)

    mask = torch.ones(2, 32, device=device, dtype=torch.long)
    mask[1, 20:] = 0
    padding = torch.zeros(2, 12, device=device, dtype=torch.bool)
    padding[0, 9:] = True

    def padded_target():
        target = torch.randint(0, 9, (4, 6), device=device)
        target[1, 3:] = -100
        return target

    return {
        "bert": (BertLayer, lambda: (ids(2, 32), mask)),
        "torch_transformer": (TorchTransformer, lambda: (rand(2, 12, 64), padding)),
        "vit": (ViT, lambda: (rand(2, 3, 32, 32),)),
        "mobile_block": (MobileBlock, lambda: (rand(2, 3, 32, 32),)),
        "unet": (UNet, lambda: (rand(2, 3, 16, 16),)),
        "t5_attention": (T5Attention, lambda: (rand(2, 24, 64),)),
        "moe": (MoE, lambda: (rand(2, 8, 32),)),
        "conv1d": (Conv1dNet, lambda: (rand(2, 1, 400),)),
        "recurrent": (RecurrentTagger, lambda: (ids(2, 10, high=50),)),
        "convnext": (ConvNeXtBlock, lambda: (rand(2, 3, 32, 32),)),
        "dlrm": (DLRM, lambda: (rand(4, 8), ids(3, 10, high=40),
                                torch.tensor([0, 2, 5, 9], device=device))),
        "clip_loss": (CLIPLoss, lambda: (rand(6, 24), rand(6, 24))),
        "diffusion_block": (DiffusionBlock, lambda: (rand(2, 3, 16, 16),
                                                     torch.tensor([3, 700], device=device))),
        "super_resolution": (SuperResolution, lambda: (rand(2, 3, 12, 12),)),
        "dropout_mlp": (DropoutMLP, lambda: (rand(4, 6, 32), padded_target())),
    }


def outputs(out):
    return [t for t in (out if isinstance(out, tuple) else (out,))]


def step(fn, args, training):
    """fn's outputs, and in training the gradients of its floating-point
    inputs and parameters (None where one got none)."""
    args = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in args)
    params = list(fn.parameters())
    for p in params:
        p.grad = None
    if not training:
        with torch.no_grad():
            return outputs(fn(*args)), []
    out = outputs(fn(*args))
    sum(o.float().sum() for o in out).backward()
    return out, [t.grad for t in args if t.requires_grad] + [p.grad for p in params]


def close(a, b, tol, ref=None):
    """a (kiln's) matches b (eager's); or, with a float32 reference `ref`
    of a 16-bit run, a's error is at most twice b's, plus the tolerance:
    16-bit training (batch norm's statistics, long sums) moves both far
    from each other and from float32, and kiln must only not be worse."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape:
        return False
    scale = max(1.0, b.float().abs().max().item()) if b.numel() else 1.0
    if torch.allclose(a.float(), b.float(), atol=tol * scale, rtol=tol):
        return True
    if ref is None:
        return False
    ref = ref.float()
    return ((a.float() - ref).abs().max().item()
            <= 2 * (b.float() - ref).abs().max().item() + tol * scale)


def reference(model, state, inputs, training):
    """The float32 run of a 16-bit case: its model and inputs in float32."""
    model.load_state_dict(state)
    model = model.float()
    inputs = tuple(t.detach().float().requires_grad_(t.requires_grad) if t.is_floating_point()
                   else t for t in inputs)
    return step(model, inputs, training)


def check(server, device, dtype, name, training):
    """One case: (passed, what differed or failed)."""
    factory, make = cases(device, dtype)[name]
    tol = TOL[dtype]
    torch._dynamo.reset()
    torch.manual_seed(1)
    model = factory().to(device, dtype).train(training)
    inputs = make()
    if not training:
        inputs = tuple(t.detach() for t in inputs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    backend = kiln.backend(server, on_unavailable="raise", tiered=False)
    try:
        torch.manual_seed(2)  # dropout draws the same masks in both
        got, got_grads = step(torch.compile(model, backend=backend), inputs, training)
        got_state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state)  # eager starts where kiln did
        torch.manual_seed(2)
        want, want_grads = step(model, inputs, training)
    except Exception as e:  # a refusal names the node and the op
        return False, f"ERROR {type(e).__name__}: {str(e)[:600]}"
    want_state = {k: v.clone() for k, v in model.state_dict().items()}
    ref, ref_grads, ref_state = [None] * len(want), [None] * len(want_grads), {}
    if dtype != torch.float32:
        ref, ref_grads = reference(model, state, inputs, training)
        ref_state = model.state_dict()
    mismatched = [f"output {i}" for i, (a, b, r) in enumerate(zip(got, want, ref))
                  if not close(a, b, tol, r)]
    mismatched += [f"gradient {i}" for i, (a, b, r)
                   in enumerate(zip(got_grads, want_grads, ref_grads))
                   if not close(a, b, tol, r)]
    mismatched += [f"state {k}" for k in state
                   if state[k].is_floating_point()
                   and not close(got_state[k], want_state[k], tol, ref_state.get(k))]
    ok = not mismatched and len(got) == len(want) and backend.stats["eager"] == 0
    return ok, (f"{backend.stats} {mismatched[:6]} "
                f"{[why[:160] for _, why in backend.unsupported]}")


def add_selection(parser):
    """The --dtypes and --models arguments of the zoo's scripts."""
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--models", default="", help="comma-separated; default: all")


def selected(args, device):
    """(dtype, model name) of each case `args` (add_selection's) selects."""
    for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
        for name in cases(device, dtype):
            if not args.models or name in args.models.split(","):
                yield dtype, name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    add_selection(parser)
    args = parser.parse_args()
    failed = 0
    for dtype, name in selected(args, args.device):
        for training in (False, True):
            ok, detail = check(os.environ["KILN_SERVER"], args.device, dtype, name, training)
            failed += not ok
            print(f"{name} {'training' if training else 'inference'} {dtype}: "
                  f"{'OK' if ok else 'FAILED'} {detail}", flush=True)
    print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
