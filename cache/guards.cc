#include "cache/guards.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::cache {

using ir::AsBareSymbol;
using ir::SymExpr;

namespace {

// "input 0 'x'", or "input 0" for a guard without a name.
std::string InputLabel(int i, const v1::TensorGuard& g) {
  if (g.name().empty()) return absl::StrCat("input ", i);
  return absl::StrCat("input ", i, " '", g.name(), "'");
}

// "tensor guard 0 'x'", or "tensor guard 0": the guard, in error statuses.
std::string GuardLabel(int i, const v1::TensorGuard& g) {
  if (g.name().empty()) return absl::StrCat("tensor guard ", i);
  return absl::StrCat("tensor guard ", i, " '", g.name(), "'");
}

// "size[1]" or "stride[1]".
std::string DimLabel(bool stride, int dim) {
  return absl::StrCat(stride ? "stride[" : "size[", dim, "]");
}

std::string DeviceString(const v1::Device& d) {
  std::string s = d.type().empty() ? "none" : d.type();
  if (d.index() >= 0) absl::StrAppend(&s, ":", d.index());
  return s;
}

std::string DTypeString(v1::DType t) {
  const std::string& name = v1::DType_Name(t);
  return name.empty() ? absl::StrCat("dtype ", static_cast<int>(t)) : name;
}

absl::Status UnboundSymbol(absl::string_view what, absl::string_view text,
                           absl::string_view symbol) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", text, "' uses symbol '", symbol, "', which no input size binds"));
}

// Parses a size or stride expression of tensor guard `i`; the error names it.
absl::StatusOr<SymExpr> ParseTensorExpr(int i, const v1::TensorGuard& g, bool stride, int dim,
                                        absl::string_view text) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse(text);
  if (!e.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(GuardLabel(i, g), " ", DimLabel(stride, dim), ": ", e.status().message()));
  }
  return e;
}

absl::StatusOr<SymExpr> ParseShapeGuard(int k, absl::string_view text) {
  absl::StatusOr<SymExpr> e = SymExpr::Parse(text);
  if (!e.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape guard ", k, " '", text, "': ", e.status().message()));
  }
  return e;
}

// The reason in an evaluation error, without its "cannot evaluate '...': ".
absl::string_view EvalReason(const SymExpr& e, const absl::Status& status) {
  absl::string_view msg = status.message();
  const size_t prefix = absl::string_view("cannot evaluate '").size() + e.text().size() +
                        absl::string_view("': ").size();
  return msg.size() > prefix ? msg.substr(prefix) : msg;
}

struct Binding {
  int64_t value;
  int input;  // the input and dimension whose size bound the symbol
  int dim;
};

// An expression whose symbols were not all bound when its input was checked.
struct Deferred {
  int input;
  bool stride;
  int dim;
  int64_t actual;
  SymExpr expr;
};

// The state of one CheckGuards call.
class GuardChecker {
 public:
  GuardChecker(const v1::GuardSet& guards, const v1::InputSignature& inputs)
      : guards_(guards), inputs_(inputs) {}

  absl::StatusOr<std::optional<std::string>> Run() {
    if (guards_.tensors_size() != inputs_.inputs_size()) {
      return absl::StrCat("expected ", guards_.tensors_size(), " inputs, got ",
                          inputs_.inputs_size());
    }
    for (int i = 0; i < guards_.tensors_size(); ++i) {
      ASSIGN_OR_RETURN(std::optional<std::string> failure, CheckInput(i));
      if (failure) return failure;
    }
    for (const Deferred& d : deferred_) {
      for (const std::string& s : d.expr.symbols()) {
        if (!bound_.contains(s)) {
          return UnboundSymbol(absl::StrCat(GuardLabel(d.input, guards_.tensors(d.input)), " ",
                                            DimLabel(d.stride, d.dim)),
                               d.expr.text(), s);
        }
      }
      std::optional<std::string> failure = CheckExpr(d.input, d.stride, d.dim, d.actual, d.expr);
      if (failure) return failure;
    }
    for (int k = 0; k < guards_.shape_guards_size(); ++k) {
      ASSIGN_OR_RETURN(std::optional<std::string> failure, CheckShapeGuard(k));
      if (failure) return failure;
    }
    if (guards_.client_guard_digest() != inputs_.client_guard_digest()) {
      return std::string("client guards differ");
    }
    return std::optional<std::string>();
  }

