"""The model zoo of tests/gpu/model_zoo.py (BERT, nn.TransformerEncoderLayer
and nn.MultiheadAttention, ViT, a MobileNet block, a U-Net, T5's attention,
a mixture of experts, a 1-d conv net, GRU and LSTM cells) on the CPU:
torch.compile with the kiln backend against eager, inference and training,
float32 and bfloat16, through a real kilnd ($KILND) on loopback. And the
parts of the lowering that only CUDA graphs reach, checked here directly:
the fused RNN cells' decompositions, and the masked attention that takes
SDPA's math form."""

import os
import sys
import unittest

import torch
import torch.nn.functional as F

from kiln import decompositions, lower

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, os.pardir, "gpu"))
import model_zoo  # noqa: E402
from test_server import KILND, SharedKilnd  # noqa: E402


@unittest.skipUnless(KILND, "KILND is not set")
class ModelZooTest(SharedKilnd, unittest.TestCase):

    def test_every_model_matches_eager(self):
        for dtype in (torch.float32, torch.bfloat16):
            for name in model_zoo.cases("cpu", dtype):
                for training in (False, True):
                    with self.subTest(model=name, dtype=dtype, training=training):
                        ok, detail = model_zoo.check(self.server.address, "cpu", dtype, name,
                                                     training)
                        self.assertTrue(ok, detail)


class RecurrentCellsTest(unittest.TestCase):
    """What nn.LSTMCell and nn.GRUCell run on CUDA after their matmuls,
    decomposed, against ATen's cells on the CPU (which compute the same
    math without the fused op)."""

    def setUp(self):
        torch.manual_seed(0)
        self.x = torch.randn(3, 5, dtype=torch.float64)
        self.h = torch.randn(3, 4, dtype=torch.float64)
        self.c = torch.randn(3, 4, dtype=torch.float64)

    def weights(self, gates):
        return [torch.randn(gates * 4, n, dtype=torch.float64) for n in (5, 4)] + \
            [torch.randn(gates * 4, dtype=torch.float64) for _ in range(2)]

    def test_lstm_cell(self):
        table = decompositions.table()
        fused = table[torch.ops.aten._thnn_fused_lstm_cell.default]
        w_ih, w_hh, b_ih, b_hh = self.weights(4)
        for biases in ((b_ih, b_hh), (None, None)):
            want_h, want_c = torch.lstm_cell(self.x, (self.h, self.c), w_ih, w_hh, *biases)
            got_h, got_c, saved = fused(self.x @ w_ih.T, self.h @ w_hh.T, self.c, *biases)
            torch.testing.assert_close(got_h, want_h)
            torch.testing.assert_close(got_c, want_c)
            self.assertEqual(saved.shape, (3, 16))

    def test_gru_cell(self):
        table = decompositions.table()
        fused = table[torch.ops.aten._thnn_fused_gru_cell.default]
        w_ih, w_hh, b_ih, b_hh = self.weights(3)
        for biases in ((b_ih, b_hh), (None, None)):
            want = torch.gru_cell(self.x, self.h, w_ih, w_hh, *biases)
            got, saved = fused(self.x @ w_ih.T, self.h @ w_hh.T, self.h, *biases)
            torch.testing.assert_close(got, want)
            self.assertEqual(saved.shape, (3, 20))


class MaskedAttentionTest(unittest.TestCase):
    """Which of Dynamo's graphs have attention with a mask (on CUDA they
    are traced with SDPA's math form alone)."""

    def graph(self, fn, *args):
        captured = []

        def backend(gm, example_inputs):
            captured.append(gm)
            return gm.forward

        torch._dynamo.reset()
        torch.compile(fn, backend=backend)(*args)
        self.assertEqual(len(captured), 1)
        return captured[0]

    def test_sdpa_with_and_without_a_mask(self):
        q = torch.randn(2, 4, 8, 16)
        mask = torch.rand(2, 1, 8, 8) > 0.2
        self.assertFalse(lower._masked_attention(self.graph(
            lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), q)))
        self.assertTrue(lower._masked_attention(self.graph(
            lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m), q, mask)))
        self.assertTrue(lower._masked_attention(self.graph(
            lambda q, m: F.scaled_dot_product_attention(q, q, q, m), q, mask)))

    def test_multihead_attention_with_a_key_padding_mask(self):
        mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        x = torch.randn(2, 6, 16)
        padding = torch.zeros(2, 6, dtype=torch.bool)
        padding[0, 4:] = True
        self.assertFalse(lower._masked_attention(self.graph(lambda x: mha(x, x, x)[0], x)))
        self.assertTrue(lower._masked_attention(self.graph(
            lambda x, p: mha(x, x, x, key_padding_mask=p)[0], x, padding)))


if __name__ == "__main__":
    unittest.main()
