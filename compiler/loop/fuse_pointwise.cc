// The pointwise ops' lowerings: for each target, the expression over its
// operands that a Builder adds to a kernel (arithmetic in the computation
// type: float16 and bfloat16 are carried in float32).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/loop/fuse_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop::fuse_internal {

const std::map<std::string, PointwiseRule>& PointwiseRules() {
  static const auto* rules = [] {
    auto* m = new std::map<std::string, PointwiseRule>();
    // Unary ops over `self`, by ATen op.
    const std::pair<const char*, ScalarOp> kUnary[] = {
        {"aten.neg.default", ScalarOp::kNeg},
        {"aten.abs.default", ScalarOp::kAbs},
        {"aten.exp.default", ScalarOp::kExp},
        {"aten.log.default", ScalarOp::kLog},
        {"aten.log1p.default", ScalarOp::kLog1p},
        {"aten.expm1.default", ScalarOp::kExpm1},
        {"aten.sqrt.default", ScalarOp::kSqrt},
        {"aten.rsqrt.default", ScalarOp::kRsqrt},
        {"aten.reciprocal.default", ScalarOp::kReciprocal},
        {"aten.sin.default", ScalarOp::kSin},
        {"aten.cos.default", ScalarOp::kCos},
        {"aten.tanh.default", ScalarOp::kTanh},
        {"aten.sigmoid.default", ScalarOp::kSigmoid},
        {"aten.relu.default", ScalarOp::kRelu},
        {"aten.erf.default", ScalarOp::kErf},
        {"aten.sign.default", ScalarOp::kSign},
        {"aten.floor.default", ScalarOp::kFloor},
        {"aten.ceil.default", ScalarOp::kCeil},
        {"aten.silu.default", ScalarOp::kSilu},
    };
    for (const auto& [target, op] : kUnary) {
      (*m)[target] = [op = op](Builder& b, const ops::OpCall&, v1::DType t) -> absl::StatusOr<int> {
        ASSIGN_OR_RETURN(int x, b.T("self"));
        return b.Ar(op, {x}, t);
      };
    }
    (*m)["aten.logical_not.default"] = [](Builder& b, const ops::OpCall&,
                                          v1::DType) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      return b.Op(ScalarOp::kNot, {b.Cast(x, v1::BOOL)}, v1::BOOL);
    };
    (*m)["aten.gelu.default"] = [](Builder& b, const ops::OpCall& c,
                                   v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      const ir::Argument* a = c.Find("approximate");
      const std::string* approx = a ? std::get_if<std::string>(&a->kind) : nullptr;
      return b.Ar(approx != nullptr && *approx == "tanh" ? ScalarOp::kGeluTanh : ScalarOp::kGelu,
                  {x}, t);
    };
    for (const char* id : {"clone", "alias", "detach", "lift_fresh_copy"}) {
      (*m)[absl::StrCat("aten.", id, ".default")] = [](Builder& b, const ops::OpCall&,
                                                       v1::DType t) -> absl::StatusOr<int> {
        ASSIGN_OR_RETURN(int x, b.T("self"));
        return b.Cast(x, Compute(t));
      };
    }
    // An explicit conversion rounds to its dtype even when the value stays
    // in the kernel (x.bfloat16().float() is x rounded to bfloat16), though
    // half-type arithmetic is carried in float32 and rounded at its store.
    (*m)["aten._to_copy.default"] = [](Builder& b, const ops::OpCall&,
                                       v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      return b.Cast(x, t);
    };
    // Binary ops over two tensors or a tensor and a Scalar, with `alpha`.
    auto binary = [m](const std::string& name, ScalarOp op, bool alpha, bool reverse) {
      for (const char* overload : {"Tensor", "Scalar"}) {
        const bool scalar = std::string(overload) == "Scalar";
        (*m)[absl::StrCat("aten.", name, ".", overload)] = [op, alpha, reverse, scalar](
                                                               Builder& b, const ops::OpCall& c,
                                                               v1::DType t) -> absl::StatusOr<int> {
          ASSIGN_OR_RETURN(int x, b.T("self"));
          int y;
          if (scalar) {
            ASSIGN_OR_RETURN(double s, b.S("other"));
            y = b.C(s, t);
          } else {
            ASSIGN_OR_RETURN(y, b.T("other"));
          }
          if (alpha && !c.IsNone("alpha")) {
            ASSIGN_OR_RETURN(double a, c.Double("alpha"));
            if (a != 1.0) y = b.Ar(ScalarOp::kMul, {y, b.C(a, t)}, t);
          }
          if (reverse) std::swap(x, y);
          return b.Ar(op, {x, y}, t);
        };
      }
    };
    binary("add", ScalarOp::kAdd, true, false);
    binary("sub", ScalarOp::kSub, true, false);
    binary("rsub", ScalarOp::kSub, true, true);
    binary("mul", ScalarOp::kMul, false, false);
    binary("div", ScalarOp::kDiv, false, false);
    (*m)["aten.maximum.default"] = [](Builder& b, const ops::OpCall&,
                                      v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("other"));
      return b.Ar(ScalarOp::kMax, {x, y}, t);
    };
    (*m)["aten.minimum.default"] = [](Builder& b, const ops::OpCall&,
                                      v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("other"));
      return b.Ar(ScalarOp::kMin, {x, y}, t);
    };
    (*m)["aten.pow.Tensor_Scalar"] = [](Builder& b, const ops::OpCall&,
                                        v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(double e, b.S("exponent"));
      // The exponents ATen computes without pow (as the derivative of
      // x.pow(2) asks for x.pow(1)): the same roundings, and no pow routine
      // for the compilers to inline.
      if (e == 1.0) return b.Cast(x, Compute(t));
      if (e == 2.0) return b.Ar(ScalarOp::kMul, {x, x}, t);
      if (ops::IsFloating(t)) {
        if (e == 0.5) return b.Ar(ScalarOp::kSqrt, {x}, t);
        if (e == -0.5) return b.Ar(ScalarOp::kRsqrt, {x}, t);
        if (e == -1.0) return b.Ar(ScalarOp::kReciprocal, {x}, t);
      }
      // Two products: ATen's CPU kernels round a 16-bit one in between.
      if (t == v1::FLOAT32 || t == v1::FLOAT64) {
        if (e == 3.0) return b.Ar(ScalarOp::kMul, {b.Ar(ScalarOp::kMul, {x, x}, t), x}, t);
        if (e == -2.0) return b.Ar(ScalarOp::kReciprocal, {b.Ar(ScalarOp::kMul, {x, x}, t)}, t);
      }
      return b.Ar(ScalarOp::kPow, {x, b.C(e, t)}, t);
    };
    (*m)["aten.pow.Tensor_Tensor"] = [](Builder& b, const ops::OpCall&,
                                        v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("exponent"));
      return b.Ar(ScalarOp::kPow, {x, y}, t);
    };
    const std::pair<const char*, ScalarOp> kCompare[] = {
        {"eq", ScalarOp::kEq}, {"ne", ScalarOp::kNe}, {"lt", ScalarOp::kLt},
        {"le", ScalarOp::kLe}, {"gt", ScalarOp::kGt}, {"ge", ScalarOp::kGe},
    };
    for (const auto& [cmp, op] : kCompare) {
      for (const char* overload : {"Tensor", "Scalar"}) {
        const bool scalar = std::string(overload) == "Scalar";
        (*m)[absl::StrCat("aten.", cmp, ".", overload)] =
            [op = op, scalar](Builder& b, const ops::OpCall&, v1::DType) -> absl::StatusOr<int> {
          ASSIGN_OR_RETURN(int x, b.T("self"));
          int y;
          if (scalar) {
            ASSIGN_OR_RETURN(double s, b.S("other"));
            y = b.C(s, b.D(x) == v1::BOOL ? v1::INT64 : b.D(x));
          } else {
            ASSIGN_OR_RETURN(y, b.T("other"));
          }
          return b.Compare(op, x, y);
        };
      }
    }
    const std::pair<const char*, ScalarOp> kLogical[] = {
        {"aten.logical_and.default", ScalarOp::kAnd},
        {"aten.logical_or.default", ScalarOp::kOr},
        {"aten.logical_xor.default", ScalarOp::kXor},
    };
    for (const auto& [target, op] : kLogical) {
      (*m)[target] = [op = op](Builder& b, const ops::OpCall&, v1::DType) -> absl::StatusOr<int> {
        ASSIGN_OR_RETURN(int x, b.T("self"));
        ASSIGN_OR_RETURN(int y, b.T("other"));
        return b.Op(op, {b.Cast(x, v1::BOOL), b.Cast(y, v1::BOOL)}, v1::BOOL);
      };
    }
    (*m)["aten.where.self"] = [](Builder& b, const ops::OpCall&,
                                 v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int c, b.T("condition"));
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("other"));
      return b.Op(ScalarOp::kWhere,
                  {b.Cast(c, v1::BOOL), b.Cast(x, Compute(t)), b.Cast(y, Compute(t))}, Compute(t));
    };
    (*m)["aten.masked_fill.Scalar"] = [](Builder& b, const ops::OpCall&,
                                         v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int mask, b.T("mask"));
      ASSIGN_OR_RETURN(double v, b.S("value"));
      return b.Op(ScalarOp::kWhere, {b.Cast(mask, v1::BOOL), b.C(v, t), b.Cast(x, Compute(t))},
                  Compute(t));
    };
    (*m)["aten.clamp.default"] = [](Builder& b, const ops::OpCall& c,
                                    v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      x = b.Cast(x, Compute(t));
      if (!c.IsNone("min")) {
        ASSIGN_OR_RETURN(double lo, c.Double("min"));
        x = b.Op(ScalarOp::kMax, {x, b.C(lo, t)}, Compute(t));
      }
      if (!c.IsNone("max")) {
        ASSIGN_OR_RETURN(double hi, c.Double("max"));
        x = b.Op(ScalarOp::kMin, {x, b.C(hi, t)}, Compute(t));
      }
      return x;
    };
    (*m)["aten.threshold_backward.default"] = [](Builder& b, const ops::OpCall&,
                                                 v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(double th, b.S("threshold"));
      int keep = b.Op(ScalarOp::kLe, {b.Cast(x, Compute(t)), b.C(th, t)}, v1::BOOL);
      return b.Op(ScalarOp::kWhere, {keep, b.C(0, t), b.Cast(g, Compute(t))}, Compute(t));
    };
    (*m)["aten.tanh_backward.default"] = [](Builder& b, const ops::OpCall&,
                                            v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int y, b.T("output"));
      int yy = b.Ar(ScalarOp::kMul, {y, y}, t);
      return b.Ar(ScalarOp::kMul, {g, b.Ar(ScalarOp::kSub, {b.C(1, t), yy}, t)}, t);
    };
    (*m)["aten.sigmoid_backward.default"] = [](Builder& b, const ops::OpCall&,
                                               v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int y, b.T("output"));
      int one_minus = b.Ar(ScalarOp::kSub, {b.C(1, t), y}, t);
      return b.Ar(ScalarOp::kMul, {g, b.Ar(ScalarOp::kMul, {y, one_minus}, t)}, t);
    };
    (*m)["aten.gelu_backward.default"] = [](Builder& b, const ops::OpCall& c,
                                            v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int x, b.T("self"));
      const ir::Argument* a = c.Find("approximate");
      const std::string* approx = a ? std::get_if<std::string>(&a->kind) : nullptr;
      const v1::DType ct = Compute(t);
      x = b.Cast(x, ct);
      int d;
      if (approx != nullptr && *approx == "tanh") {
        // d/dx 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2 / pi)
        const double k = 0.7978845608028654, kappa = 0.044715;
        int x2 = b.Op(ScalarOp::kMul, {x, x}, ct);
        int inner = b.Op(
            ScalarOp::kMul,
            {b.C(k, ct), b.Op(ScalarOp::kAdd,
                              {x, b.Op(ScalarOp::kMul,
                                       {b.C(kappa, ct), b.Op(ScalarOp::kMul, {x2, x}, ct)}, ct)},
                              ct)},
            ct);
        int th = b.Op(ScalarOp::kTanh, {inner}, ct);
        int left =
            b.Op(ScalarOp::kMul, {b.C(0.5, ct), b.Op(ScalarOp::kAdd, {b.C(1, ct), th}, ct)}, ct);
        int sech2 = b.Op(ScalarOp::kSub, {b.C(1, ct), b.Op(ScalarOp::kMul, {th, th}, ct)}, ct);
        int dinner =
            b.Op(ScalarOp::kMul,
                 {b.C(k, ct),
                  b.Op(ScalarOp::kAdd,
                       {b.C(1, ct), b.Op(ScalarOp::kMul, {b.C(3 * kappa, ct), x2}, ct)}, ct)},
                 ct);
        int right = b.Op(ScalarOp::kMul,
                         {b.Op(ScalarOp::kMul, {b.C(0.5, ct), x}, ct),
                          b.Op(ScalarOp::kMul, {sech2, dinner}, ct)},
                         ct);
        d = b.Op(ScalarOp::kAdd, {left, right}, ct);
      } else {
        // Phi(x) + x phi(x)
        int cdf =
            b.Op(ScalarOp::kMul,
                 {b.C(0.5, ct),
                  b.Op(ScalarOp::kAdd,
                       {b.C(1, ct),
                        b.Op(ScalarOp::kErf,
                             {b.Op(ScalarOp::kMul, {x, b.C(0.7071067811865476, ct)}, ct)}, ct)},
                       ct)},
                 ct);
        int pdf = b.Op(
            ScalarOp::kMul,
            {b.Op(ScalarOp::kExp,
                  {b.Op(ScalarOp::kMul, {b.C(-0.5, ct), b.Op(ScalarOp::kMul, {x, x}, ct)}, ct)},
                  ct),
             b.C(0.3989422804014327, ct)},
            ct);
        d = b.Op(ScalarOp::kAdd, {cdf, b.Op(ScalarOp::kMul, {x, pdf}, ct)}, ct);
      }
      return b.Ar(ScalarOp::kMul, {g, d}, t);
    };
    (*m)["aten.native_dropout_backward.default"] = [](Builder& b, const ops::OpCall&,
                                                      v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int mask, b.T("mask"));
      ASSIGN_OR_RETURN(double scale, b.S("scale"));
      int kept = b.Cast(b.Cast(mask, v1::BOOL), Compute(t));
      return b.Ar(ScalarOp::kMul, {b.Ar(ScalarOp::kMul, {g, kept}, t), b.C(scale, t)}, t);
    };
    (*m)["aten.fill.Scalar"] = [](Builder& b, const ops::OpCall& c,
                                  v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(double v, c.Double("value"));
      return b.C(v, t);
    };
    // arange with integer bounds: the index value start + step * i, cast
    // to the output's dtype (exact below 2^24 in float32, where ATen's
    // values are the same integers).
    for (const char* target : {"aten.arange.default", "aten.arange.start_step"}) {
      (*m)[target] = [](Builder& b, const ops::OpCall& c, v1::DType t) -> absl::StatusOr<int> {
        auto integer = [&](const char* name, int64_t fallback) -> absl::StatusOr<SymInt> {
          if (c.schema().FindParam(name) < 0 || c.IsNone(name)) return SymInt{fallback};
          const ir::Argument* a = c.Find(name);
          if (const auto* i = std::get_if<int64_t>(&a->kind)) return SymInt{*i};
          if (const auto* i = std::get_if<SymInt>(&a->kind)) return *i;
          return absl::FailedPreconditionError(absl::StrCat("its ", name, " is not an integer"));
        };
        ASSIGN_OR_RETURN(SymInt start, integer("start", 0));
        ASSIGN_OR_RETURN(SymInt end, integer("end", 0));
        ASSIGN_OR_RETURN(SymInt step, integer("step", 1));
        if (!start.is_constant() || !step.is_constant() || step.constant() == 0) {
          return absl::FailedPreconditionError("its start or step is symbolic");
        }
        const int64_t st = step.constant();
        SymInt size = end;  // symbolic: more than one element
        if (end.is_constant()) {
          const int64_t span = end.constant() - start.constant();
          size = SymInt{std::max<int64_t>(0, (span + st + (st > 0 ? -1 : 1)) / st)};
          if (std::abs(end.constant()) > (int64_t{1} << 24) && Compute(t) == v1::FLOAT32) {
            return absl::FailedPreconditionError("its values are not exact in float32");
          }
        }
        ASSIGN_OR_RETURN(int i, b.Iota(size, start.constant(), st));
        return b.Cast(i, Compute(t));
      };
    }
    // Tensors of one value (lower.cc lowers them on the graph's device
    // only): a constant where they are read.
    for (const auto& entry :
         std::vector<std::pair<std::string, const char*>>{{"aten.full.default", "fill_value"},
                                                          {"aten.full_like.default", "fill_value"},
                                                          {"aten.scalar_tensor.default", "s"},
                                                          {"aten.zeros.default", nullptr},
                                                          {"aten.zeros_like.default", nullptr},
                                                          {"aten.new_zeros.default", nullptr},
                                                          {"aten.ones.default", nullptr},
                                                          {"aten.ones_like.default", nullptr}}) {
      const char* param = entry.second;  // a lambda captures no structured binding
      const double one = absl::StrContains(entry.first, "ones") ? 1.0 : 0.0;
      (*m)[entry.first] = [param, one](Builder& b, const ops::OpCall& c,
                                       v1::DType t) -> absl::StatusOr<int> {
        double v = one;
        if (param != nullptr) {
          // A symbolic value (a size as a scalar) is left to ATen.
          absl::StatusOr<double> given = c.Double(param);
          if (!given.ok()) return absl::FailedPreconditionError(given.status().message());
          v = *given;
        }
        // Integers past 2^53 have no exact double: ATen fills them.
        if (!(v > -9007199254740992.0 && v < 9007199254740992.0) && Compute(t) == t &&
            t != v1::FLOAT32 && t != v1::FLOAT64) {
          return absl::FailedPreconditionError(
              absl::StrCat("its value ", v, " is not exact as a double"));
        }
        return b.C(v, t);
      };
    }
    return m;
  }();
  return *rules;
}

}  // namespace kiln::loop::fuse_internal
