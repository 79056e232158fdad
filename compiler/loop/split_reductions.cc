#include "compiler/loop/split_reductions.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::loop {
namespace {

ir::SymInt Const(int64_t v) { return ir::SymInt{v}; }

// Why `k` cannot be split, or "" when it can.
std::string Illegal(const Kernel& k) {
  if (k.passes != 1) return absl::StrCat(k.passes, " passes");
  if (k.inner.empty()) return "no inner dimensions";
  for (const ir::SymInt& s : k.outer) {
    if (!s.is_constant()) return "symbolic sizes";
  }
  for (const ir::SymInt& s : k.inner) {
    if (!s.is_constant()) return "symbolic sizes";
  }
  bool reduces = false;
  for (const Stmt& s : k.stmts) {
    if (s.kind == StmtKind::kLoad || s.kind == StmtKind::kStore) {
      for (const ir::SymInt& x : s.index.outer_strides) {
        if (!x.is_constant()) return "symbolic strides";
      }
      for (const ir::SymInt& x : s.index.inner_strides) {
        if (!x.is_constant()) return "symbolic strides";
      }
    }
    if (s.kind != StmtKind::kReduce) continue;
    if (s.reduce != ReduceOp::kSum && s.reduce != ReduceOp::kMax && s.reduce != ReduceOp::kMin) {
      return "a Welford reduction";
    }
    reduces = true;
  }
  if (!reduces) return "no reduction";
  // The epilogue may read reductions and per-row values, never a value of
  // the sweep itself.
  for (const Stmt& s : k.stmts) {
    if (s.inner) continue;
    for (int a : s.args) {
      if (k.stmts[a].inner && k.stmts[a].kind != StmtKind::kReduce) {
        return "an epilogue that reads the sweep";
      }
    }
  }
  return "";
}

// How many slices to cut a first inner dimension of `n` into: the smallest
// divisor of `n` that is at least `want` and at most `most`, else the
// largest divisor up to `most`; 0 or 1 when there is none.
int64_t Slices(int64_t n, int64_t want, int64_t most) {
  for (int64_t d = std::max<int64_t>(want, 2); d <= std::min(n, most); ++d) {
    if (n % d == 0) return d;
  }
  for (int64_t d = std::min({want, most, n}); d >= 2; --d) {
    if (n % d == 0) return d;
  }
  return 0;
}

std::vector<ir::SymInt> ContiguousStrides(const std::vector<ir::SymInt>& sizes) {
  std::vector<ir::SymInt> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = Const(stride);
    stride *= sizes[d].constant();
  }
  return strides;
}

int64_t Product(const std::vector<ir::SymInt>& sizes) {
  int64_t n = 1;
  for (const ir::SymInt& s : sizes) n *= s.constant();
  return n;
}

// Which statements `keep` needs: those it names and, transitively, their
// arguments.
std::vector<bool> Needed(const Kernel& k, std::vector<bool> keep) {
  for (size_t j = k.stmts.size(); j-- > 0;) {
    if (!keep[j]) continue;
    for (int a : k.stmts[j].args) keep[a] = true;
  }
  return keep;
}

void MarkWritten(Kernel* k) {
  for (KernelBuffer& b : k->buffers) b.written = false;
  for (const Stmt& s : k->stmts) {
    if (s.kind == StmtKind::kStore) k->buffers[s.buffer].written = true;
  }
}

struct Split {
  Kernel partial;
  Kernel finish;
  std::vector<KernelBuffer> partials;  // one per reduction, [slices, outer...]
  std::vector<ir::SymInt> partial_sizes;
};

