"""kiln.runtime.SymExpr, the package's symbolic sizes, against the cases that
the C++ tests also run (tests/data/sym_expr_cases.txt): one implementation
(compiler/ir/sym_expr.h, through kiln's runtime library) on both sides. Each
case's Python printing is also evaluated by Python itself, so Python's own
arithmetic checks the C++ semantics where they should agree."""

import os
import unittest

from kiln.runtime import SymExpr

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                     "sym_expr_cases.txt")
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def read_cases():
    cases = []
    with open(CASES) as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            text, bindings, want = line.rstrip("\n").split("|")
            values = {}
            for b in bindings.split():
                name, value = b.split("=")
                values[name] = int(value)
            want = want.strip()
            if want.startswith("error: "):
                cases.append((n, text, values, None, want[len("error: "):]))
            else:
                cases.append((n, text, values, int(want), None))
    return cases


class SymExprTest(unittest.TestCase):

    def test_shared_cases(self):
        cases = read_cases()
        self.assertGreater(len(cases), 50)
        for n, text, values, want, error in cases:
            with self.subTest(line=n, text=text):
                e = SymExpr(text)
                if error is None:
                    self.assertEqual(e.evaluate(values), want)
                    # Python's arithmetic on the Python printing agrees.
                    self.assertEqual(eval(e.to_python(), {"__builtins__": {}},  # noqa: S307
                                          {"min": min, "max": max, "abs": abs, "int": int,
                                           **values}), want, e.to_python())
                    # The canonical text means the same.
                    self.assertEqual(SymExpr(e.to_text()).evaluate(values), want, e.to_text())
                else:
                    with self.assertRaises(ValueError) as caught:
                        e.evaluate(values)
                    self.assertIn(error, str(caught.exception))

    def test_values_outside_int64_are_refused(self):
        with self.assertRaisesRegex(ValueError, "outside int64"):
            SymExpr("s0 + 1").evaluate({"s0": 2 ** 63})

    def test_symbols_in_order_of_first_appearance(self):
        self.assertEqual(SymExpr("Max(s1, s0) + s1").symbols, ("s1", "s0"))
        self.assertEqual(SymExpr("42").symbols, ())

    def test_malformed_text_is_refused_at_parse(self):
        for text in ["__import__('os')", "s0.real", "abs(s0)", "s0 if s1 else 2", "[s0]", "1.5",
                     "Min", "Max()", "Min(s0, key=s1)", "'s0'", "lambda: 0", "s0 +", "é",
                     "Mod(s0)", "1 < s0 < 4", "(" * 300 + "1" + ")" * 300,
                     "99999999999999999999"]:
            with self.assertRaises(ValueError, msg=text):
                SymExpr(text)

    def test_python_printing_is_python(self):
        e = SymExpr("CeilDiv(s0, 4) * -s1 + Max(s0, 2) % 3")
        self.assertEqual(e.to_python(), "(((-((-s0) // 4)) * (-s1)) + (max(s0, 2) % 3))")


if __name__ == "__main__":
    unittest.main()
