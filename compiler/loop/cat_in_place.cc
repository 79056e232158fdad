// Pass "cat-in-place" (cat_in_place.h).
#include "compiler/loop/cat_in_place.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/kernel_edit.h"

namespace kiln::loop {
namespace {

using Sizes = google::protobuf::RepeatedPtrField<v1::SymInt>;

std::optional<std::vector<int64_t>> Constants(const Sizes& sizes) {
  std::vector<int64_t> out;
  for (const v1::SymInt& s : sizes) {
    if (s.value_case() != v1::SymInt::kIntValue) return std::nullopt;
    out.push_back(s.int_value());
  }
  return out;
}

int64_t Product(const std::vector<int64_t>& sizes, size_t from = 0) {
  int64_t n = 1;
  for (size_t d = from; d < sizes.size(); ++d) n *= sizes[d];
  return n;
}

// Row-major strides of `sizes` (a dimension of size 1 takes any stride).
bool Contiguous(const std::vector<int64_t>& sizes, const Sizes& strides) {
  if (strides.empty()) return true;
  const std::optional<std::vector<int64_t>> s = Constants(strides);
  if (!s.has_value() || s->size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && (*s)[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// How a kernel's statements use its buffer `b`.
struct BufferUse {
  bool loads = false, stores = false, accumulates = false;
};
BufferUse UseOf(const Kernel& k, int b) {
  BufferUse use;
  for (const Stmt& s : k.stmts) {
    if (s.buffer != b) continue;
    use.loads |= s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather;
    use.stores |= s.kind == StmtKind::kStore;
    use.accumulates |= s.kind == StmtKind::kAccumulate || s.kind == StmtKind::kScatterAdd;
  }
  return use;
}

// The index into the cat's storage of the element `index` addresses in a
// part (contiguous, `row_in` elements from the cat's dimension on), whose
// slice starts `shift` elements into each row of `row_out` elements of the
// cat: the linear index split at the cat's dimension, its row moved to the
// cat's row length. nullopt unless the terms below that split stay within
// one row for every point of the kernel's loops.
std::optional<Index> RemapStore(const Kernel& k, const Stmt& s, int64_t row_in, int64_t row_out,
                                int64_t shift) {
  if (!s.index.offset.is_constant() || s.index.offset.constant() < 0) return std::nullopt;
  Index out = s.index;
  const int64_t offset = s.index.offset.constant();
  int64_t reach = offset % row_in;
  auto term = [&](const ir::SymInt& stride, const ir::SymInt& size, ir::SymInt* moved) {
    if (!stride.is_constant() || !size.is_constant() || stride.constant() < 0) return false;
    const int64_t c = stride.constant();
    if (c % row_in == 0) {
      *moved = ir::SymInt{c / row_in * row_out};
    } else {
      reach += c * std::max<int64_t>(0, size.constant() - 1);
    }
    return true;
  };
  if (s.index.outer_strides.size() > k.outer.size() ||
      s.index.inner_strides.size() > k.inner.size()) {
    return std::nullopt;
  }
  for (size_t d = 0; d < s.index.outer_strides.size(); ++d) {
    if (!term(s.index.outer_strides[d], k.outer[d], &out.outer_strides[d])) return std::nullopt;
  }
  for (size_t d = 0; d < s.index.inner_strides.size(); ++d) {
    const ir::SymInt& stride = s.index.inner_strides[d];
    // An outer-level statement does not move along the sweep.
    if (!s.inner && !(stride.is_constant() && stride.constant() == 0)) return std::nullopt;
    if (!term(stride, k.inner[d], &out.inner_strides[d])) return std::nullopt;
  }
  if (reach >= row_in) return std::nullopt;
  out.offset = ir::SymInt{offset / row_in * row_out + offset % row_in + shift};
  return out;
}

// One buffer for `value` in `k`, its statements renumbered.
void MergeBuffers(Kernel* k, const std::string& value) {
  std::vector<int> renumber(k->buffers.size());
  std::vector<KernelBuffer> kept;
  int first = -1;
  for (size_t j = 0; j < k->buffers.size(); ++j) {
    const KernelBuffer& b = k->buffers[j];
    if (b.value == value && first >= 0) {
      kept[first].written |= b.written;
      renumber[j] = first;
      continue;
    }
    if (b.value == value) first = static_cast<int>(kept.size());
    renumber[j] = static_cast<int>(kept.size());
    kept.push_back(b);
  }
  for (Stmt& s : k->stmts) {
    if (s.buffer >= 0) s.buffer = renumber[s.buffer];
  }
  k->buffers = std::move(kept);
}

// A row-major allocation of `name`, of `meta`'s dtype and device.
v1::PlanStep::Alloc ContiguousAlloc(const std::string& name, const v1::TensorMeta& meta,
                                    const std::vector<int64_t>& sizes) {
  v1::PlanStep::Alloc alloc;
  alloc.set_value(name);
  alloc.set_dtype(meta.dtype());
  std::vector<ir::SymInt> dims;
  for (int64_t n : sizes) dims.push_back(ir::SymInt{n});
  for (const ir::SymInt& s : dims) *alloc.add_sizes() = ir::SymIntToProto(s);
  for (const ir::SymInt& s : kernel_edit::ContiguousStrides(dims)) {
    *alloc.add_strides() = ir::SymIntToProto(s);
  }
  *alloc.mutable_device() = meta.device();
  if (alloc.device().type().empty()) alloc.mutable_device()->set_type("cpu");
  return alloc;
}

struct Part {
  std::string operand;  // what the cat reads: the value, or a view of it
  std::string value;    // the allocation a kernel stores
  std::vector<int64_t> sizes;
};

class CatRewriter {
 public:
  explicit CatRewriter(LoweredGraph* lowered) : lowered_(lowered) {
    for (size_t i = 0; i < lowered->kernels.size(); ++i) {
      kernel_of_[lowered->kernels[i].name] = static_cast<int>(i);
    }
  }

  // Writes the first cat it can in place; false when there is none.
  bool RewriteOne() {
    Scan();
    const v1::ExecutionPlan& plan = lowered_->plan;
    for (int i = 0; i < plan.steps_size(); ++i) {
      const v1::PlanStep& step = plan.steps(i);
      if (step.has_extern_call() && step.extern_call().node().target() == "aten.cat.default" &&
          TryRewrite(i)) {
        return true;
      }
    }
    return false;
  }

 private:
  // Every step's references to plan values.
  void Scan() {
    readers_.clear();
    alloc_.clear();
    view_.clear();
    launches_of_.clear();
    const v1::ExecutionPlan& plan = lowered_->plan;
    for (const std::string& o : plan.outputs()) readers_[o].push_back(-1);
    for (int i = 0; i < plan.steps_size(); ++i) {
      const v1::PlanStep& s = plan.steps(i);
      if (s.has_alloc()) alloc_[s.alloc().value()] = i;
      if (s.has_view()) {
        view_[s.view().value()] = i;
        readers_[s.view().base()].push_back(i);
      }
      if (s.has_launch()) {
        for (const std::string& b : s.launch().buffers()) launches_of_[b].push_back(i);
      }
      if (s.has_extern_call()) {
        for (const std::string& n : ir::OperandNames(s.extern_call().node())) {
          readers_[n].push_back(i);
        }
      }
    }
  }

  const Kernel* KernelOf(const v1::PlanStep& launch) const {
    auto it = kernel_of_.find(launch.launch().symbol());
    return it == kernel_of_.end() ? nullptr : &lowered_->kernels[it->second];
  }

  // The part `operand` of the cat at step `cat`, or nullopt where it is not
  // one a kernel can write in place.
  std::optional<Part> FindPart(const std::string& operand, int cat, v1::DType dtype) const {
    Part part;
    part.operand = operand;
    part.value = operand;
    auto readers = readers_.find(operand);
    if (readers == readers_.end() || readers->second != std::vector<int>{cat}) return std::nullopt;
    if (auto v = view_.find(operand); v != view_.end()) {
      const v1::PlanStep::View& view = lowered_->plan.steps(v->second).view();
      std::optional<std::vector<int64_t>> sizes = Constants(view.sizes());
      const v1::SymInt& offset = view.storage_offset();
      if (!sizes.has_value() || !Contiguous(*sizes, view.strides()) ||
          !(offset.value_case() == v1::SymInt::VALUE_NOT_SET ||
            (offset.value_case() == v1::SymInt::kIntValue && offset.int_value() == 0))) {
        return std::nullopt;
      }
      part.value = view.base();
      part.sizes = *sizes;
      auto base_readers = readers_.find(part.value);
      if (base_readers == readers_.end() || base_readers->second != std::vector<int>{v->second}) {
        return std::nullopt;
      }
    }
    auto a = alloc_.find(part.value);
    if (a == alloc_.end()) return std::nullopt;
    const v1::PlanStep::Alloc& alloc = lowered_->plan.steps(a->second).alloc();
    std::optional<std::vector<int64_t>> sizes = Constants(alloc.sizes());
    if (!sizes.has_value() || !Contiguous(*sizes, alloc.strides()) || alloc.dtype() != dtype) {
      return std::nullopt;
    }
    if (part.sizes.empty() && part.value == operand) part.sizes = *sizes;
    if (Product(part.sizes) != Product(*sizes) || Product(*sizes) == 0) return std::nullopt;
    // One kernel stores it, launched once; no kernel reads it.
    int writers = 0;
    auto launches = launches_of_.find(part.value);
    if (launches == launches_of_.end()) return std::nullopt;
    std::set<int> seen;
    for (int i : launches->second) {
      if (!seen.insert(i).second) continue;
      const v1::PlanStep& launch = lowered_->plan.steps(i);
      const Kernel* k = KernelOf(launch);
      if (k == nullptr || launch.launch().buffers_size() != static_cast<int>(k->buffers.size())) {
        return std::nullopt;
      }
      for (size_t j = 0; j < k->buffers.size(); ++j) {
        if (launch.launch().buffers(static_cast<int>(j)) != part.value) continue;
        if (k->buffers[j].value != part.value) return std::nullopt;
        const BufferUse use = UseOf(*k, static_cast<int>(j));
        if (use.loads || use.accumulates) return std::nullopt;
        writers += use.stores;
      }
    }
    if (writers != 1) return std::nullopt;
    return part;
  }

  bool TryRewrite(int cat) {
    const v1::Node& node = lowered_->plan.steps(cat).extern_call().node();
    if (node.outputs_size() != 1 || node.args_size() < 1 || !node.args(0).has_tensors()) {
      return false;
    }
    const v1::Value& result = node.outputs(0);
    const v1::TensorMeta& meta = result.meta();
    std::optional<std::vector<int64_t>> out_sizes = Constants(meta.sizes());
    if (!out_sizes.has_value() || out_sizes->empty() || !Contiguous(*out_sizes, meta.strides())) {
      return false;
    }
    const int rank = static_cast<int>(out_sizes->size());
    int64_t dim = 0;
    if (node.args_size() > 1 && node.args(1).has_int_value()) dim = node.args(1).int_value();
    for (const v1::Argument& a : node.kwargs()) {
      if (a.name() == "dim" && a.has_int_value()) dim = a.int_value();
    }
    if (dim < 0) dim += rank;
    if (dim < 0 || dim >= rank) return false;

    std::vector<Part> parts;
    std::set<std::string> names;
    int64_t along = 0;
    for (const std::string& operand : node.args(0).tensors().names()) {
      if (operand.empty() || !names.insert(operand).second) return false;
      std::optional<Part> part = FindPart(operand, cat, meta.dtype());
      if (!part.has_value() || static_cast<int>(part->sizes.size()) != rank) return false;
      for (int d = 0; d < rank; ++d) {
        if (d != dim && part->sizes[d] != (*out_sizes)[d]) return false;
      }
      along += part->sizes[dim];
      parts.push_back(*std::move(part));
    }
    if (parts.empty() || along != (*out_sizes)[dim]) return false;

    // Every store into each part, moved to its slice, before anything
    // changes: a store that does not map leaves the cat to ATen.
    const int64_t row_out = Product(*out_sizes, dim);
    const int64_t inner = Product(*out_sizes, dim + 1);
    std::map<std::pair<int, int>, Index> moved;  // (kernel, statement) -> index
    std::set<int> first_steps;
    int64_t at = 0;
    for (const Part& part : parts) {
      const int64_t row_in = Product(part.sizes, dim);
      for (int i : launches_of_[part.value]) {
        first_steps.insert(i);
        const int kernel = kernel_of_.at(lowered_->plan.steps(i).launch().symbol());
        const Kernel& k = lowered_->kernels[kernel];
        for (size_t q = 0; q < k.stmts.size(); ++q) {
          const Stmt& s = k.stmts[q];
          if (s.kind != StmtKind::kStore || k.buffers[s.buffer].value != part.value) continue;
          std::optional<Index> index = RemapStore(k, s, row_in, row_out, at * inner);
          if (!index.has_value()) return false;
          moved[{kernel, static_cast<int>(q)}] = *std::move(index);
        }
      }
      at += part.sizes[dim];
    }

    const std::string out = result.name();  // a copy: the cat's step goes below
    std::set<std::string> values;
    for (const Part& part : parts) values.insert(part.value);
    std::set<std::string> writers;
    for (const auto& [where, index] : moved) {
      Kernel& k = lowered_->kernels[where.first];
      k.stmts[where.second].index = index;
      writers.insert(k.name);
    }
    std::set<int> touched;
    for (int i : first_steps) {
      touched.insert(kernel_of_.at(lowered_->plan.steps(i).launch().symbol()));
    }
    for (int kernel : touched) {
      Kernel& k = lowered_->kernels[kernel];
      for (KernelBuffer& b : k.buffers) {
        if (values.count(b.value)) b.value = out;
      }
      MergeBuffers(&k, out);
    }

    std::set<int> dropped = {cat};
    for (const Part& part : parts) {
      dropped.insert(alloc_.at(part.value));
      if (part.operand != part.value) dropped.insert(view_.at(part.operand));
    }
    RebuildSteps(*first_steps.begin(), ContiguousAlloc(out, meta, *out_sizes), dropped, touched);
    std::vector<std::string> operands;
    for (const Part& part : parts) operands.push_back(part.operand);
    lowered_->decisions.push_back(absl::StrCat("cat in place: ", out, " (",
                                               absl::StrJoin(operands, ", "), ") by ",
                                               absl::StrJoin(writers, ", ")));
    return true;
  }

  // The plan's steps without those in `dropped`, with `alloc` before step
  // `first`, and the buffers of the launches of the kernels in `touched`
  // as those kernels now bind them.
  void RebuildSteps(int first, const v1::PlanStep::Alloc& alloc, const std::set<int>& dropped,
                    const std::set<int>& touched) {
    v1::ExecutionPlan& plan = lowered_->plan;
    google::protobuf::RepeatedPtrField<v1::PlanStep> steps;
    steps.Swap(plan.mutable_steps());
    for (int i = 0; i < steps.size(); ++i) {
      if (i == first) *plan.add_steps()->mutable_alloc() = alloc;
      if (dropped.count(i)) continue;
      v1::PlanStep* step = plan.add_steps();
      *step = std::move(steps[i]);
      if (!step->has_launch()) continue;
      auto k = kernel_of_.find(step->launch().symbol());
      if (k == kernel_of_.end() || !touched.count(k->second)) continue;
      step->mutable_launch()->clear_buffers();
      for (const KernelBuffer& b : lowered_->kernels[k->second].buffers) {
        step->mutable_launch()->add_buffers(b.value);
      }
    }
  }

  LoweredGraph* const lowered_;
  std::map<std::string, int> kernel_of_;
  std::map<std::string, std::vector<int>> readers_;  // step indices; -1: a graph output
  std::map<std::string, int> alloc_, view_;          // value -> the step that defines it
  std::map<std::string, std::vector<int>> launches_of_;
};

}  // namespace

int WriteCatsInPlace(LoweredGraph* lowered) {
  CatRewriter rewriter(lowered);
  int n = 0;
  while (rewriter.RewriteOne()) ++n;
  return n;
}

}  // namespace kiln::loop
