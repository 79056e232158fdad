"""Floats computed from symbolic sizes where ATen takes only a number
(kiln/symfloats.py): through torch.compile(dynamic=True) with the kiln
backend, against eager, one graph for every size. A real kilnd ($KILND)
on loopback, compiling for the CPU."""

import os
import sys
import unittest

import torch
import torch.nn.functional as F

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_server import KILND, SharedKilnd, close  # noqa: E402


@unittest.skipUnless(KILND, "KILND is not set")
class SymbolicFloatTest(SharedKilnd, unittest.TestCase):
    def test_floats_of_sizes_where_aten_takes_a_number(self):
        # Where the op's float argument is a Scalar (pow's exponent, clamp's
        # bounds, leaky_relu's slope, full's value, a comparison, softplus's
        # beta, masked_fill's value): rewritten into ops on the tensor.
        def f(x):
            n = x.shape[0]
            y = (x.abs() + 0.1).pow(1.0 / n) + x.clamp(min=-1.0 / n, max=n * 0.1)
            y = y + F.leaky_relu(x, 1.0 / n) + F.softplus(x, beta=n / 4.0)
            y = y + torch.full_like(x, n / 3.0) * torch.where(x > n / 20.0, x, -x)
            return y + x.masked_fill(x > 1, n / 2.0)

        torch._dynamo.reset()
        be = kiln.backend(self.server.address)
        compiled = torch.compile(f, backend=be, dynamic=True)
        for rows in (6, 9):
            x = torch.randn(rows, 8, requires_grad=True)
            ref = x.detach().clone().requires_grad_()
            out, want = compiled(x), f(ref)
            close(self, out, want, f"{rows} rows")
            out.square().sum().backward()
            want.square().sum().backward()
            close(self, x.grad, ref.grad, f"{rows} rows: the gradient")
        self.assertEqual((be.stats["compiles"], be.stats["eager"]), (1, 0),
                         (be.stats, be.unsupported))

    def test_ties_integers_and_nan(self):
        # clamp's gradient is whole where x equals the bound, and NaN stays
        # NaN; an integer tensor compares with the float as with the number
        # (in float32, not float64).
        def f(x):
            n = x.shape[0]
            steps = torch.arange(n, device=x.device)
            return x.clamp(min=1.0 / n, max=n / 2.0) * (steps > n / 3.0).unsqueeze(1) \
                + (steps * 2).clamp(max=n / 2.5).unsqueeze(1)

        torch._dynamo.reset()
        be = kiln.backend(self.server.address)
        compiled = torch.compile(f, backend=be, dynamic=True)
        for rows in (6, 9):
            x = torch.randn(rows, 4)
            x[rows - 1, 0] = 1.0 / rows  # a tie with the lower bound
            x[rows - 2, 1] = float("nan")
            x.requires_grad_()
            ref = x.detach().clone().requires_grad_()
            out, want = compiled(x), f(ref)
            self.assertEqual(out.dtype, want.dtype)
            self.assertTrue(torch.equal(out.isnan(), want.isnan()), f"{rows} rows: NaN")
            finite = ~want.isnan()
            close(self, out[finite], want[finite], f"{rows} rows")
            out[finite].sum().backward()
            want[finite].sum().backward()
            close(self, x.grad, ref.grad, f"{rows} rows: the gradient")
        self.assertEqual((be.stats["compiles"], be.stats["eager"]), (1, 0),
                         (be.stats, be.unsupported))


if __name__ == "__main__":
    unittest.main()
