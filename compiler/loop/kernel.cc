#include "compiler/loop/kernel.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compiler/ir/printer.h"

namespace kiln::loop {
namespace {

// The scalar ops, in the enum's order: name, arity, whether the result must
// be floating.
constexpr ScalarOpInfo kScalarOps[] = {
    {ScalarOp::kNeg, "neg", 1, false},
    {ScalarOp::kAbs, "abs", 1, false},
    {ScalarOp::kExp, "exp", 1, true},
    {ScalarOp::kLog, "log", 1, true},
    {ScalarOp::kLog1p, "log1p", 1, true},
    {ScalarOp::kExpm1, "expm1", 1, true},
    {ScalarOp::kSqrt, "sqrt", 1, true},
    {ScalarOp::kRsqrt, "rsqrt", 1, true},
    {ScalarOp::kReciprocal, "reciprocal", 1, true},
    {ScalarOp::kSin, "sin", 1, true},
    {ScalarOp::kCos, "cos", 1, true},
    {ScalarOp::kTanh, "tanh", 1, true},
    {ScalarOp::kSigmoid, "sigmoid", 1, true},
    {ScalarOp::kRelu, "relu", 1, false},
    {ScalarOp::kErf, "erf", 1, true},
    {ScalarOp::kSign, "sign", 1, false},
    {ScalarOp::kFloor, "floor", 1, false},
    {ScalarOp::kCeil, "ceil", 1, false},
    {ScalarOp::kNot, "not", 1, false},
    {ScalarOp::kGelu, "gelu", 1, true},
    {ScalarOp::kGeluTanh, "gelu_tanh", 1, true},
    {ScalarOp::kSilu, "silu", 1, true},
    {ScalarOp::kIsnan, "isnan", 1, false},
    {ScalarOp::kAdd, "add", 2, false},
    {ScalarOp::kSub, "sub", 2, false},
    {ScalarOp::kMul, "mul", 2, false},
    {ScalarOp::kDiv, "div", 2, true},
    {ScalarOp::kDivFloor, "div_floor", 2, false},
    {ScalarOp::kDivTrunc, "div_trunc", 2, false},
    {ScalarOp::kPow, "pow", 2, false},
    {ScalarOp::kMax, "max", 2, false},
    {ScalarOp::kMin, "min", 2, false},
    {ScalarOp::kEq, "eq", 2, false},
    {ScalarOp::kNe, "ne", 2, false},
    {ScalarOp::kLt, "lt", 2, false},
    {ScalarOp::kLe, "le", 2, false},
    {ScalarOp::kGt, "gt", 2, false},
    {ScalarOp::kGe, "ge", 2, false},
    {ScalarOp::kAnd, "and", 2, false},
    {ScalarOp::kOr, "or", 2, false},
    {ScalarOp::kXor, "xor", 2, false},
    {ScalarOp::kWhere, "where", 3, false},
    {ScalarOp::kCast, "cast", 1, false},
};
constexpr int kScalarOpCount = static_cast<int>(sizeof(kScalarOps) / sizeof(kScalarOps[0]));
static_assert(kScalarOpCount == static_cast<int>(ScalarOp::kCast) + 1,
              "kScalarOps has one row per ScalarOp");

constexpr bool InEnumOrder() {
  for (int k = 0; k < kScalarOpCount; ++k) {
    if (static_cast<int>(kScalarOps[k].op) != k) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kScalarOps is in the order of ScalarOp");

bool IsZero(const ir::SymInt& s) { return s.is_constant() && s.constant() == 0; }

// A stride as a factor: "64", "s1", "(s1 - 1)".
std::string Factor(const ir::SymInt& s) {
  std::string text = s.ToString();
  if (s.is_constant() || text.find_first_of(" +-*/%,(") == std::string::npos) return text;
  return absl::StrCat("(", text, ")");
}

std::string SizeList(const std::vector<ir::SymInt>& sizes) {
  std::vector<std::string> parts;
  for (const auto& s : sizes) parts.push_back(s.ToString());
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

// "o0*64 + i0*1 + 0": every term with a nonzero stride, then the offset.
std::string IndexString(const Index& index) {
  std::vector<std::string> terms;
  for (size_t k = 0; k < index.outer_strides.size(); ++k) {
    if (!IsZero(index.outer_strides[k])) {
      terms.push_back(absl::StrCat("o", k, "*", Factor(index.outer_strides[k])));
    }
  }
  for (size_t k = 0; k < index.inner_strides.size(); ++k) {
    if (!IsZero(index.inner_strides[k])) {
      terms.push_back(absl::StrCat("i", k, "*", Factor(index.inner_strides[k])));
    }
  }
  terms.push_back(index.offset.ToString());
  return absl::StrJoin(terms, " + ");
}

// "%3 in 100 step 64, %4 in s0 step 1[ wrapping]": a gather's or
// scatter's index operands (its args from `first` on).
std::string GatherTerms(const Stmt& s, size_t first) {
  std::vector<std::string> terms;
  for (size_t k = first; k < s.args.size() && k - first < s.gather_sizes.size(); ++k) {
    terms.push_back(absl::StrCat("%", s.args[k], " in ", s.gather_sizes[k - first].ToString(),
                                 " step ", s.gather_strides[k - first].ToString()));
  }
  return absl::StrCat(absl::StrJoin(terms, ", "), s.gather_wraps ? " wrapping" : "");
}

const char* ReduceName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kWelfordMean:
      return "welford_mean";
    case ReduceOp::kWelfordM2:
      return "welford_m2";
  }
  return "?";
}

std::string ArgList(const std::vector<int>& args) {
  std::vector<std::string> parts;
  for (int a : args) parts.push_back(absl::StrCat("%", a));
  return absl::StrJoin(parts, ", ");
}

std::string BufferName(const Kernel& kernel, int buffer) {
  if (buffer < 0 || buffer >= static_cast<int>(kernel.buffers.size())) {
    return absl::StrCat("buf", buffer, "(out of range)");
  }
  return absl::StrCat("buf", buffer);
}

}  // namespace

absl::Span<const ScalarOpInfo> ScalarOps() { return kScalarOps; }

const ScalarOpInfo* FindScalarOp(ScalarOp op) {
  const int k = static_cast<int>(op);
  return k >= 0 && k < kScalarOpCount ? &kScalarOps[k] : nullptr;
}

const char* ScalarOpName(ScalarOp op) {
  const ScalarOpInfo* info = FindScalarOp(op);
  return info != nullptr ? info->name : "?";
}

std::optional<ScalarOp> ParseScalarOp(absl::string_view name) {
  for (const ScalarOpInfo& info : kScalarOps) {
    if (name == info.name) return info.op;
  }
  return std::nullopt;
}

std::string PrintKernel(const Kernel& kernel) {
  std::string out =
      absl::StrCat("kernel ", kernel.name, ": outer ", SizeList(kernel.outer), " inner ",
                   SizeList(kernel.inner), " passes ", kernel.passes,
                   kernel.row_groups > 0 ? absl::StrCat(" groups ", kernel.row_groups) : "",
                   kernel.block > 0 ? absl::StrCat(" block ", kernel.block) : "",
                   kernel.reversed ? " reversed" : "", "\n");
  if (!kernel.nodes.empty()) {
    absl::StrAppend(&out, "  nodes: ", absl::StrJoin(kernel.nodes, ", "), "\n");
  }
  absl::StrAppend(&out, "  buffers:\n");
  for (size_t b = 0; b < kernel.buffers.size(); ++b) {
    const KernelBuffer& buf = kernel.buffers[b];
    absl::StrAppend(&out, "    buf", b, " = ", buf.value, " : ", ir::DTypeShortName(buf.dtype),
                    buf.written ? " (written)" : "", "\n");
  }
  for (size_t j = 0; j < kernel.stmts.size(); ++j) {
    const Stmt& s = kernel.stmts[j];
    const std::string where =
        absl::StrCat(" [pass ", s.pass, ", ", s.inner ? "inner" : "outer", "]");
    const std::string type = absl::StrCat(" : ", ir::DTypeShortName(s.dtype));
    absl::StrAppend(&out, "  ");
    switch (s.kind) {
      case StmtKind::kLoad:
        absl::StrAppend(&out, "%", j, " = load ", BufferName(kernel, s.buffer), "[",
                        IndexString(s.index), "]", type, where);
        break;
      case StmtKind::kGather:
        absl::StrAppend(&out, "%", j, " = gather ", BufferName(kernel, s.buffer), "[",
                        IndexString(s.index), "] by ", GatherTerms(s, 0), type, where);
        break;
      case StmtKind::kScatterAdd:
        absl::StrAppend(&out, "scatter_add ", BufferName(kernel, s.buffer), "[",
                        IndexString(s.index), "] by ", GatherTerms(s, 1), " += %",
                        s.args.empty() ? -1 : s.args[0], type, where);
        break;
      case StmtKind::kIndex:
        absl::StrAppend(&out, "%", j, " = index [", IndexString(s.index), "]", type, where);
        break;
      case StmtKind::kConstant:
        absl::StrAppend(&out, "%", j, " = constant ", absl::StrFormat("%.17g", s.constant), type,
                        where);
        break;
      case StmtKind::kOp:
        absl::StrAppend(&out, "%", j, " = ", ScalarOpName(s.op), s.args.empty() ? "" : " ",
                        ArgList(s.args), type, where);
        break;
      case StmtKind::kReduce:
        absl::StrAppend(&out, "%", j, " = reduce ", ReduceName(s.reduce), " ", ArgList(s.args),
                        type, where);
        break;
      case StmtKind::kStore:
        absl::StrAppend(&out, "store ", BufferName(kernel, s.buffer), "[", IndexString(s.index),
                        "] = ", ArgList(s.args), where);
        break;
      case StmtKind::kAccumulate:
        absl::StrAppend(&out, "accumulate ", BufferName(kernel, s.buffer), "[",
                        IndexString(s.index), "] += ", ArgList(s.args), type, where);
        break;
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string KernelCode(const Kernel& kernel) {
  Kernel bare = kernel;
  bare.name.clear();
  bare.nodes.clear();
  for (KernelBuffer& b : bare.buffers) b.value.clear();
  return PrintKernel(bare);
}

}  // namespace kiln::loop
