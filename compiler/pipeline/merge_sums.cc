#include "compiler/pipeline/merge_sums.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/dead_code.h"
#include "compiler/ops/registry.h"

namespace kiln::pipeline {
namespace {

constexpr char kSum[] = "aten.sum.dim_IntList";
constexpr char kMul[] = "aten.mul.Tensor";
constexpr char kMulScalar[] = "aten.mul.Scalar";
constexpr char kNeg[] = "aten.neg.default";
constexpr char kView[] = "aten.view.default";
// Factors followed per sum; a longer product is left as it is.
constexpr int kMaxFactors = 16;
// Sums of sums followed per sum.
constexpr int kMaxSteps = 4;

bool IsOne(const ir::SymInt& s) { return s.is_constant() && s.constant() == 1; }

// Whether a factor of dtype `factor` multiplies into `product` exactly as
// the product's own dtype would: the same, or a narrower floating type
// (a bfloat16 weight in a float32 batch norm's backward).
bool WidensTo(v1::DType factor, v1::DType product) {
  if (factor == product) return true;
  const bool half = factor == v1::FLOAT16 || factor == v1::BFLOAT16;
  return (product == v1::FLOAT32 && half) ||
         (product == v1::FLOAT64 && (half || factor == v1::FLOAT32));
}

// A sum, as the product it reduces: sum(scale * prod(variant) *
// prod(constant), dims), where the constant factors have size 1 along the
// reduced dims.
struct Form {
  size_t node = 0;                    // the sum (the outer one of two steps)
  int64_t rank = 0;                   // of the product, the dims' frame
  std::vector<int64_t> dims;          // reduced, sorted
  std::vector<ir::ValueId> variant;   // sorted, repeats kept
  std::vector<ir::ValueId> constant;  // in the order found
  double scale = 1.0;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;

  // Sums of the same form up to constant factors and scale.
  auto Key() const { return std::make_tuple(rank, dims, variant, static_cast<int>(dtype)); }
};

class Analyzer {
 public:
  explicit Analyzer(const ir::Graph& g) : g_(g) {}

  // The form of sum node `i`, or nullopt when it is not one this pass
  // merges.
  std::optional<Form> Describe(size_t i) const {
    const ir::Node& n = g_.nodes()[i];
    std::optional<Sum> s = BindSum(n);
    if (!s || !s->dtype_none) return std::nullopt;
    Form f;
    f.node = i;
    f.dtype = g_.value(n.outputs[0]).meta.dtype;
    ir::ValueId x = s->self;
    std::set<int64_t> dims(s->dims.begin(), s->dims.end());
    // A sum of a sum that kept its dims: one sum over both sets (a few
    // steps at most: every sum of a chain of them would walk it).
    for (int step = 0; step < kMaxSteps; ++step) {
      const ir::Node* p = Producer(x);
      if (p == nullptr) break;
      std::optional<Sum> inner = BindSum(*p);
      if (!inner || !inner->dtype_none || !inner->keepdim || p->outputs.size() != 1) break;
      dims.insert(inner->dims.begin(), inner->dims.end());
      x = inner->self;
    }
    const ir::TensorMeta& xm = g_.value(x).meta;
    if (xm.dtype != f.dtype) return std::nullopt;
    f.rank = static_cast<int64_t>(xm.sizes.size());
    f.dims.assign(dims.begin(), dims.end());
    int count = 0;
    if (!Walk(x, &f, &count)) return std::nullopt;
    // The merged sum is of the varying factors alone: one of them must be
    // of the sum's dtype for it to be summed in that dtype.
    if (std::none_of(f.variant.begin(), f.variant.end(),
                     [&](ir::ValueId v) { return g_.value(v).meta.dtype == f.dtype; })) {
      return std::nullopt;
    }
    // Every reduced dim runs along some varying factor: one along which
    // only constant factors broadcast would make the sum a multiple.
    for (int64_t d : f.dims) {
      bool covered = false;
      for (ir::ValueId v : f.variant) covered = covered || !IsOne(Aligned(v, d, f.rank));
      if (!covered) return std::nullopt;
    }
    std::sort(f.variant.begin(), f.variant.end());
    return f;
  }

 private:
  struct Sum {
    ir::ValueId self = ir::kNoValue;
    std::vector<int64_t> dims;  // normalized to [0, rank)
    bool keepdim = false;
    bool dtype_none = true;
  };