 private:
  absl::StatusOr<std::optional<std::string>> CheckInput(int i) {
    const v1::TensorGuard& g = guards_.tensors(i);
    const v1::TensorSignature& t = inputs_.inputs(i);
    if (g.dtype() != t.dtype()) {
      return absl::StrCat(InputLabel(i, g), ": dtype is ", DTypeString(t.dtype()),
                          ", guard expects ", DTypeString(g.dtype()));
    }
    if (g.has_device() &&
        (g.device().type() != t.device().type() || g.device().index() != t.device().index())) {
      return absl::StrCat(InputLabel(i, g), ": device is ", DeviceString(t.device()),
                          ", guard expects ", DeviceString(g.device()));
    }
    if (g.sizes_size() != t.sizes_size()) {
      return absl::StrCat(InputLabel(i, g), ": rank is ", t.sizes_size(), ", guard expects ",
                          g.sizes_size());
    }
    for (int d = 0; d < g.sizes_size(); ++d) {
      ASSIGN_OR_RETURN(std::optional<std::string> failure,
                       CheckDim(i, /*stride=*/false, d, t.sizes(d), g.sizes(d)));
      if (failure) return failure;
    }
    switch (g.stride_check()) {
      case v1::TensorGuard::EXACT: {
        if (g.strides_size() != g.sizes_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat(GuardLabel(i, g), ": stride_check EXACT needs one stride per size (",
                           g.sizes_size(), "), has ", g.strides_size()));
        }
        if (t.strides_size() != t.sizes_size()) return StrideCount(i);
        for (int d = 0; d < g.strides_size(); ++d) {
          ASSIGN_OR_RETURN(std::optional<std::string> failure,
                           CheckDim(i, /*stride=*/true, d, t.strides(d), g.strides(d)));
          if (failure) return failure;
        }
        break;
      }
      case v1::TensorGuard::CONTIGUOUS:
        if (t.strides_size() != t.sizes_size()) return StrideCount(i);
        if (!IsContiguous(t)) {
          return absl::StrCat(InputLabel(i, g), ": is not contiguous (strides [",
                              absl::StrJoin(t.strides(), ", "), "]), guard expects contiguous");
        }
        break;
      default:
        break;
    }
    if (g.check_requires_grad() && g.requires_grad() != t.requires_grad()) {
      return absl::StrCat(InputLabel(i, g), ": requires_grad is ",
                          t.requires_grad() ? "true" : "false", ", guard expects ",
                          g.requires_grad() ? "true" : "false");
    }
    return std::optional<std::string>();
  }

  std::string StrideCount(int i) const {
    const v1::TensorSignature& t = inputs_.inputs(i);
    return absl::StrCat(InputLabel(i, guards_.tensors(i)), ": stride count is ", t.strides_size(),
                        ", guard expects ", t.sizes_size());
  }

  // PyTorch's is_contiguous: row-major, ignoring dimensions of size 1; a
  // tensor with no elements is contiguous.
  static bool IsContiguous(const v1::TensorSignature& t) {
    for (int64_t s : t.sizes()) {
      if (s == 0) return true;
    }
    int64_t expected = 1;
    for (int d = t.sizes_size() - 1; d >= 0; --d) {
      if (t.sizes(d) == 1) continue;
      if (t.strides(d) != expected) return false;
      if (__builtin_mul_overflow(expected, t.sizes(d), &expected)) return false;
    }
    return true;
  }

  // One size or stride of input `i` against its guard value.
  absl::StatusOr<std::optional<std::string>> CheckDim(int i, bool stride, int dim, int64_t actual,
                                                      const v1::SymInt& want) {
    if (want.value_case() != v1::SymInt::kExpr) {
      if (actual == want.int_value()) return std::optional<std::string>();
      return absl::StrCat(InputLabel(i, guards_.tensors(i)), ": ", DimLabel(stride, dim), " is ",
                          actual, ", guard expects ", want.int_value());
    }
    if (std::optional<absl::string_view> symbol = AsBareSymbol(want.expr())) {
      auto it = bound_.find(*symbol);
      if (it == bound_.end()) {
        if (!stride) {
          bound_.emplace(*symbol, Binding{actual, i, dim});
          return std::optional<std::string>();
        }
        // A stride does not bind; it waits for a later input's size to.
      } else {
        if (it->second.value == actual) return std::optional<std::string>();
        const Binding& b = it->second;
        return absl::StrCat(InputLabel(i, guards_.tensors(i)), ": ", DimLabel(stride, dim), " is ",
                            actual, ", but ", *symbol, " = ", b.value, " (bound by ",
                            InputLabel(b.input, guards_.tensors(b.input)), " size[", b.dim, "])");
      }
    }
    ASSIGN_OR_RETURN(SymExpr expr,
                     ParseTensorExpr(i, guards_.tensors(i), stride, dim, want.expr()));
    bool all_bound = true;
    for (const std::string& s : expr.symbols()) all_bound = all_bound && bound_.contains(s);
    if (!all_bound) {
      deferred_.push_back(Deferred{i, stride, dim, actual, std::move(expr)});
      return std::optional<std::string>();
    }
    return CheckExpr(i, stride, dim, actual, expr);
  }

  // A size or stride expression whose symbols are all bound.
  std::optional<std::string> CheckExpr(int i, bool stride, int dim, int64_t actual,
                                       const SymExpr& expr) const {
    absl::StatusOr<int64_t> want = Evaluate(expr);
    if (want.ok() && *want == actual) return std::nullopt;
    std::string msg = absl::StrCat(InputLabel(i, guards_.tensors(i)), ": ", DimLabel(stride, dim),
                                   " is ", actual, ", guard expects ");
    if (want.ok()) {
      absl::StrAppend(&msg, expr.text(), " = ", *want);
    } else {
      absl::StrAppend(&msg, "'", expr.text(),
                      "', which cannot be evaluated: ", EvalReason(expr, want.status()));
    }
    AppendSymbolValues(expr, &msg);
    return msg;
  }

  absl::StatusOr<std::optional<std::string>> CheckShapeGuard(int k) {
    const std::string& text = guards_.shape_guards(k);
    ASSIGN_OR_RETURN(SymExpr expr, ParseShapeGuard(k, text));
    for (const std::string& s : expr.symbols()) {
      if (!bound_.contains(s)) return UnboundSymbol(absl::StrCat("shape guard ", k), text, s);
    }
    absl::StatusOr<int64_t> holds = Evaluate(expr);
    if (holds.ok() && *holds != 0) return std::optional<std::string>();
    // Name the input dimension that bound the first symbol.
    std::string msg;
    if (!expr.symbols().empty()) {
      const Binding& b = bound_.find(expr.symbols().front())->second;
      msg = absl::StrCat(InputLabel(b.input, guards_.tensors(b.input)), ": size[", b.dim, "] is ",
                         b.value, ", ");
    }
    absl::StrAppend(&msg, "guard '", text, "' ");
    if (holds.ok()) {
      absl::StrAppend(&msg, "fails");
    } else {
      absl::StrAppend(&msg, "cannot be evaluated: ", EvalReason(expr, holds.status()));
    }
    AppendSymbolValues(expr, &msg);
    return msg;
  }

  absl::StatusOr<int64_t> Evaluate(const SymExpr& expr) const {
    return expr.EvaluateWith([this](absl::string_view name) -> std::optional<int64_t> {
      auto it = bound_.find(name);
      if (it == bound_.end()) return std::nullopt;
      return it->second.value;
    });
  }

  // " (s0 = 48, s1 = 3)" for an expression's symbols; nothing when it has none.
  void AppendSymbolValues(const SymExpr& expr, std::string* msg) const {
    if (expr.symbols().empty()) return;
    msg->append(" (");
    for (size_t j = 0; j < expr.symbols().size(); ++j) {
      const std::string& s = expr.symbols()[j];
      absl::StrAppend(msg, j ? ", " : "", s, " = ", bound_.find(s)->second.value);
    }
    msg->append(")");
  }

  const v1::GuardSet& guards_;
  const v1::InputSignature& inputs_;
  // Keys view the guards' own strings, which outlive the checker.
  absl::flat_hash_map<absl::string_view, Binding> bound_;
  std::vector<Deferred> deferred_;
};

}  // namespace

