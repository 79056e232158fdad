"""Gathers in kiln's kernels, through torch.compile on the CPU and a real
kilnd ($KILND) on loopback: embeddings, torch.gather, index_select,
advanced indexing and bicubic upsampling (whose decomposition indexes),
inference and training, against eager; the gathers run inside generated
kernels, not as ATen calls; and an index out of range is an error that
names it. KILN_TEST_DEVICE=cuda runs the same cases on a GPU (where an
index out of range stops the kernel, as torch's device-side assert does,
and is not tried)."""

import os
import sys
import unittest

import torch
import torch.nn.functional as F

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_server import KILND, SharedKilnd  # noqa: E402

DEVICE = os.environ.get("KILN_TEST_DEVICE", "cpu")
GATHERS = {"aten.embedding.default", "aten.index.Tensor", "aten.gather.default",
           "aten.index_select.default", "aten.arange.default", "aten.arange.start_step",
           "aten.full.default", "aten.scalar_tensor.default"}


SCATTERS = {"aten.index_put.default", "aten.index_add.default",
            "aten.embedding_dense_backward.default"}


def extern_targets(artifact_function):
    """The ATen ops the plans of a loaded artifact call (forward and
    backward, for training)."""
    art = artifact_function.artifact
    plans = [art.compiled_forward, art.compiled_backward] \
        if art.HasField("compiled_forward") else [art.compiled]
    return [s.extern_call.node.target for p in plans for s in p.plan.steps
            if s.WhichOneof("kind") == "extern_call"]


class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(100, 32)
        self.pos = torch.nn.Embedding(16, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.norm(self.tok(ids) + self.pos(positions))


class Bags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bags = torch.nn.EmbeddingBag(40, 8, mode="mean")
        self.register_buffer("offsets", torch.tensor([0, 3, 3, 7]))

    def forward(self, ids):
        return self.bags(ids, self.offsets) * 2


def picked_loss(logits, target):
    logp = logits.log_softmax(-1)
    return -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).mean()


def causal_softmax(x):
    # A mask from two aranges over the rows of a softmax: index values in
    # the softmax's kernel, each lane its own on a GPU.
    t = x.shape[-1]
    rows = torch.arange(t, device=x.device).unsqueeze(1)
    cols = torch.arange(t, device=x.device).unsqueeze(0)
    return torch.softmax(x.masked_fill(cols > rows, float("-inf")), -1) * 3


def contrastive_loss(a, b):
    # CLIP's loss: the labels are arange(n), the targets' log-probabilities
    # gathered from each row.
    logits = (a @ b.T) * 10.0
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def rows_and_columns(x, rows, cols, picked):
    # Advanced indexing counts negative indices from the end; index_select
    # takes none.
    return (x[rows][:, cols] * 2).relu() + x.index_select(0, picked).sum(-1, keepdim=True)


def upsample(x):
    return F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False) * 0.5


@unittest.skipUnless(KILND, "KILND is not set")
class GatherTest(SharedKilnd, unittest.TestCase):

    def run_both(self, fn, args, training):
        torch._dynamo.reset()
        backend = kiln.backend(self.server.address, on_unavailable="raise", tiered=False)
        compiled = torch.compile(fn, backend=backend)
        results = []
        for f in (compiled, fn):
            xs = [a.detach().clone().to(DEVICE).requires_grad_(
                training and a.is_floating_point()) for a in args]
            out = f(*xs)
            grads = []
            if training:
                out.float().square().sum().backward()
                grads = [x.grad for x in xs if x.is_floating_point()]
                params = fn.parameters() if isinstance(fn, torch.nn.Module) else []
                grads += [p.grad.clone() for p in params]
                if isinstance(fn, torch.nn.Module):
                    fn.zero_grad()
            results.append((out.detach(), grads))
        (got, got_grads), (want, want_grads) = results
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        return backend

    def check(self, name, fn, args):
        if isinstance(fn, torch.nn.Module):
            fn.to(DEVICE)
        for training in (False, True):
            with self.subTest(case=name, training=training):
                backend = self.run_both(fn, args, training)
                self.assertTrue(backend.loaded, name)
                for loaded in backend.loaded:
                    called = set(extern_targets(loaded)) & (GATHERS | SCATTERS)
                    self.assertFalse(called, f"{name}: gathers or scatters run through ATen")

    def test_embeddings_and_positions(self):
        torch.manual_seed(0)
        self.check("tokens", Tokens(), [torch.randint(0, 100, (3, 16))])

    def test_picked_log_probabilities(self):
        torch.manual_seed(0)
        self.check("picked_loss", picked_loss, [torch.randn(6, 10), torch.randint(0, 10, (6,))])

    def test_causal_mask_from_aranges(self):
        torch.manual_seed(0)
        self.check("causal_softmax", causal_softmax, [torch.randn(2, 4, 64, 64)])

    def test_contrastive_loss(self):
        torch.manual_seed(0)
        self.check("contrastive_loss", contrastive_loss, [torch.randn(6, 8), torch.randn(6, 8)])

    def test_advanced_indexing_and_index_select(self):
        torch.manual_seed(0)
        rows = torch.tensor([3, -1, 0, 5, 5])
        cols = torch.tensor([1, 7, -8])
        picked = torch.tensor([7, 0, 2, 2, 4])
        self.check("rows_and_columns", rows_and_columns, [torch.randn(8, 8), rows, cols, picked])

    def test_embedding_bags(self):
        # DLRM's sparse features: mean bags (one empty), decomposed into an
        # embedding and index_add into zeros (scatter-add kernels).
        torch.manual_seed(0)
        self.check("embedding_bag", Bags(), [torch.randint(0, 40, (10,))])

    def test_bicubic_upsampling(self):
        torch.manual_seed(0)
        self.check("upsample", upsample, [torch.randn(2, 3, 5, 7)])

    @unittest.skipIf(DEVICE != "cpu", "a trapped kernel ends the process's CUDA context")
    def test_an_index_out_of_range_names_it(self):
        torch._dynamo.reset()
        backend = kiln.backend(self.server.address, on_unavailable="raise", tiered=False)
        embed = torch.nn.Embedding(10, 4)
        compiled = torch.compile(lambda ids: embed(ids) * 2, backend=backend)
        with torch.no_grad():
            ok = torch.tensor([1, 9])
            torch.testing.assert_close(compiled(ok), embed(ok) * 2)
            with self.assertRaisesRegex(Exception,
                                        "index 10 is out of bounds for a dimension with size 10"):
                compiled(torch.tensor([1, 10]))
            # The same compiled function serves the next call.
            torch.testing.assert_close(compiled(torch.tensor([0, 3])),
                                       embed(torch.tensor([0, 3])) * 2)


if __name__ == "__main__":
    unittest.main()
