#include "compiler/pipeline/conv_layouts.h"

#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::pipeline {
namespace {

constexpr char kConvolution[] = "aten.convolution.default";
constexpr char kClone[] = "aten.clone.default";

bool Is16Bit(v1::DType d) { return d == v1::FLOAT16 || d == v1::BFLOAT16; }

// What a convolution bound as `call`, its output `out`, needs copied
// channels-last to run so (the header's list): nothing (not one of those,
// or both operands channels-last already), its weight (its input is), or
// both.
enum class Copies { kNone, kWeight, kInputAndWeight };

Copies ToCopy(const ops::OpCall& call, const ir::TensorMeta& out) {
  absl::StatusOr<const ir::TensorMeta*> input = call.Meta("input");
  absl::StatusOr<const ir::TensorMeta*> weight = call.Meta("weight");
  absl::StatusOr<int64_t> groups = call.Int("groups");
  if (!input.ok() || !weight.ok() || !groups.ok() || *groups != 1) return Copies::kNone;
  const ir::TensorMeta& in = **input;
  if (in.device_type != "cuda" || in.sizes.size() != 4 || out.sizes.size() != 4 ||
      !Is16Bit(in.dtype) || ops::IsChannelsLast(**weight)) {
    return Copies::kNone;
  }
  for (size_t d = 1; d < 4; ++d) {
    if (!in.sizes[d].is_constant() || !out.sizes[d].is_constant()) return Copies::kNone;
  }
  if (out.sizes[1].constant() <= 1 || out.sizes[2].constant() * out.sizes[3].constant() <= 1) {
    return Copies::kNone;
  }
  return ops::IsChannelsLast(in) ? Copies::kWeight : Copies::kInputAndWeight;
}

class Rewriter {
 public:
  explicit Rewriter(const ir::Graph& g) : g_(g), b_(g.name()), map_(b_.CopyInputs(g)) {}

  absl::StatusOr<int> Run(ir::Graph* out) {
    for (const ir::Node& n : g_.nodes()) {
      if (n.target == kConvolution && n.outputs.size() == 1) {
        std::vector<ir::Argument> args = ir::MapArguments(n.args, map_),
                                  kwargs = ir::MapArguments(n.kwargs, map_);
        absl::StatusOr<ops::OpCall> call = ops::OpCall::Bind(n.target, args, kwargs, MetaOfNew());
        const Copies copies =
            call.ok() ? ToCopy(*call, g_.value(n.outputs[0]).meta) : Copies::kNone;
        if (copies != Copies::kNone) {
          RETURN_IF_ERROR(AddChannelsLast(n, copies == Copies::kInputAndWeight, std::move(args),
                                          std::move(kwargs)));
          ++rewritten_;
          continue;
        }
      }
      if (ReadsChanged(n)) {
        RETURN_IF_ERROR(Rederive(n));
      } else {
        b_.CopyNode(g_, n, &map_);
      }
    }
    if (rewritten_ == 0) return 0;
    for (ir::ValueId id : g_.outputs()) {
      ASSIGN_OR_RETURN(const ir::ValueId v, InOldLayout(id));
      b_.AddOutput(v);
    }
    *out = std::move(b_).Build();  // the last use of `g_`, which may be *out
    return rewritten_;
  }

 private:
  std::function<const ir::TensorMeta&(ir::ValueId)> MetaOfNew() const {
    return [this](ir::ValueId v) -> const ir::TensorMeta& { return b_.value(v).meta; };
  }

  // Whether an operand of `n` has other strides in the new graph.
  bool ReadsChanged(const ir::Node& n) const {
    for (ir::ValueId v : ir::Graph::Operands(n)) {
      if (v != ir::kNoValue && b_.value(map_[v]).meta.strides != g_.value(v).meta.strides) {
        return true;
      }
    }
    return false;
  }

  // Adds `target` over the new graph's `args`. The outputs' metadata is
  // that of the old graph's values `like` with the strides the registry
  // infers, or, for a node new to the graph (`like` empty), as inferred.
  absl::StatusOr<std::vector<ir::ValueId>> Add(const std::string& target,
                                               std::vector<ir::Argument> args,
                                               std::vector<ir::Argument> kwargs,
                                               const std::vector<ir::ValueId>& like,
                                               std::string name, std::vector<std::string> names) {
    ASSIGN_OR_RETURN(std::vector<ir::TensorMeta> metas,
                     ops::InferMetas(ops::DefaultRegistry(), target, args, kwargs, MetaOfNew()));
    if (!like.empty() && metas.size() != like.size()) {
      return absl::InternalError(absl::StrCat("node '", name, "': ", metas.size(),
                                              " outputs inferred, ", like.size(), " in the graph"));
    }
    for (size_t k = 0; k < like.size(); ++k) {
      ir::TensorMeta m = g_.value(like[k]).meta;
      m.strides = std::move(metas[k].strides);
      metas[k] = std::move(m);
    }
    return b_.AddNode(target, std::move(args), std::move(kwargs), std::move(metas), std::move(name),
                      std::move(names));
  }

  std::vector<std::string> OutputNames(const ir::Node& n) const {
    std::vector<std::string> names;
    for (ir::ValueId v : n.outputs) names.push_back(g_.value(v).name);
    return names;
  }

