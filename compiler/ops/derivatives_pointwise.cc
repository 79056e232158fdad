// Derivative rules of the elementwise ops: unary functions and activations,
// pow, arithmetic (with summing back over broadcast dimensions), maximum and
// minimum, where and masked_fill.
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/derivatives_internal.h"
#include "compiler/ops/registry.h"

namespace kiln::ops::derivatives_internal {
namespace {

constexpr double kPi = 3.14159265358979323846;  // M_PI

}  // namespace

void RegisterPointwise(Registry* r) {
  // abs: grad * sgn(self); sgn is sign for real dtypes.
  Def(r, "aten.abs.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId s, c.Op("aten.sign.default", {Ref(self)}));
        return Mul(c, g, s);
      }));
  Def(r, "aten.neg.default", SelfRule([](Ctx& c, ValueId g) { return Neg(c, g); }));
  Def(r, "aten.exp.default", SelfRule([](Ctx& c, ValueId g) { return Mul(c, g, c.output(0)); }));
  Def(r, "aten.log.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        return Div(c, g, self);
      }));
  Def(r, "aten.log1p.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId p, AddScalar(c, self, ir::Int(1)));
        return Div(c, g, p);
      }));
  Def(r, "aten.expm1.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId p, AddScalar(c, c.output(0), ir::Int(1)));
        return Mul(c, g, p);
      }));
  Def(r, "aten.sqrt.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId twice, MulScalar(c, c.output(0), ir::Int(2)));
        return Div(c, g, twice);
      }));
  // rsqrt: -0.5 * grad * result^3.
  Def(r, "aten.rsqrt.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId cube,
                         c.Op("aten.pow.Tensor_Scalar", {Ref(c.output(0)), ir::Int(3)}));
        ASSIGN_OR_RETURN(ValueId h, MulScalar(c, g, ir::Float(-0.5)));
        return Mul(c, h, cube);
      }));
  // reciprocal: -grad * result^2.
  Def(r, "aten.reciprocal.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId sq, Mul(c, c.output(0), c.output(0)));
        ASSIGN_OR_RETURN(ValueId n, Neg(c, g));
        return Mul(c, n, sq);
      }));
  Def(r, "aten.sin.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId cos, c.Op("aten.cos.default", {Ref(self)}));
        return Mul(c, g, cos);
      }));
  Def(r, "aten.cos.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId sin, c.Op("aten.sin.default", {Ref(self)}));
        ASSIGN_OR_RETURN(ValueId n, Neg(c, sin));
        return Mul(c, g, n);
      }));
  // The math ATen runs for kiln (shape_rules_extern.cc), libtorch's
  // formulas: each a function of self (or of the result) times the grad.
  auto of_self = [](std::function<Val(Ctx&, ValueId)> f) {
    return SelfRule([f](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
      ASSIGN_OR_RETURN(ValueId d, f(c, self));
      return Mul(c, g, d);
    });
  };
  auto unary = [](Ctx& c, const char* op, ValueId x) { return c.Op(op, {Ref(x)}); };
  // 1 - x^2 (or x^2 + s): the argument of asin's, acos's, asinh's and
  // atanh's derivatives.
  auto square_plus = [](Ctx& c, ValueId x, double s, bool negate) -> Val {
    ASSIGN_OR_RETURN(ValueId sq, Mul(c, x, x));
    if (negate) return c.Op("aten.rsub.Scalar", {Ref(sq), ir::Float(s)});
    return AddScalar(c, sq, ir::Float(s));
  };
  Def(r, "aten.sinh.default",
      of_self([unary](Ctx& c, ValueId x) { return unary(c, "aten.cosh.default", x); }));
  Def(r, "aten.cosh.default",
      of_self([unary](Ctx& c, ValueId x) { return unary(c, "aten.sinh.default", x); }));
  // tan: 1 + tan(x)^2, from the result.
  Def(r, "aten.tan.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId sq, Mul(c, c.output(0), c.output(0)));
        ASSIGN_OR_RETURN(sq, AddScalar(c, sq, ir::Int(1)));
        return Mul(c, g, sq);
      }));
  Def(r, "aten.atan.default", of_self([square_plus](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId d, square_plus(c, x, 1.0, false));
        return c.Op("aten.reciprocal.default", {Ref(d)});
      }));
  Def(r, "aten.asin.default", of_self([square_plus](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId d, square_plus(c, x, 1.0, true));
        return c.Op("aten.rsqrt.default", {Ref(d)});
      }));
  Def(r, "aten.acos.default", of_self([square_plus](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId d, square_plus(c, x, 1.0, true));
        ASSIGN_OR_RETURN(d, c.Op("aten.rsqrt.default", {Ref(d)}));
        return Neg(c, d);
      }));
  Def(r, "aten.asinh.default", of_self([square_plus](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId d, square_plus(c, x, 1.0, false));
        return c.Op("aten.rsqrt.default", {Ref(d)});
      }));
  // acosh: 1 / (sqrt(x - 1) sqrt(x + 1)).
  Def(r, "aten.acosh.default", of_self([](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId lo, AddScalar(c, x, ir::Int(-1)));
        ASSIGN_OR_RETURN(ValueId hi, AddScalar(c, x, ir::Int(1)));
        ASSIGN_OR_RETURN(lo, c.Op("aten.rsqrt.default", {Ref(lo)}));
        ASSIGN_OR_RETURN(hi, c.Op("aten.rsqrt.default", {Ref(hi)}));
        return Mul(c, lo, hi);
      }));
  Def(r, "aten.atanh.default", of_self([square_plus](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId d, square_plus(c, x, 1.0, true));
        return c.Op("aten.reciprocal.default", {Ref(d)});
      }));
  for (auto [op, ln] : {std::pair{"aten.log2.default", M_LN2}, {"aten.log10.default", M_LN10}}) {
    const double scale = ln;
    Def(r, op, of_self([scale](Ctx& c, ValueId x) -> Val {
          ASSIGN_OR_RETURN(ValueId d, MulScalar(c, x, ir::Float(scale)));
          return c.Op("aten.reciprocal.default", {Ref(d)});
        }));
  }
  Def(r, "aten.exp2.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId d, MulScalar(c, c.output(0), ir::Float(M_LN2)));
        return Mul(c, g, d);
      }));
  // erfinv: sqrt(pi) / 2 * exp(erfinv(x)^2), from the result.
  Def(r, "aten.erfinv.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId sq, Mul(c, c.output(0), c.output(0)));
        ASSIGN_OR_RETURN(sq, c.Op("aten.exp.default", {Ref(sq)}));
        ASSIGN_OR_RETURN(sq, MulScalar(c, sq, ir::Float(0.5 * std::sqrt(M_PI))));
        return Mul(c, g, sq);
      }));
  // erfc: -2 / sqrt(pi) * exp(-x^2).
  Def(r, "aten.erfc.default", of_self([](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId sq, Mul(c, x, x));
        ASSIGN_OR_RETURN(sq, MulScalar(c, sq, ir::Int(-1)));
        ASSIGN_OR_RETURN(sq, c.Op("aten.exp.default", {Ref(sq)}));
        return MulScalar(c, sq, ir::Float(-2.0 / std::sqrt(M_PI)));
      }));
  // erfcx(x) = exp(x^2) erfc(x): 2 x erfcx(x) - 2 / sqrt(pi), from the result.
  Def(r, "aten.special_erfcx.default", of_self([](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(ValueId d, Mul(c, x, c.output(0)));
        ASSIGN_OR_RETURN(d, MulScalar(c, d, ir::Int(2)));
        return AddScalar(c, d, ir::Float(-2.0 / std::sqrt(M_PI)));
      }));
  // ndtri, the normal quantile: sqrt(2 pi) exp(ndtri(x)^2 / 2), from the result.
  Def(r, "aten.special_ndtri.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId sq, Mul(c, c.output(0), c.output(0)));
        ASSIGN_OR_RETURN(sq, MulScalar(c, sq, ir::Float(0.5)));
        ASSIGN_OR_RETURN(sq, c.Op("aten.exp.default", {Ref(sq)}));
        ASSIGN_OR_RETURN(sq, MulScalar(c, sq, ir::Float(std::sqrt(2.0 * M_PI))));
        return Mul(c, g, sq);
      }));
  // i0' = i1 (the modified Bessel functions of the first kind; i1 itself
  // runs through ATen without a rule).
  Def(r, "aten.i0.default",
      of_self([unary](Ctx& c, ValueId x) { return unary(c, "aten.special_i1.default", x); }));
  // The gamma family, each the next one's derivative: lgamma' = digamma,
  // digamma' = polygamma(1, .), polygamma(n, .)' = polygamma(n + 1, .).
  Def(r, "aten.lgamma.default",
      of_self([unary](Ctx& c, ValueId x) { return unary(c, "aten.digamma.default", x); }));
  Def(r, "aten.digamma.default", of_self([](Ctx& c, ValueId x) {
        return c.Op("aten.polygamma.default", {ir::Int(1), Ref(x)});
      }));
  Def(r, "aten.polygamma.default", of_self([](Ctx& c, ValueId x) -> Val {
        ASSIGN_OR_RETURN(int64_t n, c.call().Int("n"));
        return c.Op("aten.polygamma.default", {ir::Int(n + 1), Ref(x)});
      }));
  // atan2(self, other): other / (self^2 + other^2) and -self / (...).
  auto atan2_part = [](bool self_part) {
    return [self_part](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId y, Tensor(c, "self"));
      ASSIGN_OR_RETURN(ValueId x, Tensor(c, "other"));
      ASSIGN_OR_RETURN(ValueId yy, Mul(c, y, y));
      ASSIGN_OR_RETURN(ValueId xx, Mul(c, x, x));
      ASSIGN_OR_RETURN(ValueId den, Add(c, yy, xx));
      ASSIGN_OR_RETURN(ValueId num, self_part ? Mul(c, g, x) : Mul(c, g, y));
      ASSIGN_OR_RETURN(ValueId q, Div(c, num, den));
      return self_part ? Val(q) : Neg(c, q);
    };
  };
  Def(r, "aten.atan2.default",
      ParamRule({{"self", atan2_part(true)}, {"other", atan2_part(false)}}));
  // hypot: self / result and other / result.
  auto hypot_part = [](const char* param) {
    return [param](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId v, Tensor(c, param));
      ASSIGN_OR_RETURN(ValueId q, Div(c, v, c.output(0)));
      return Mul(c, g, q);
    };
  };
  Def(r, "aten.hypot.default",
      ParamRule({{"self", hypot_part("self")}, {"other", hypot_part("other")}}));
  // fmod and remainder: self passes the gradient on; other takes minus it
  // times self / other rounded toward zero (fmod) or down (remainder).
  for (auto [base, mode] : {std::pair{"fmod", "trunc"}, {"remainder", "floor"}}) {
    const std::string rounding = mode;
    Def(r, absl::StrCat("aten.", base, ".Tensor"),
        ParamRule({{"self", Identity()},
                   {"other", [rounding](Ctx& c, ValueId g) -> Val {
                      ASSIGN_OR_RETURN(
                          ValueId q, c.Op("aten.div.Tensor_mode", {Arg(c, "self"), Arg(c, "other")},
                                          {ir::Kwarg("rounding_mode", Argument{"", rounding})}));
                      ASSIGN_OR_RETURN(q, Mul(c, g, q));
                      return Neg(c, q);
                    }}}));
    Def(r, absl::StrCat("aten.", base, ".Scalar"), SelfRule(Identity()));
  }
  Def(r, "aten.tanh.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.tanh_backward.default", {Ref(g), Ref(c.output(0))});
      }));
  Def(r, "aten.sigmoid.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.sigmoid_backward.default", {Ref(g), Ref(c.output(0))});
      }));
  // relu: grad is 0 where the result is <= 0. The mask is its own value,
  // computed from the result alone, so that the partition may save it (a
  // byte an element) rather than the result or what the result is
  // recomputed from (compiler/autograd/partition.h).
  Def(r, "aten.relu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId off, c.Op("aten.le.Scalar", {Ref(c.output(0)), ir::Int(0)}));
        return ZeroWhere(c, g, off);
      }));
  Def(r, "aten.gelu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        return c.Op("aten.gelu_backward.default", {Ref(g), Ref(self)},
                    {ir::Kwarg("approximate", Arg(c, "approximate"))});
      }));
  // silu_backward: grad * s * (1 + self * (1 - s)), s = sigmoid(self).
  Def(r, "aten.silu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId s, c.Op("aten.sigmoid.default", {Ref(self)}));
        ASSIGN_OR_RETURN(ValueId one_minus, c.Op("aten.rsub.Scalar", {Ref(s), ir::Int(1)}));
        ASSIGN_OR_RETURN(ValueId t, Mul(c, self, one_minus));
        ASSIGN_OR_RETURN(t, AddScalar(c, t, ir::Int(1)));
        ASSIGN_OR_RETURN(ValueId gs, Mul(c, g, s));
        return Mul(c, gs, t);
      }));
  // erf: 2 / sqrt(pi) * exp(-self^2) * grad.
  Def(r, "aten.erf.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId sq, c.Op("aten.pow.Tensor_Scalar", {Ref(self), ir::Int(2)}));
        ASSIGN_OR_RETURN(ValueId n, Neg(c, sq));
        ASSIGN_OR_RETURN(ValueId e, c.Op("aten.exp.default", {Ref(n)}));
        ASSIGN_OR_RETURN(ValueId k, MulScalar(c, e, ir::Float(2.0 / std::sqrt(kPi))));
        return Mul(c, k, g);
      }));
  // Piecewise constant: a defined zero gradient, as libtorch gives.
  for (const char* t :
       {"aten.sign.default", "aten.floor.default", "aten.ceil.default", "aten.fill.Scalar"}) {
    Def(r, t, SelfRule(ZerosLikeGrad()));
  }
  // leaky_relu_backward: grad where self > 0, grad * negative_slope elsewhere.
  Def(r, "aten.leaky_relu.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId pos, c.Op("aten.gt.Scalar", {Ref(self), ir::Int(0)}));
        ASSIGN_OR_RETURN(ValueId scaled, MulScalar(c, g, Arg(c, "negative_slope")));
        return c.Op("aten.where.self", {Ref(pos), Ref(g), Ref(scaled)});
      }));
  // hardtanh_backward: zero where self <= min_val or self >= max_val.
  Def(r, "aten.hardtanh.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(ValueId lo, c.Op("aten.le.Scalar", {Ref(self), Arg(c, "min_val")}));
        ASSIGN_OR_RETURN(ValueId hi, c.Op("aten.ge.Scalar", {Ref(self), Arg(c, "max_val")}));
        ASSIGN_OR_RETURN(ValueId out, c.Op("aten.logical_or.default", {Ref(lo), Ref(hi)}));
        return ZeroWhere(c, g, out);
      }));
  // clamp_backward: grad where min <= self <= max (NaN self gets 0), else 0.
  Def(r, "aten.clamp.default", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        std::optional<ValueId> in;
        if (!c.call().IsNone("min")) {
          ASSIGN_OR_RETURN(ValueId ge, c.Op("aten.ge.Scalar", {Ref(self), Arg(c, "min")}));
          in = ge;
        }
        if (!c.call().IsNone("max")) {
          ASSIGN_OR_RETURN(ValueId le, c.Op("aten.le.Scalar", {Ref(self), Arg(c, "max")}));
          if (in.has_value()) {
            ASSIGN_OR_RETURN(le, c.Op("aten.logical_and.default", {Ref(*in), Ref(le)}));
          }
          in = le;
        }
        if (!in.has_value()) return g;
        ASSIGN_OR_RETURN(ValueId out, Not(c, *in));
        return ZeroWhere(c, g, out);
      }));

  // pow(self, exponent): 0 for exponent 0, else grad * exponent * self^(exponent - 1).
  Def(r, "aten.pow.Tensor_Scalar", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
        ASSIGN_OR_RETURN(double e, c.call().Double("exponent"));
        if (e == 0.0) return ZerosLike(c, self);
        ASSIGN_OR_RETURN(ValueId p, c.Op("aten.pow.Tensor_Scalar", {Ref(self), ir::Float(e - 1)}));
        ASSIGN_OR_RETURN(p, MulScalar(c, p, ir::Float(e)));
        return Mul(c, g, p);
      }));
  Def(r, "aten.pow.Tensor_Tensor",
      ParamRule(
          {{"self",
            // pow_backward_self: where(exponent == 0, 0, grad * exponent * self^(exponent - 1)).
            [](Ctx& c, ValueId g) -> Val {
              ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
              ASSIGN_OR_RETURN(ValueId e, Tensor(c, "exponent"));
              ASSIGN_OR_RETURN(ValueId e1, c.Op("aten.sub.Scalar", {Ref(e), ir::Int(1)}));
              ASSIGN_OR_RETURN(ValueId p, c.Op("aten.pow.Tensor_Tensor", {Ref(self), Ref(e1)}));
              ASSIGN_OR_RETURN(p, Mul(c, e, p));
              ASSIGN_OR_RETURN(p, Mul(c, g, p));
              ASSIGN_OR_RETURN(ValueId zero, c.Op("aten.eq.Scalar", {Ref(e), ir::Float(0.0)}));
              return ZeroWhere(c, p, zero);
            }},
           {"exponent",
            // pow_backward_exponent: grad * where(self == 0 & exponent >= 0, 0, result *
            // log(self)).
            [](Ctx& c, ValueId g) -> Val {
              ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
              ASSIGN_OR_RETURN(ValueId e, Tensor(c, "exponent"));
              ASSIGN_OR_RETURN(ValueId lg, c.Op("aten.log.default", {Ref(self)}));
              ASSIGN_OR_RETURN(ValueId p, Mul(c, c.output(0), lg));
              ASSIGN_OR_RETURN(ValueId z, c.Op("aten.eq.Scalar", {Ref(self), ir::Float(0.0)}));
              ASSIGN_OR_RETURN(ValueId nn, c.Op("aten.ge.Scalar", {Ref(e), ir::Float(0.0)}));
              ASSIGN_OR_RETURN(ValueId cond, c.Op("aten.logical_and.default", {Ref(z), Ref(nn)}));
              ASSIGN_OR_RETURN(p, ZeroWhere(c, p, cond));
              return Mul(c, g, p);
            }}}));
  // pow(Scalar base, exponent): grad * result * log(base); 0 where base == 0
  // and exponent >= 0.
  Def(r, "aten.pow.Scalar", [](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("exponent") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(double base, c.call().Double("self"));
    ASSIGN_OR_RETURN(ValueId e, Tensor(c, "exponent"));
    ASSIGN_OR_RETURN(ValueId p, MulScalar(c, c.output(0), ir::Float(std::log(base))));
    if (base == 0.0) {
      ASSIGN_OR_RETURN(ValueId nn, c.Op("aten.ge.Scalar", {Ref(e), ir::Float(0.0)}));
      ASSIGN_OR_RETURN(p, ZeroWhere(c, p, nn));
    }
    ASSIGN_OR_RETURN(p, Mul(c, c.grad_output(0), p));
    return SetReduced(c, "exponent", p);
  });

  // Arithmetic. Gradients of broadcast operands are summed back (SetReduced).
  auto alpha_times = [](bool negate) {
    return [negate](Ctx& c, ValueId g) -> Val {
      if (negate) {
        ASSIGN_OR_RETURN(g, Neg(c, g));
      }
      return MaybeMultiply(c, g, "alpha");
    };
  };
  Def(r, "aten.add.Tensor", ParamRule({{"self", Identity()}, {"other", alpha_times(false)}}));
  Def(r, "aten.add.Scalar", SelfRule(Identity()));
  Def(r, "aten.sub.Tensor", ParamRule({{"self", Identity()}, {"other", alpha_times(true)}}));
  Def(r, "aten.sub.Scalar", SelfRule(Identity()));
  // rsub(self, other) = other - alpha * self.
  Def(r, "aten.rsub.Tensor", ParamRule({{"self", alpha_times(true)}, {"other", Identity()}}));
  Def(r, "aten.rsub.Scalar", SelfRule(alpha_times(true)));
  auto times = [](const char* param) {
    return [param](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId t, Tensor(c, param));
      return Mul(c, g, t);
    };
  };
  Def(r, "aten.mul.Tensor", ParamRule({{"self", times("other")}, {"other", times("self")}}));
  Def(r, "aten.mul.Scalar",
      SelfRule([](Ctx& c, ValueId g) { return MulScalar(c, g, Arg(c, "other")); }));
  auto div_self = [](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(ValueId other, Tensor(c, "other"));
    return Div(c, g, other);
  };
  // div_tensor_other_backward: -grad * ((self / other) / other).
  auto div_other = [](Ctx& c, ValueId g) -> Val {
    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
    ASSIGN_OR_RETURN(ValueId other, Tensor(c, "other"));
    ASSIGN_OR_RETURN(ValueId q, Div(c, self, other));
    ASSIGN_OR_RETURN(q, Div(c, q, other));
    ASSIGN_OR_RETURN(ValueId n, Neg(c, g));
    return Mul(c, n, q);
  };
  Def(r, "aten.div.Tensor", ParamRule({{"self", div_self}, {"other", div_other}}));
  // div with a rounding mode is piecewise constant: zeros.
  auto unless_rounding = [](const char* param, GradFn f) {
    return [param, f](Ctx& c, ValueId g) -> Val {
      if (c.call().IsNone("rounding_mode")) return f(c, g);
      ASSIGN_OR_RETURN(ValueId t, Tensor(c, param));
      return ZerosLike(c, t);
    };
  };
  Def(r, "aten.div.Tensor_mode",
      ParamRule({{"self", unless_rounding("self", div_self)},
                 {"other", unless_rounding("other", div_other)}}));
  auto div_scalar = [](Ctx& c, ValueId g) { return DivScalar(c, g, Arg(c, "other")); };
  Def(r, "aten.div.Scalar", SelfRule(div_scalar));
  Def(r, "aten.div.Scalar_mode", SelfRule(unless_rounding("self", div_scalar)));

  // maximum/minimum: the gradient goes to the larger (smaller) operand;
  // ties split it half to each.
  auto select_grad = [](const char* losing_cmp) {
    return [losing_cmp](Ctx& c, ValueId g) -> Val {
      ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
      ASSIGN_OR_RETURN(ValueId other, Tensor(c, "other"));
      ASSIGN_OR_RETURN(ValueId tie, c.Op("aten.eq.Tensor", {Ref(self), Ref(other)}));
      ASSIGN_OR_RETURN(ValueId half, DivScalar(c, g, ir::Int(2)));
      ASSIGN_OR_RETURN(ValueId w, c.Op("aten.where.self", {Ref(tie), Ref(half), Ref(g)}));
      ASSIGN_OR_RETURN(ValueId lose, c.Op(losing_cmp, {Ref(self), Ref(other)}));
      return ZeroWhere(c, w, lose);
    };
  };
  Def(r, "aten.maximum.default",
      ParamRule(
          {{"self", select_grad("aten.lt.Tensor")}, {"other", select_grad("aten.gt.Tensor")}}));
  Def(r, "aten.minimum.default",
      ParamRule(
          {{"self", select_grad("aten.gt.Tensor")}, {"other", select_grad("aten.lt.Tensor")}}));

  Def(r, "aten.where.self",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId cond, Tensor(c, "condition"));
                    ASSIGN_OR_RETURN(ValueId no, Not(c, cond));
                    return ZeroWhere(c, g, no);
                  }},
                 {"other",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId cond, Tensor(c, "condition"));
                    return ZeroWhere(c, g, cond);
                  }}}),
      {"condition"});
  Def(r, "aten.masked_fill.Scalar", SelfRule([](Ctx& c, ValueId g) -> Val {
        ASSIGN_OR_RETURN(ValueId mask, Tensor(c, "mask"));
        return ZeroWhere(c, g, mask);
      }),
      {"mask"});
}

}  // namespace kiln::ops::derivatives_internal
