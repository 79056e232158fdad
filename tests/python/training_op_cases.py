"""Training cases of single ops and op families that run through ATen or
that the lowering decomposes (the special functions, scatter,
masked_scatter), for the test classes that train the captured graphs
(test_training.TrainingTest through aot_eager, test_kiln_backend's
KilnBackendTest through the kiln backend), which supply
check_training(name, fn, examples)."""

import torch
import torch.nn as nn


class OpTrainingCases:
    """The cases; the test class that mixes them in supplies check_training."""

    def test_special_functions_that_run_through_aten(self):
        # The gamma family (each the next one's derivative), erfc and its
        # scaled form, the normal quantile and i0, as log-likelihoods use
        # them (a Beta, Poisson or von Mises density).
        def special(x, y):
            a = torch.nn.functional.softplus(x) + 0.5
            p = torch.sigmoid(y) * 0.9 + 0.05
            return (torch.lgamma(a) + torch.digamma(a) * 0.5 + torch.polygamma(1, a)
                    + torch.special.gammaln(a + y.abs()) + torch.erfc(x)
                    + torch.special.erfcx(x.abs()) + torch.special.ndtri(p)
                    + torch.i0(y) + torch.special.log_ndtr(x))

        self.check_training("special", special, (torch.randn(4, 6), torch.randn(4, 6)))

    def test_image_features_scattered_into_text_embeddings(self):
        # As multimodal models merge an image encoder's features into the
        # token embeddings: masked_scatter where the image tokens are, with
        # gradients to both (the mask broadcast over the embedding dim).
        self.check_training("masked_scatter", _ImageTokens(), (torch.randn(6, 4),))

    def test_scatter_of_a_tensor_and_of_a_value(self):
        # One write per place (a permutation of the rows); src of index's
        # sizes, as eager's backward needs.
        rows = torch.tensor([[2, 0, 1, 3], [0, 3, 2, 1], [3, 1, 0, 2]]).T

        def scattered(x, src):
            placed = x.scatter(0, rows, src * 2)
            return placed.scatter(1, torch.tensor([[2], [0], [1], [2]]), 0.5) * x

        self.check_training("scatter", scattered, (torch.randn(4, 3), torch.randn(4, 3)))


class _ImageTokens(nn.Module):
    """Token embeddings with an image's features projected into the
    positions of its tokens (9), as multimodal models merge them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.project = nn.Linear(4, 6)
        self.register_buffer("tokens", torch.tensor([[1, 9, 9, 2, 3], [9, 4, 9, 9, 5]]))

    def forward(self, features):
        image = (self.tokens == 9).unsqueeze(-1)
        return torch.tanh(self.embed(self.tokens).masked_scatter(image, self.project(features)))
