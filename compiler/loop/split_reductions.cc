#include "compiler/loop/split_reductions.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/loop/kernel_edit.h"

namespace kiln::loop {
namespace {

using kernel_edit::Append;
using kernel_edit::Const;
using kernel_edit::ContiguousStrides;
using kernel_edit::MarkWritten;
using kernel_edit::Needed;
using kernel_edit::Product;

// Why `k` cannot be split, or "" when it can.
std::string Illegal(const Kernel& k) {
  if (k.inner.empty()) return "no inner dimensions";
  if (k.row_groups > 0) return "row groups (sums across rows)";
  if (kernel_edit::HasGather(k)) return "a gather";
  for (const ir::SymInt& s : k.outer) {
    if (!s.is_constant()) return "symbolic sizes";
    if (s.constant() <= 0) return "an empty space";
  }
  for (const ir::SymInt& s : k.inner) {
    if (!s.is_constant()) return "symbolic sizes";
    if (s.constant() <= 0) return "an empty space";
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
    if (s.pass > 0 && !s.inner) return "statements after a later pass's sweep";
    if (s.kind != StmtKind::kReduce) continue;
    if (s.pass > 0) return "reductions in a later pass";
    reduces = true;
  }
  if (!reduces) return "no reduction";
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    const Stmt& s = k.stmts[j];
    if (s.kind != StmtKind::kReduce || s.reduce != ReduceOp::kWelfordM2) continue;
    bool mean = false;
    for (size_t q = 0; q < j; ++q) {
      const Stmt& t = k.stmts[q];
      mean = mean || (t.kind == StmtKind::kReduce && t.reduce == ReduceOp::kWelfordMean &&
                      t.args == s.args);
    }
    if (!mean) return "a Welford M2 without its mean";
  }
  for (const Stmt& s : k.stmts) {
    for (int a : s.args) {
      const Stmt& arg = k.stmts[a];
      // The epilogue reads reductions and per-row values, never a value of
      // the sweep itself; a later pass reads the first pass's per-row values.
      if (!s.inner && arg.inner && arg.kind != StmtKind::kReduce) {
        return "an epilogue that reads the sweep";
      }
      if (s.pass > 0 && arg.pass == 0 && arg.inner && arg.kind != StmtKind::kReduce) {
        return "a later pass that reads the first pass's sweep";
      }
    }
  }
  return "";
}

// The largest divisor of `n` from 2 to `limit`; 0 when there is none.
int64_t DivisorUpTo(int64_t n, int64_t limit) {
  for (int64_t d = std::min(limit, n); d >= 2; --d) {
    if (n % d == 0) return d;
  }
  return 0;
}

// How many slices to cut a first inner dimension of `n` into: the smallest
// divisor of `n` that is at least `want` and at most `most` (and 4 * want),
// else the largest divisor up to `want`; 0 or 1 when there is none.
int64_t Slices(int64_t n, int64_t want, int64_t most) {
  // Upwards no further than 4 * want: the search stays short for a huge
  // dimension of few divisors (a prime), whatever the request.
  for (int64_t d = std::max<int64_t>(want, 2); d <= std::min({n, most, 4 * want}); ++d) {
    if (n % d == 0) return d;
  }
  return DivisorUpTo(n, std::min(want, most));
}

bool IsWelford(const Stmt& s) {
  return s.kind == StmtKind::kReduce &&
         (s.reduce == ReduceOp::kWelfordMean || s.reduce == ReduceOp::kWelfordM2);
}

struct Split {
  Kernel partial;
  Kernel finish;
  Kernel apply;                        // later passes; empty name when there are none
  std::vector<KernelBuffer> partials;  // one per reduction, [slices, outer...]
  std::vector<ir::SymInt> partial_sizes;
  std::vector<KernelBuffer> rows;  // per-row values later passes read, [outer...]
};

Stmt Access(StmtKind kind, bool inner, v1::DType dtype, int buffer, std::vector<ir::SymInt> outer,
            std::vector<ir::SymInt> inner_strides) {
  Stmt s;
  s.kind = kind;
  s.inner = inner;
  s.dtype = dtype;
  s.buffer = buffer;
  s.index.outer_strides = std::move(outer);
  s.index.inner_strides = std::move(inner_strides);
  return s;
}

Stmt Constant(double value, v1::DType dtype, int pass) {
  Stmt s;
  s.kind = StmtKind::kConstant;
  s.pass = pass;
  s.inner = false;
  s.dtype = dtype;
  s.constant = value;
  return s;
}

Stmt Op(ScalarOp op, std::vector<int> args, v1::DType dtype, int pass, bool inner) {
  Stmt s;
  s.kind = StmtKind::kOp;
  s.op = op;
  s.args = std::move(args);
  s.dtype = dtype;
  s.pass = pass;
  s.inner = inner;
  return s;
}

// `k` over `slices` slices of its first inner dimension, as a partial
// kernel (each slice's reductions), a finishing kernel (the slices'
// reductions, then the first pass's epilogue) and, for a kernel of several
// passes, a pointwise kernel that runs the later passes over the whole
// space with the per-row values the finishing kernel stored.
Split SplitKernel(const Kernel& k, int64_t slices,
                  const std::function<std::string(const std::string&)>& fresh) {
  Split out;
  const int64_t slice = k.inner[0].constant() / slices;
  const int64_t per_slice = Product(k.inner) / slices;  // elements each partial reduced
  out.partial_sizes = k.outer;
  out.partial_sizes.insert(out.partial_sizes.begin(), Const(slices));
  const std::vector<ir::SymInt> partial_strides = ContiguousStrides(out.partial_sizes);
  const std::vector<ir::SymInt> row_strides = ContiguousStrides(k.outer);
  const int first_partial = static_cast<int>(k.buffers.size());
  int n_reductions = 0;
  bool welford = false;
  for (const Stmt& s : k.stmts) {
    n_reductions += s.kind == StmtKind::kReduce;
    welford = welford || IsWelford(s);
  }
  // The first pass's values that later passes read: stored per row.
  std::vector<int> row_of(k.stmts.size(), -1);
  for (const Stmt& s : k.stmts) {
    if (s.pass == 0) continue;
    for (int a : s.args) {
      if (k.stmts[a].pass != 0 || row_of[a] >= 0) continue;
      row_of[a] = static_cast<int>(out.rows.size());
      out.rows.push_back(KernelBuffer{fresh(absl::StrCat(k.name, "_row", out.rows.size())),
                                      k.stmts[a].dtype, true});
    }
  }
  const int first_row = first_partial + n_reductions;
  std::vector<KernelBuffer> buffers = k.buffers;

  // The partial kernel: the first pass's sweep over one slice, with the
  // slice as its first outer dimension, and each reduction stored per
  // slice and row.
  Kernel& a = out.partial;
  a.name = absl::StrCat(k.name, "_partial");
  a.outer = out.partial_sizes;
  a.inner = k.inner;
  a.inner[0] = Const(slice);
  a.passes = 1;
  a.nodes = k.nodes;
  std::vector<bool> keep(k.stmts.size(), false);
  for (size_t j = 0; j < k.stmts.size(); ++j) keep[j] = k.stmts[j].inner && k.stmts[j].pass == 0;
  keep = Needed(k, keep);
  std::vector<int> at(k.stmts.size(), -1);
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    if (!keep[j]) continue;
    Stmt s = k.stmts[j];
    for (int& arg : s.args) arg = at[arg];
    if (s.kind == StmtKind::kLoad || s.kind == StmtKind::kStore) {
      // Statements after the sweep read no inner index: the slice does not
      // move them.
      const int64_t step =
          !s.inner || s.index.inner_strides.empty() ? 0 : s.index.inner_strides[0].constant();
      s.index.outer_strides.insert(s.index.outer_strides.begin(), Const(step * slice));
    }
    at[j] = Append(&a, std::move(s));
    if (k.stmts[j].kind != StmtKind::kReduce) continue;
    const int buffer = first_partial + static_cast<int>(out.partials.size());
    out.partials.push_back(KernelBuffer{
        fresh(absl::StrCat(k.name, "_partial", out.partials.size())), k.stmts[j].dtype, true});
    Stmt store = Access(StmtKind::kStore, false, k.stmts[j].dtype, buffer, partial_strides,
                        std::vector<ir::SymInt>(a.inner.size(), Const(0)));
    store.args = {at[j]};
    Append(&a, std::move(store));
  }
  buffers.insert(buffers.end(), out.partials.begin(), out.partials.end());
  buffers.insert(buffers.end(), out.rows.begin(), out.rows.end());