  const ir::Node* Producer(ir::ValueId v) const {
    const int32_t p = g_.value(v).producer;
    return p < 0 ? nullptr : &g_.nodes()[p];
  }

  std::optional<ops::OpCall> Bind(const ir::Node& n) const {
    absl::StatusOr<ops::OpCall> call = ops::OpCall::Bind(
        n.target, n.args, n.kwargs,
        [this](ir::ValueId v) -> const ir::TensorMeta& { return g_.value(v).meta; });
    if (!call.ok()) return std::nullopt;
    return *std::move(call);
  }

  std::optional<Sum> BindSum(const ir::Node& n) const {
    if (n.target != kSum || n.outputs.size() != 1) return std::nullopt;
    std::optional<ops::OpCall> call = Bind(n);
    if (!call) return std::nullopt;
    Sum s;
    absl::StatusOr<ir::ValueId> self = call->Tensor("self");
    absl::StatusOr<bool> keepdim = call->Bool("keepdim");
    if (!self.ok() || !keepdim.ok()) return std::nullopt;
    s.self = *self;
    s.keepdim = *keepdim;
    s.dtype_none = call->IsNone("dtype");
    const int64_t rank = static_cast<int64_t>(g_.value(s.self).meta.sizes.size());
    if (call->IsNone("dim")) {
      for (int64_t d = 0; d < rank; ++d) s.dims.push_back(d);
    } else {
      absl::StatusOr<std::vector<int64_t>> dims = call->Ints("dim");
      if (!dims.ok() || dims->empty()) return std::nullopt;  // dim=[]: every dim
      for (int64_t d : *dims) {
        if (d < -rank || d >= rank) return std::nullopt;
        s.dims.push_back(d < 0 ? d + rank : d);
      }
    }
    return s;
  }

  // v's size along dim `d` of a `rank`-dim frame it broadcasts into.
  const ir::SymInt& Aligned(ir::ValueId v, int64_t d, int64_t rank) const {
    static const ir::SymInt kOne{int64_t{1}};
    const ir::TensorMeta& m = g_.value(v).meta;
    const int64_t at = d - (rank - static_cast<int64_t>(m.sizes.size()));
    return at < 0 ? kOne : m.sizes[at];
  }

  // Adds the factors of `v` to `f`; false when the product cannot be
  // followed (another dtype, a longer product).
  bool Walk(ir::ValueId v, Form* f, int* count) const {
    if (++*count > kMaxFactors) return false;
    const ir::TensorMeta& m = g_.value(v).meta;
    if (!WidensTo(m.dtype, f->dtype) || static_cast<int64_t>(m.sizes.size()) > f->rank) {
      return false;
    }
    const ir::Node* p = Producer(v);
    if (p != nullptr && p->outputs.size() == 1 && m.dtype == f->dtype &&
        (p->target == kMul || p->target == kMulScalar || p->target == kNeg)) {
      std::optional<ops::OpCall> call = Bind(*p);
      if (!call) return false;
      absl::StatusOr<ir::ValueId> self = call->Tensor("self");
      if (!self.ok()) return false;
      if (p->target == kNeg) {
        f->scale = -f->scale;
        return Walk(*self, f, count);
      }
      absl::StatusOr<ir::ValueId> other = call->Tensor("other");
      if (other.ok()) return Walk(*self, f, count) && Walk(*other, f, count);
      absl::StatusOr<double> scalar = call->Double("other");
      if (!scalar.ok()) return false;
      f->scale *= *scalar;
      return Walk(*self, f, count);
    }
    bool varies = false;
    for (int64_t d : f->dims) varies = varies || !IsOne(Aligned(v, d, f->rank));
    (varies ? f->variant : f->constant).push_back(v);
    return true;
  }

  const ir::Graph& g_;
};

class Rewriter {
 public:
  explicit Rewriter(const ir::Graph& g) : g_(g), b_(g.name()), map_(b_.CopyInputs(g)) {}