// `k` as two kernels over `slices` slices of its first inner dimension.
Split SplitKernel(const Kernel& k, int64_t slices) {
  Split out;
  const int64_t slice = k.inner[0].constant() / slices;
  out.partial_sizes = k.outer;
  out.partial_sizes.insert(out.partial_sizes.begin(), Const(slices));
  const std::vector<ir::SymInt> partial_strides = ContiguousStrides(out.partial_sizes);
  const int first_partial = static_cast<int>(k.buffers.size());

  // The partial kernel: the sweep over one slice, with the slice as its
  // first outer dimension, and each reduction stored per slice and row.
  Kernel& a = out.partial;
  a.name = absl::StrCat(k.name, "_partial");
  a.outer = out.partial_sizes;
  a.inner = k.inner;
  a.inner[0] = Const(slice);
  a.passes = 1;
  a.nodes = k.nodes;
  a.buffers = k.buffers;
  std::vector<bool> keep(k.stmts.size(), false);
  for (size_t j = 0; j < k.stmts.size(); ++j) keep[j] = k.stmts[j].inner;
  keep = Needed(k, keep);
  std::vector<int> at(k.stmts.size(), -1);
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    if (!keep[j]) continue;
    Stmt s = k.stmts[j];
    for (int& arg : s.args) arg = at[arg];
    if (s.kind == StmtKind::kLoad || s.kind == StmtKind::kStore) {
      const int64_t step = s.index.inner_strides.empty() ? 0 : s.index.inner_strides[0].constant();
      s.index.outer_strides.insert(s.index.outer_strides.begin(), Const(step * slice));
    }
    at[j] = static_cast<int>(a.stmts.size());
    a.stmts.push_back(std::move(s));
    if (k.stmts[j].kind != StmtKind::kReduce) continue;
    KernelBuffer buffer{absl::StrCat(k.name, "_partial", out.partials.size()), k.stmts[j].dtype,
                        true};
    Stmt store;
    store.kind = StmtKind::kStore;
    store.pass = 0;
    store.inner = false;
    store.dtype = k.stmts[j].dtype;
    store.args = {at[j]};
    store.buffer = first_partial + static_cast<int>(out.partials.size());
    store.index.outer_strides = partial_strides;
    store.index.inner_strides.assign(a.inner.size(), Const(0));
    a.stmts.push_back(std::move(store));
    out.partials.push_back(std::move(buffer));
  }
  a.buffers.insert(a.buffers.end(), out.partials.begin(), out.partials.end());
  MarkWritten(&a);

  // The finishing kernel: each row reduces its partials, then runs the
  // epilogue as before.
  Kernel& b = out.finish;
  b.name = k.name;
  b.outer = k.outer;
  b.inner = {Const(slices)};
  b.passes = 1;
  b.nodes = k.nodes;
  b.buffers = a.buffers;
  std::vector<bool> epilogue(k.stmts.size(), false);
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    epilogue[j] = !k.stmts[j].inner && k.stmts[j].kind == StmtKind::kStore;
  }
  epilogue = Needed(k, epilogue);
  std::fill(at.begin(), at.end(), -1);
  int reduction = 0;
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    const Stmt& s = k.stmts[j];
    if (s.kind == StmtKind::kReduce) {
      Stmt load;
      load.kind = StmtKind::kLoad;
      load.pass = 0;
      load.inner = true;
      load.dtype = s.dtype;
      load.buffer = first_partial + reduction++;
      load.index.outer_strides.assign(partial_strides.begin() + 1, partial_strides.end());
      load.index.inner_strides = {partial_strides[0]};
      b.stmts.push_back(std::move(load));
      Stmt r = s;
      r.args = {static_cast<int>(b.stmts.size()) - 1};
      at[j] = static_cast<int>(b.stmts.size());
      b.stmts.push_back(std::move(r));
      continue;
    }
    if (s.inner || !epilogue[j]) continue;
    Stmt e = s;
    for (int& arg : e.args) arg = at[arg];
    if (e.kind == StmtKind::kLoad || e.kind == StmtKind::kStore) {
      e.index.inner_strides = {Const(0)};
    }
    at[j] = static_cast<int>(b.stmts.size());
    b.stmts.push_back(std::move(e));
  }
  MarkWritten(&b);
  return out;
}

std::string Sizes(const std::vector<ir::SymInt>& sizes) {
  return absl::StrCat(
      "[",
      absl::StrJoin(sizes, ", ",
                    [](std::string* o, const ir::SymInt& s) { absl::StrAppend(o, s.ToString()); }),
      "]");
}

