// SymExpr's canonical polynomial form and the arithmetic on it (sym_expr.h).
#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/ir/sym_expr.h"
#include "compiler/ir/sym_expr_tree.h"

namespace kiln::ir {
namespace {

using Op = SymOp;

constexpr size_t kMaxTerms = 64;
constexpr size_t kMaxFactors = 64;

// Saturating arithmetic; `*saturated` is set when it saturates.
int64_t SaturatingAdd(int64_t a, int64_t b, bool* saturated = nullptr) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  if (saturated != nullptr) *saturated = true;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

int64_t SaturatingMul(int64_t a, int64_t b, bool* saturated = nullptr) {
  int64_t r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  if (saturated != nullptr) *saturated = true;
  return (a < 0) == (b < 0) ? std::numeric_limits<int64_t>::max()
                            : std::numeric_limits<int64_t>::min();
}

// A symbol, or a subexpression the polynomial form does not look into
// ("(s0 - 1)//2", "Max(s0, 2)"), known by its text.
struct Factor {
  std::string text;
  const SymExpr::Tree* tree;
  int32_t node;
};

bool operator<(const Factor& a, const Factor& b) { return a.text < b.text; }
bool operator==(const Factor& a, const Factor& b) { return a.text == b.text; }

// coeff * factor_1 * ... * factor_n, factors sorted by text.
struct Monomial {
  int64_t coeff = 1;
  std::vector<Factor> factors;
  bool saturated = false;  // the coefficient saturated on the way
};

// A sum of monomials with distinct factor lists, plus a constant.
struct Poly {
  std::vector<Monomial> terms;
  int64_t constant = 0;
  // A coefficient saturated: the form no longer computes what the
  // expression does (a saturated term could cancel into a plausible value).
  bool saturated = false;