  // The finishing kernel: each row reduces its partials (Welford's by
  // Chan's formula for equal counts: the mean of the means, and the sum of
  // the M2s plus count * the squared deviations of the means, in a second
  // pass), then runs the first pass's epilogue and stores what later passes
  // read.
  Kernel& b = out.finish;
  b.name = k.name;
  b.outer = k.outer;
  b.inner = {Const(slices)};
  b.passes = welford ? 2 : 1;
  b.nodes = k.nodes;
  const int epilogue_pass = welford ? 1 : 0;
  std::vector<bool> epilogue(k.stmts.size(), false);
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    const Stmt& s = k.stmts[j];
    epilogue[j] = s.pass == 0 && ((!s.inner && s.kind == StmtKind::kStore) || row_of[j] >= 0);
  }
  epilogue = Needed(k, epilogue);
  std::fill(at.begin(), at.end(), -1);
  // Reductions in k's order, numbered as their partial buffers are.
  std::vector<int> reductions;
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    if (k.stmts[j].kind == StmtKind::kReduce) reductions.push_back(static_cast<int>(j));
  }
  auto load_partial = [&](int r, int pass, v1::DType dtype) {
    Stmt load = Access(StmtKind::kLoad, true, dtype, first_partial + r,
                       std::vector<ir::SymInt>(partial_strides.begin() + 1, partial_strides.end()),
                       {partial_strides[0]});
    load.pass = pass;
    return Append(&b, std::move(load));
  };
  // Pass 0: every partial reduced; Welford's means divided by the count.
  std::vector<int> reduced(reductions.size());
  std::map<int, int> mean_partial;  // a Welford input of k -> its mean's partial
  for (size_t r = 0; r < reductions.size(); ++r) {
    const Stmt& s = k.stmts[reductions[r]];
    Stmt sum = s;
    sum.args = {load_partial(static_cast<int>(r), 0, s.dtype)};
    if (IsWelford(s)) sum.reduce = ReduceOp::kSum;
    reduced[r] = Append(&b, std::move(sum));
    at[reductions[r]] = reduced[r];
    if (s.reduce == ReduceOp::kWelfordMean) {
      const int n = Append(&b, Constant(static_cast<double>(slices), s.dtype, 0));
      at[reductions[r]] = Append(&b, Op(ScalarOp::kDiv, {reduced[r], n}, s.dtype, 0, false));
      mean_partial[s.args[0]] = static_cast<int>(r);
    }
  }
  // Pass 1: each M2 is the sum of the slices' M2s plus the count times the
  // squared deviations of the slices' means from the row's.
  for (size_t r = 0; r < reductions.size(); ++r) {
    const Stmt& s = k.stmts[reductions[r]];
    if (s.reduce != ReduceOp::kWelfordM2) continue;
    const int partial_mean = mean_partial.at(s.args[0]);
    const int mean = at[reductions[partial_mean]];
    const int m = load_partial(partial_mean, 1, s.dtype);
    const int dev = Append(&b, Op(ScalarOp::kSub, {m, mean}, s.dtype, 1, true));
    const int sq = Append(&b, Op(ScalarOp::kMul, {dev, dev}, s.dtype, 1, true));
    Stmt spread = s;
    spread.pass = 1;
    spread.reduce = ReduceOp::kSum;
    spread.args = {sq};
    const int spread_sum = Append(&b, std::move(spread));
    const int count = Append(&b, Constant(static_cast<double>(per_slice), s.dtype, 1));
    const int scaled = Append(&b, Op(ScalarOp::kMul, {spread_sum, count}, s.dtype, 1, false));
    at[reductions[r]] = Append(&b, Op(ScalarOp::kAdd, {reduced[r], scaled}, s.dtype, 1, false));
  }
  // The epilogue, after the last pass.
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    const Stmt& s = k.stmts[j];
    if (s.pass != 0 || s.inner || !epilogue[j]) continue;
    Stmt e = s;
    e.pass = epilogue_pass;
    for (int& arg : e.args) arg = at[arg];
    if (e.kind == StmtKind::kLoad || e.kind == StmtKind::kStore) e.index.inner_strides = {Const(0)};
    at[j] = Append(&b, std::move(e));
  }
  // Per-row values for later passes.
  for (size_t j = 0; j < k.stmts.size(); ++j) {
    if (row_of[j] < 0) continue;
    Stmt store = Access(StmtKind::kStore, false, k.stmts[j].dtype, first_row + row_of[j],
                        row_strides, {Const(0)});
    store.pass = epilogue_pass;
    store.args = {at[j]};
    Append(&b, std::move(store));
  }

  // The later passes, as one pointwise sweep of the whole space that reads
  // the per-row values.
  if (k.passes > 1) {
    Kernel& c = out.apply;
    c.name = absl::StrCat(k.name, "_apply");
    c.outer = k.outer;
    c.inner = k.inner;
    c.passes = 1;
    c.nodes = k.nodes;
    std::fill(at.begin(), at.end(), -1);
    for (size_t j = 0; j < k.stmts.size(); ++j) {
      if (row_of[j] >= 0) {
        at[j] = Append(&c, Access(StmtKind::kLoad, true, k.stmts[j].dtype, first_row + row_of[j],
                                  row_strides, std::vector<ir::SymInt>(k.inner.size(), Const(0))));
      }
      if (k.stmts[j].pass == 0) continue;
      Stmt t = k.stmts[j];
      t.pass = 0;
      for (int& arg : t.args) arg = at[arg];
      at[j] = Append(&c, std::move(t));
    }
    c.buffers = buffers;
    MarkWritten(&c);
  }
  a.buffers = buffers;
  b.buffers = buffers;
  MarkWritten(&a);
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
// allocations, the partial kernel's launch and the finishing launch (the
// memory plan, which runs next, frees the partials).
void RewritePlan(const Split& split, v1::ExecutionPlan* plan) {
  // The new buffers live where the kernel's own do: the device of a buffer
  // the plan allocates or takes as an input.
  std::set<std::string> own;
  for (const KernelBuffer& b : split.finish.buffers) own.insert(b.value);
  v1::Device device;
  device.set_type("cuda");
  bool found = false;
  for (const v1::PlanStep& s : plan->steps()) {
    if (s.has_alloc() && own.count(s.alloc().value()) > 0) {
      device = s.alloc().device();
      found = true;
      break;
    }
  }
  for (int i = 0; !found && i < plan->inputs_size(); ++i) {
    if (own.count(plan->inputs(i).value().name()) > 0) {
      device = plan->inputs(i).value().meta().device();
      found = true;
    }
  }
  google::protobuf::RepeatedPtrField<v1::PlanStep> steps;
  for (v1::PlanStep& s : *plan->mutable_steps()) {
    if (!s.has_launch() || s.launch().symbol() != split.finish.name) {
      *steps.Add() = std::move(s);
      continue;
    }
    auto allocate = [&](const std::vector<KernelBuffer>& buffers,
                        const std::vector<ir::SymInt>& sizes) {
      const std::vector<ir::SymInt> strides = ContiguousStrides(sizes);
      for (const KernelBuffer& p : buffers) {
        v1::PlanStep::Alloc* alloc = steps.Add()->mutable_alloc();
        alloc->set_value(p.value);
        alloc->set_dtype(p.dtype);
        for (const ir::SymInt& d : sizes) *alloc->add_sizes() = ir::SymIntToProto(d);
        for (const ir::SymInt& d : strides) *alloc->add_strides() = ir::SymIntToProto(d);
        *alloc->mutable_device() = device;
      }
    };
    allocate(split.partials, split.partial_sizes);
    allocate(split.rows, split.finish.outer);
    auto launch = [&](const Kernel& k) {
      v1::PlanStep::Launch* l = steps.Add()->mutable_launch();
      l->set_module(s.launch().module());
      l->set_symbol(k.name);
      for (const KernelBuffer& b : k.buffers) l->add_buffers(b.value);
    };
    launch(split.partial);
    launch(split.finish);
    if (!split.apply.name.empty()) launch(split.apply);
  }
  *plan->mutable_steps() = std::move(steps);
}