// Replaces the launch of `split.finish.name` in `plan` by: the partials'
// allocations, the partial kernel's launch, the finishing launch, the
// partials' frees.
void RewritePlan(const Split& split, v1::ExecutionPlan* plan) {
  v1::Device device;
  device.set_type("cuda");
  for (const v1::PlanStep& s : plan->steps()) {
    if (s.has_alloc()) {
      device = s.alloc().device();
      break;
    }
  }
  google::protobuf::RepeatedPtrField<v1::PlanStep> steps;
  for (v1::PlanStep& s : *plan->mutable_steps()) {
    if (!s.has_launch() || s.launch().symbol() != split.finish.name) {
      *steps.Add() = std::move(s);
      continue;
    }
    const std::vector<ir::SymInt> strides = ContiguousStrides(split.partial_sizes);
    for (const KernelBuffer& p : split.partials) {
      v1::PlanStep::Alloc* alloc = steps.Add()->mutable_alloc();
      alloc->set_value(p.value);
      alloc->set_dtype(p.dtype);
      for (const ir::SymInt& d : split.partial_sizes) *alloc->add_sizes() = ir::SymIntToProto(d);
      for (const ir::SymInt& d : strides) *alloc->add_strides() = ir::SymIntToProto(d);
      *alloc->mutable_device() = device;
    }
    v1::PlanStep::Launch* first = steps.Add()->mutable_launch();
    first->set_module(s.launch().module());
    first->set_symbol(split.partial.name);
    for (const KernelBuffer& b : split.partial.buffers) first->add_buffers(b.value);
    v1::PlanStep::Launch* second = steps.Add()->mutable_launch();
    second->set_module(s.launch().module());
    second->set_symbol(split.finish.name);
    for (const KernelBuffer& b : split.finish.buffers) second->add_buffers(b.value);
    for (const KernelBuffer& p : split.partials) steps.Add()->mutable_free()->set_value(p.value);
  }
  *plan->mutable_steps() = std::move(steps);
}

}  // namespace

void SplitReductions(const SplitPolicy& policy, LoweredGraph* lowered) {
  std::vector<Kernel> kernels;
  for (Kernel& k : lowered->kernels) {
    const std::optional<int64_t> blocks = policy.blocks(k);
    bool reduces = false;
    for (const Stmt& s : k.stmts) reduces = reduces || s.kind == StmtKind::kReduce;
    if (!reduces || !blocks || *blocks >= policy.split_below) {
      kernels.push_back(std::move(k));
      continue;
    }
    std::string why = Illegal(k);
    int64_t slices = 0;
    if (why.empty()) {
      const int64_t want = (policy.min_blocks + *blocks - 1) / *blocks;
      const int64_t most = Product(k.inner) / std::max<int64_t>(policy.min_slice, 1);
      slices = Slices(k.inner[0].constant(), std::min(want, most), most);
      if (slices < 2) {
        why = absl::StrCat("rows of ", Product(k.inner), " elements make fewer than 2 slices of ",
                           policy.min_slice, " or more that divide their first dimension");
      }
    }
    if (!why.empty()) {
      lowered->decisions.push_back(
          absl::StrCat("no split: ", k.name, " launches ", *blocks, " blocks: ", why));
      kernels.push_back(std::move(k));
      continue;
    }
    Split split = SplitKernel(k, slices);
    lowered->decisions.push_back(absl::StrCat(
        "split: ", k.name, " (", *blocks, " blocks) reduces ", slices, " slices of each row in ",
        split.partial.name, ", outer ", Sizes(split.partial.outer), " inner ",
        Sizes(split.partial.inner), ", then the slices in ", k.name));
    RewritePlan(split, &lowered->plan);
    lowered->plan.set_kernels(lowered->plan.kernels() + 1);
    kernels.push_back(std::move(split.partial));
    kernels.push_back(std::move(split.finish));
  }
  lowered->kernels = std::move(kernels);
}

}  // namespace kiln::loop