  void Add(Monomial m) {
    saturated = saturated || m.saturated;
    if (m.coeff == 0) return;
    if (m.factors.empty()) {
      constant = SaturatingAdd(constant, m.coeff, &saturated);
      return;
    }
    for (auto it = terms.begin(); it != terms.end(); ++it) {
      if (it->factors == m.factors) {
        it->coeff = SaturatingAdd(it->coeff, m.coeff, &saturated);
        if (it->coeff == 0) terms.erase(it);
        return;
      }
    }
    terms.push_back(std::move(m));
  }
  void Add(const Poly& p) {
    saturated = saturated || p.saturated;
    for (const Monomial& m : p.terms) Add(m);
    constant = SaturatingAdd(constant, p.constant, &saturated);
  }
  // The terms, with the constant as a monomial of no factors.
  std::vector<Monomial> AllTerms() const {
    std::vector<Monomial> t = terms;
    if (constant != 0) t.push_back(Monomial{constant, {}});
    return t;
  }
};

Monomial Times(const Monomial& a, const Monomial& b) {
  Monomial m;
  m.saturated = a.saturated || b.saturated;
  m.coeff = SaturatingMul(a.coeff, b.coeff, &m.saturated);
  m.factors.reserve(a.factors.size() + b.factors.size());
  std::merge(a.factors.begin(), a.factors.end(), b.factors.begin(), b.factors.end(),
             std::back_inserter(m.factors));
  return m;
}

// p * q expanded, or nullopt past kMaxTerms monomials or kMaxFactors factors
// in one (then the product stays one factor, and simplifying stays cheap).
std::optional<Poly> Product(const Poly& p, const Poly& q) {
  const std::vector<Monomial> x = p.AllTerms(), y = q.AllTerms();
  if (x.size() * y.size() > kMaxTerms) return std::nullopt;
  Poly out;
  out.saturated = p.saturated || q.saturated;
  for (const Monomial& m : x) {
    for (const Monomial& k : y) {
      if (m.factors.size() + k.factors.size() > kMaxFactors) return std::nullopt;
      out.Add(Times(m, k));
    }
  }
  return out;
}

Poly Scaled(const Poly& p, int64_t k) {
  Poly out;
  out.saturated = p.saturated;
  for (const Monomial& m : p.AllTerms()) {
    Monomial scaled{0, m.factors, m.saturated};
    scaled.coeff = SaturatingMul(m.coeff, k, &scaled.saturated);
    out.Add(std::move(scaled));
  }
  return out;
}

Poly Opaque(const SymExpr::Tree& tree, int32_t node) {
  Poly p;
  p.terms.push_back(Monomial{1, {Factor{SymText(tree, node), &tree, node}}});
  return p;
}

Poly ToPoly(const SymExpr::Tree& tree, int32_t node) {
  const SymNode& n = tree.nodes[node];
  switch (n.op) {
    case Op::kConst: {
      Poly p;
      p.constant = n.value;
      return p;
    }
    case Op::kNeg:
      return Scaled(ToPoly(tree, n.a), -1);
    case Op::kAdd:
    case Op::kSub: {
      Poly p = ToPoly(tree, n.a);
      const Poly q = ToPoly(tree, n.b);
      p.Add(n.op == Op::kAdd ? q : Scaled(q, -1));
      return p;
    }
    case Op::kMul: {
      std::optional<Poly> product = Product(ToPoly(tree, n.a), ToPoly(tree, n.b));
      if (!product) return Opaque(tree, node);
      return *std::move(product);
    }
    default:
      return Opaque(tree, node);  // a symbol, or what the form does not look into
  }
}

// The tree of coeff * factors, coeff != 0, factors non-empty: "s0",
// "-s0", "4*s0*s1", "-s0*s1".
int32_t MonomialTree(int64_t coeff, const std::vector<Factor>& factors, SymTreeBuilder* b) {
  int32_t product = -1;
  if (coeff != 1 && coeff != -1) product = b->Const(coeff);
  for (const Factor& f : factors) {
    int32_t x = b->Copy(*f.tree, f.node);
    // -1 negates the first factor: (-s0)*s1, which prints "-s0*s1".
    if (product < 0 && coeff == -1) x = b->Unary(Op::kNeg, x);
    product = product < 0 ? x : b->Binary(Op::kMul, product, x);
  }
  return product;
}

// The polynomial as an expression; nullopt when a coefficient saturated or
// the chain of its terms would nest deeper than an expression may.
std::optional<SymExpr> FromPoly(const Poly& p) {
  if (p.saturated) return std::nullopt;
  if (p.terms.empty()) return SymExpr::Constant(p.constant);
  SymTreeBuilder b;
  int32_t sum = -1;
  for (const Monomial& m : p.terms) {
    if (sum < 0) {
      sum = MonomialTree(m.coeff, m.factors, &b);
    } else if (m.coeff > 0 || m.coeff == std::numeric_limits<int64_t>::min()) {
      sum = b.Binary(Op::kAdd, sum, MonomialTree(m.coeff, m.factors, &b));
    } else {
      sum = b.Binary(Op::kSub, sum, MonomialTree(-m.coeff, m.factors, &b));
    }
  }
  if (p.constant > 0 || p.constant == std::numeric_limits<int64_t>::min()) {
    b.Binary(Op::kAdd, sum, b.Const(p.constant));
  } else if (p.constant < 0) {
    b.Binary(Op::kSub, sum, b.Const(-p.constant));
  }
  if (b.tree().depths.back() > kMaxSymExprDepth) return std::nullopt;
  return SymExpr::FromTree(b.Finish());
}

Poly ToPoly(const SymExpr& e) { return ToPoly(e.tree(), e.tree().root()); }

// a / b when it is exact as monomials.
std::optional<Monomial> Divide(const Monomial& a, const Monomial& b) {
  if (b.coeff == 0 || a.coeff % b.coeff != 0) return std::nullopt;
  if (b.coeff == -1 && a.coeff == std::numeric_limits<int64_t>::min()) return std::nullopt;
  Monomial q;
  q.coeff = a.coeff / b.coeff;
  std::vector<Factor> rest = a.factors;
  for (const Factor& f : b.factors) {
    auto it = std::find(rest.begin(), rest.end(), f);
    if (it == rest.end()) return std::nullopt;
    rest.erase(it);
  }
  q.factors = std::move(rest);
  return q;
}

int64_t FloorDiv(int64_t a, int64_t b) {
  if (b == -1) return SaturatingMul(a, -1);  // INT64_MIN / -1 traps
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// a op b, as written.
SymExpr Written(Op op, const SymExpr& a, const SymExpr& b) {
  SymTreeBuilder builder;
  const int32_t x = builder.Copy(a.tree(), a.tree().root());
  const int32_t y = builder.Copy(b.tree(), b.tree().root());
  builder.Binary(op, x, y);
  return SymExpr::FromTree(builder.Finish());
}

}  // namespace

SymExpr Simplify(const SymExpr& e) { return FromPoly(ToPoly(e)).value_or(e); }

SymExpr SymPlus(const SymExpr& a, const SymExpr& b) {
  if (a.constant() && b.constant())
    return SymExpr::Constant(SaturatingAdd(*a.constant(), *b.constant()));
  Poly p = ToPoly(a);
  p.Add(ToPoly(b));
  if (std::optional<SymExpr> r = FromPoly(p)) return *std::move(r);
  return Written(Op::kAdd, a, b);
}

SymExpr SymMinus(const SymExpr& a, const SymExpr& b) {
  if (a.constant() && b.constant()) {
    return SymExpr::Constant(SaturatingAdd(*a.constant(), SaturatingMul(*b.constant(), -1)));
  }
  Poly p = ToPoly(a);
  p.Add(Scaled(ToPoly(b), -1));
  if (std::optional<SymExpr> r = FromPoly(p)) return *std::move(r);
  return Written(Op::kSub, a, b);
}

SymExpr SymTimes(const SymExpr& a, const SymExpr& b) {
  if (a.constant() && b.constant())
    return SymExpr::Constant(SaturatingMul(*a.constant(), *b.constant()));
  if (a.constant() == 1) return b;
  if (b.constant() == 1) return a;
  std::optional<Poly> product = Product(ToPoly(a), ToPoly(b));
  if (!product) return Written(Op::kMul, a, b);
  if (std::optional<SymExpr> r = FromPoly(*product)) return *std::move(r);
  return Written(Op::kMul, a, b);
}

SymExpr SymFloorDivide(const SymExpr& a, const SymExpr& b) {
  if (a.constant() && b.constant()) {
    return SymExpr::Constant(*b.constant() == 0 ? 0 : FloorDiv(*a.constant(), *b.constant()));
  }
  if (b.constant() == 1 || a.constant() == 0) return a;
  // Exact when every monomial divides by b, itself one monomial.
  const Poly p = ToPoly(a), q = ToPoly(b);
  if (q.terms.size() <= 1 && (q.terms.empty() ? q.constant != 0 : q.constant == 0)) {
    const Monomial d = q.terms.empty() ? Monomial{q.constant, {}} : q.terms[0];
    Poly out;
    bool exact = true;
    for (const Monomial& m : p.AllTerms()) {
      std::optional<Monomial> r = Divide(m, d);
      if (!r) {
        exact = false;
        break;
      }
      out.Add(*r);
    }
    if (exact) {
      if (std::optional<SymExpr> q = FromPoly(out)) return *std::move(q);
    }
  }
  return Written(Op::kFloorDiv, a, b);
}

}  // namespace kiln::ir