// Every value name the plan uses.
std::set<std::string> PlanNames(const v1::ExecutionPlan& plan) {
  std::set<std::string> names;
  for (const v1::Placeholder& p : plan.inputs()) names.insert(p.value().name());
  for (const v1::PlanStep& s : plan.steps()) {
    if (s.has_alloc()) names.insert(s.alloc().value());
    if (s.has_view()) names.insert(s.view().value());
    if (s.has_launch()) names.insert(s.launch().buffers().begin(), s.launch().buffers().end());
    if (s.has_extern_call()) {
      for (const v1::Value& o : s.extern_call().node().outputs()) names.insert(o.name());
    }
  }
  for (const std::string& o : plan.outputs()) names.insert(o);
  return names;
}

}  // namespace

void SplitReductions(const SplitPolicy& policy, LoweredGraph* lowered) {
  std::set<std::string> taken = PlanNames(lowered->plan);
  // A name no plan value has: `base`, or `base` with a suffix.
  auto fresh = [&taken](const std::string& base) {
    std::string name = base;
    for (int n = 1; taken.count(name) > 0; ++n) name = absl::StrCat(base, "_", n);
    taken.insert(name);
    return name;
  };
  std::vector<Kernel> kernels;
  for (Kernel& k : lowered->kernels) {
    const std::optional<int64_t> blocks = policy.blocks(k);
    bool reduces = false;
    for (const Stmt& s : k.stmts) reduces = reduces || s.kind == StmtKind::kReduce;
    if (!reduces || !blocks || *blocks <= 0 || *blocks >= policy.split_below) {
      kernels.push_back(std::move(k));
      continue;
    }
    std::string why = Illegal(k);
    int64_t slices = 0;
    if (why.empty()) {
      const int64_t want = (policy.min_blocks + *blocks - 1) / *blocks;
      const int64_t min_slice = policy.min_slice_of ? policy.min_slice_of(k) : policy.min_slice;
      const int64_t most = Product(k.inner) / std::max<int64_t>(min_slice, 1);
      slices = Slices(k.inner[0].constant(), std::min(want, most), most);
      if (policy.fewer_slices_of && policy.fewer_slices_of(k)) {
        const int64_t below = DivisorUpTo(k.inner[0].constant(), std::min(want, most));
        // Fewer slices only where they still launch nine tenths of
        // min_blocks: a row split short of that leaves SMs a block alone.
        if (below >= 2 && below < slices && below * *blocks * 10 >= policy.min_blocks * 9) {
          slices = below;
        }
      }
      if (slices < 2) {
        why = absl::StrCat("rows of ", Product(k.inner), " elements make fewer than 2 slices of ",
                           min_slice, " or more that divide their first dimension");
      }
    }
    if (!why.empty()) {
      lowered->decisions.push_back(
          absl::StrCat("no split: ", k.name, " launches ", *blocks, " blocks: ", why));
      kernels.push_back(std::move(k));
      continue;
    }
    Split split = SplitKernel(k, slices, fresh);
    const bool apply = !split.apply.name.empty();
    lowered->decisions.push_back(absl::StrCat(
        "split: ", k.name, " (", *blocks, " blocks) reduces ", slices, " slices of each row in ",
        split.partial.name, ", outer ", Sizes(split.partial.outer), " inner ",
        Sizes(split.partial.inner), ", then the slices in ", k.name,
        apply ? absl::StrCat(", then its later passes over the whole space in ", split.apply.name)
              : ""));
    RewritePlan(split, &lowered->plan);
    lowered->plan.set_kernels(lowered->plan.kernels() + (apply ? 2 : 1));
    kernels.push_back(std::move(split.partial));
    kernels.push_back(std::move(split.finish));
    if (apply) kernels.push_back(std::move(split.apply));
  }
  lowered->kernels = std::move(kernels);
}

}  // namespace kiln::loop