  absl::StatusOr<int> Run(const std::vector<std::vector<Form>>& groups, ir::Graph* out) {
    std::map<size_t, std::pair<int, const Form*>> member;  // node -> (group, form)
    int replaced = 0;
    for (size_t k = 0; k < groups.size(); ++k) {
      for (const Form& f : groups[k]) member[f.node] = {static_cast<int>(k), &f};
      replaced += static_cast<int>(groups[k].size());
    }
    std::vector<ir::ValueId> merged(groups.size(), ir::kNoValue);
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      const ir::Node& n = g_.nodes()[i];
      auto it = member.find(i);
      if (it == member.end()) {
        b_.CopyNode(g_, n, &map_);
        continue;
      }
      const auto& [group, form] = it->second;
      if (merged[group] == ir::kNoValue) {
        ASSIGN_OR_RETURN(merged[group], MergedSum(*form));
      }
      ASSIGN_OR_RETURN(map_[n.outputs[0]], Member(*form, merged[group], n));
    }
    for (ir::ValueId id : g_.outputs()) b_.AddOutput(map_[id]);
    ir::Graph rewritten = std::move(b_).Build();
    ir::EliminateDeadCode(&rewritten);
    *out = std::move(rewritten);  // the last use of `g_`, which may be *out
    return replaced;
  }

 private:
  absl::StatusOr<ir::ValueId> Add(const std::string& target, std::vector<ir::Argument> args,
                                  const std::string& name) {
    ASSIGN_OR_RETURN(std::vector<ir::ValueId> out, ops::Emit(b_, ops::DefaultRegistry(), target,
                                                             std::move(args), {}, name, {name}));
    if (out.size() != 1) return absl::InternalError(absl::StrCat(target, ": not one output"));
    return out[0];
  }

  // R = sum(prod(variant), dims, keepdim=True), in the variant product's
  // own rank.
  absl::StatusOr<ir::ValueId> MergedSum(const Form& f) {
    const std::string name = g_.nodes()[f.node].name + "_merged";
    ir::ValueId p = map_[f.variant[0]];
    for (size_t k = 1; k < f.variant.size(); ++k) {
      ASSIGN_OR_RETURN(p, Add(kMul, {ir::Ref(p), ir::Ref(map_[f.variant[k]])},
                              absl::StrCat(name, "_factor", k)));
    }
    const int64_t rank = static_cast<int64_t>(b_.value(p).meta.sizes.size());
    std::vector<int64_t> dims;
    for (int64_t d : f.dims) dims.push_back(d - (f.rank - rank));
    return Add(kSum, {ir::Ref(p), ir::Ints(dims), ir::Bool(true)}, name);
  }

  // Sum node `n` (form `f`) from the merged sum `r`: times its constant
  // factors and scale, viewed as n's result.
  absl::StatusOr<ir::ValueId> Member(const Form& f, ir::ValueId r, const ir::Node& n) {
    const ir::Value& old = g_.value(n.outputs[0]);
    ir::ValueId v = r;
    for (size_t k = 0; k < f.constant.size(); ++k) {
      ASSIGN_OR_RETURN(v, Add(kMul, {ir::Ref(v), ir::Ref(map_[f.constant[k]])},
                              absl::StrCat(n.name, "_times", k)));
    }
    if (f.scale != 1.0) {
      ASSIGN_OR_RETURN(v,
                       Add(kMulScalar, {ir::Ref(v), ir::Positional(f.scale)}, n.name + "_scaled"));
    }
    // The same elements in old's shape: sizes equal once the 1s are gone.
    auto without_ones = [](const std::vector<ir::SymInt>& sizes) {
      std::vector<ir::SymInt> kept;
      for (const ir::SymInt& s : sizes) {
        if (!IsOne(s)) kept.push_back(s);
      }
      return kept;
    };
    if (without_ones(b_.value(v).meta.sizes) != without_ones(old.meta.sizes)) {
      return absl::InternalError(absl::StrCat(
          "node '", n.name, "': the merged sum's shape does not give ", "its result's"));
    }
    if (b_.value(v).meta.sizes == old.meta.sizes) return v;
    return Add(kView, {ir::Ref(v), ir::Positional(old.meta.sizes)}, n.name);
  }

  const ir::Graph& g_;
  ir::GraphBuilder b_;
  std::vector<ir::ValueId> map_;
};

}  // namespace

absl::StatusOr<int> MergeEquivalentSums(const ir::Graph& graph, ir::Graph* out) {
  const Analyzer analyzer(graph);
  std::map<decltype(Form().Key()), std::vector<Form>> by_key;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    std::optional<Form> f = analyzer.Describe(i);
    if (f) by_key[f->Key()].push_back(*std::move(f));
  }
  std::vector<std::vector<Form>> groups;
  for (auto& [key, forms] : by_key) {
    if (forms.size() > 1) groups.push_back(std::move(forms));
  }
  if (groups.empty()) return 0;
  return Rewriter(graph).Run(groups, out);
}

}  // namespace kiln::pipeline