namespace {

// `what` (a guard and its field), when its text is beyond `limits`: over
// max_length characters, or parentheses nested deeper than max_depth. One
// pass over the text, which the message does not quote.
absl::Status CheckExprLimits(absl::string_view text, const ExprLimits& limits,
                             absl::FunctionRef<std::string()> what) {
  if (static_cast<int64_t>(text.size()) > limits.max_length) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": an expression of ", text.size(),
                                                   " characters, over the limit of ",
                                                   limits.max_length, " (max_expr_length)"));
  }
  int64_t depth = 0;
  for (char c : text) {
    if (c == '(' && ++depth > limits.max_depth) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": parentheses nest deeper than ",
                                                     limits.max_depth, " (max_expr_depth)"));
    }
    if (c == ')' && depth > 0) --depth;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGuardSet(const v1::GuardSet& guards, const ExprLimits& limits) {
  for (int i = 0; i < guards.tensors_size(); ++i) {
    const v1::TensorGuard& g = guards.tensors(i);
    for (bool stride : {false, true}) {
      const auto& dims = stride ? g.strides() : g.sizes();
      for (int d = 0; d < dims.size(); ++d) {
        if (dims[d].value_case() != v1::SymInt::kExpr) continue;
        RETURN_IF_ERROR(CheckExprLimits(dims[d].expr(), limits, [&] {
          return absl::StrCat(GuardLabel(i, g).substr(0, 200), " ", DimLabel(stride, d));
        }));
      }
    }
  }
  for (int k = 0; k < guards.shape_guards_size(); ++k) {
    RETURN_IF_ERROR(CheckExprLimits(guards.shape_guards(k), limits,
                                    [k] { return absl::StrCat("shape guard ", k); }));
  }
  absl::flat_hash_set<absl::string_view> bound;
  for (const v1::TensorGuard& g : guards.tensors()) {
    for (const v1::SymInt& s : g.sizes()) {
      if (s.value_case() != v1::SymInt::kExpr) continue;
      if (std::optional<absl::string_view> symbol = AsBareSymbol(s.expr())) bound.insert(*symbol);
    }
  }
  auto check_expr = [&bound](int i, const v1::TensorGuard& g, bool stride, int dim,
                             const v1::SymInt& s) -> absl::Status {
    if (s.value_case() != v1::SymInt::kExpr) return absl::OkStatus();
    ASSIGN_OR_RETURN(SymExpr expr, ParseTensorExpr(i, g, stride, dim, s.expr()));
    for (const std::string& sym : expr.symbols()) {
      if (!bound.contains(sym)) {
        return UnboundSymbol(absl::StrCat(GuardLabel(i, g), " ", DimLabel(stride, dim)), s.expr(),
                             sym);
      }
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < guards.tensors_size(); ++i) {
    const v1::TensorGuard& g = guards.tensors(i);
    for (int d = 0; d < g.sizes_size(); ++d) {
      RETURN_IF_ERROR(check_expr(i, g, /*stride=*/false, d, g.sizes(d)));
    }
    if (g.stride_check() == v1::TensorGuard::EXACT && g.strides_size() != g.sizes_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(GuardLabel(i, g), ": stride_check EXACT needs one stride per size (",
                       g.sizes_size(), "), has ", g.strides_size()));
    }
    for (int d = 0; d < g.strides_size(); ++d) {
      RETURN_IF_ERROR(check_expr(i, g, /*stride=*/true, d, g.strides(d)));
    }
  }
  for (int k = 0; k < guards.shape_guards_size(); ++k) {
    const std::string& text = guards.shape_guards(k);
    ASSIGN_OR_RETURN(SymExpr expr, ParseShapeGuard(k, text));
    for (const std::string& sym : expr.symbols()) {
      if (!bound.contains(sym)) return UnboundSymbol(absl::StrCat("shape guard ", k), text, sym);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> CheckGuards(const v1::GuardSet& guards,
                                                       const v1::InputSignature& inputs) {
  return GuardChecker(guards, inputs).Run();
}

v1::GuardSet DeriveGuards(const ir::Graph& graph) {
  v1::GuardSet guards;
  for (const ir::Input& in : graph.inputs()) {
    const ir::Value& v = graph.value(in.value);
    const ir::TensorMeta& m = v.meta;
    v1::TensorGuard* g = guards.add_tensors();
    g->set_name(v.name);
    g->set_dtype(m.dtype);
    if (!m.device_type.empty()) {
      g->mutable_device()->set_type(m.device_type);
      g->mutable_device()->set_index(m.device_index);
    }
    for (const ir::SymInt& s : m.sizes) *g->add_sizes() = ir::SymIntToProto(s);
    if (m.strides.size() == m.sizes.size()) {
      g->set_stride_check(v1::TensorGuard::EXACT);
      for (const ir::SymInt& s : m.strides) *g->add_strides() = ir::SymIntToProto(s);
    }
    g->set_check_requires_grad(true);
    g->set_requires_grad(m.requires_grad);
  }
  return guards;
}

absl::StatusOr<v1::InputSignature> SignatureFromGraph(const ir::Graph& graph) {
  v1::InputSignature sig;
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const ir::Value& v = graph.value(graph.inputs()[i].value);
    const ir::TensorMeta& m = v.meta;
    auto symbolic = [&](absl::string_view what, const ir::SymInt& s) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, " '", v.name, "': ", what,
                                                     " is symbolic (", s.expr(),
                                                     "); a signature needs concrete values"));
    };
    v1::TensorSignature* t = sig.add_inputs();
    t->set_dtype(m.dtype);
    if (!m.device_type.empty()) {
      t->mutable_device()->set_type(m.device_type);
      t->mutable_device()->set_index(m.device_index);
    }
    for (size_t d = 0; d < m.sizes.size(); ++d) {
      if (!m.sizes[d].is_constant())
        return symbolic(DimLabel(false, static_cast<int>(d)), m.sizes[d]);
      t->add_sizes(m.sizes[d].constant());
    }
    for (size_t d = 0; d < m.strides.size(); ++d) {
      if (!m.strides[d].is_constant())
        return symbolic(DimLabel(true, static_cast<int>(d)), m.strides[d]);
      t->add_strides(m.strides[d].constant());
    }
    t->set_requires_grad(m.requires_grad);
    if (!m.storage_offset.is_constant()) return symbolic("storage_offset", m.storage_offset);
    t->set_storage_offset(m.storage_offset.constant());
  }
  return sig;
}

}  // namespace kiln::cache