  // `n` again over operands whose layout changed.
  absl::Status Rederive(const ir::Node& n) {
    // _unsafe_view's rule gives contiguous strides where no view exists;
    // it follows fresh (contiguous) results only.
    if (n.target == "aten._unsafe_view.default") {
      return absl::FailedPreconditionError(
          absl::StrCat("node '", n.name, "': _unsafe_view of a value whose layout changed"));
    }
    std::vector<ir::Argument> args = ir::MapArguments(n.args, map_);
    std::vector<ir::Argument> kwargs = ir::MapArguments(n.kwargs, map_);
    if (ReadsContiguousInput(n.target)) RETURN_IF_ERROR(InputContiguous(n, args, kwargs));
    ASSIGN_OR_RETURN(
        std::vector<ir::ValueId> outs,
        Add(n.target, std::move(args), std::move(kwargs), n.outputs, n.name, OutputNames(n)));
    for (size_t k = 0; k < outs.size(); ++k) map_[n.outputs[k]] = outs[k];
    return absl::OkStatus();
  }

  // ATen's CUDA kernels that refuse an input that is not contiguous: the
  // composite op in front of them (group_norm) made it so, and in the graph
  // as traced it was already; a channels-last one would fail as it runs.
  static bool ReadsContiguousInput(const std::string& target) {
    return target == "aten.native_group_norm.default";
  }

  // The input of `n` (its first operand, or the one named "input") copied
  // contiguous where its new layout is not.
  absl::Status InputContiguous(const ir::Node& n, std::vector<ir::Argument>& args,
                               std::vector<ir::Argument>& kwargs) {
    ir::ValueId* input = args.empty() ? nullptr : std::get_if<ir::ValueId>(&args[0].kind);
    for (ir::Argument& a : kwargs) {
      if (a.name == "input") input = std::get_if<ir::ValueId>(&a.kind);
    }
    if (input == nullptr || ops::IsContiguous(b_.value(*input).meta)) return absl::OkStatus();
    ASSIGN_OR_RETURN(*input, Copy(*input, v1::CONTIGUOUS_FORMAT, ir::kNoValue,
                                  absl::StrCat(n.name, "_input_contiguous"),
                                  b_.value(*input).name + "_contiguous"));
    return absl::OkStatus();
  }

  // A copy of the new graph's `v` in `format`: node `name`, value
  // `value_name`, with the old graph's value `like`'s metadata (but its
  // strides) where `like` is one.
  absl::StatusOr<ir::ValueId> Copy(ir::ValueId v, v1::MemoryFormat format, ir::ValueId like,
                                   std::string name, std::string value_name) {
    ASSIGN_OR_RETURN(
        std::vector<ir::ValueId> copy,
        Add(kClone, {ir::Positional(v)}, {ir::Argument{"memory_format", format}},
            like == ir::kNoValue ? std::vector<ir::ValueId>{} : std::vector<ir::ValueId>{like},
            std::move(name), {std::move(value_name)}));
    return copy[0];
  }

  // The convolution `n`, over the new graph's `args` and `kwargs`, with a
  // channels-last copy of its weight, and of its input where `input`.
  absl::Status AddChannelsLast(const ir::Node& n, bool input, std::vector<ir::Argument> args,
                               std::vector<ir::Argument> kwargs) {
    // The input and the weight are the first two operands, positional or
    // not.
    ir::ValueId* operands[2] = {nullptr, nullptr};
    int seen = 0;
    for (std::vector<ir::Argument>* list : {&args, &kwargs}) {
      for (ir::Argument& a : *list) {
        auto* v = std::get_if<ir::ValueId>(&a.kind);
        if (v == nullptr) continue;
        const int k = a.name.empty() ? seen++ : a.name == "input" ? 0 : a.name == "weight" ? 1 : -1;
        if (k == 0 || k == 1) operands[k] = v;
      }
    }
    const char* const roles[2] = {"input", "weight"};
    for (int k = input ? 0 : 1; k < 2; ++k) {
      if (operands[k] == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("node '", n.name, "': no ", roles[k], " operand"));
      }
      const ir::ValueId v = *operands[k];
      ASSIGN_OR_RETURN(*operands[k], Copy(v, v1::CHANNELS_LAST, ir::kNoValue,
                                          absl::StrCat(n.name, "_", roles[k], "_nhwc"),
                                          b_.value(v).name + "_nhwc"));
    }
    ASSIGN_OR_RETURN(
        std::vector<ir::ValueId> outs,
        Add(n.target, std::move(args), std::move(kwargs), n.outputs, n.name, OutputNames(n)));
    if (!ops::IsChannelsLast(b_.value(outs[0]).meta)) {
      return absl::InternalError(
          absl::StrCat("node '", n.name, "': a channels-last weight gave no channels-last output"));
    }
    map_[n.outputs[0]] = outs[0];
    return absl::OkStatus();
  }

  // Graph output `id` in the layout the caller was promised: a contiguous
  // copy where it changed from contiguous.
  absl::StatusOr<ir::ValueId> InOldLayout(ir::ValueId id) {
    const ir::Value& old = g_.value(id);
    const ir::ValueId now = map_[id];
    if (b_.value(now).meta.strides == old.meta.strides) return now;
    if (!ops::IsContiguous(old.meta)) {
      return absl::FailedPreconditionError(
          absl::StrCat("graph output '", old.name, "' would change its layout"));
    }
    return Copy(now, v1::CONTIGUOUS_FORMAT, id, old.name + "_contiguous", old.name + "_contiguous");
  }

  const ir::Graph& g_;
  ir::GraphBuilder b_;
  std::vector<ir::ValueId> map_;
  int rewritten_ = 0;
};

}  // namespace

absl::StatusOr<int> ChannelsLastConvolutions(const ir::Graph& graph, ir::Graph* out) {
  return Rewriter(graph).Run(out);
}

}  // namespace kiln::pipeline
