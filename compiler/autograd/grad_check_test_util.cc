// The gradient checks' harness (grad_check_test_util.h).
#include "compiler/autograd/grad_check_test_util.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/runtime/interpreter.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"
#include "gtest/gtest.h"

namespace kiln::autograd::grad_check_test {

// ---------------------------------------------------------------------------
// Random inputs.

std::mt19937_64& Rng() {
  static std::mt19937_64 rng;
  return rng;
}

int64_t Dim(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(Rng());
}

at::Tensor Randn(at::IntArrayRef sizes) { return at::randn(sizes, at::kDouble); }
at::Tensor Positive(at::IntArrayRef sizes) { return at::rand(sizes, at::kDouble) + 0.5; }
at::Tensor AwayFromZero(at::IntArrayRef sizes) {
  at::Tensor t = Randn(sizes);
  return at::sign(t) * (at::abs(t) + 0.5);
}
at::Tensor Transposed(int64_t a, int64_t b) { return Randn({b, a}).t(); }
at::Tensor Indices(at::IntArrayRef sizes, int64_t n) { return at::randint(n, sizes, at::kLong); }
at::Tensor Mask(at::IntArrayRef sizes) { return at::rand(sizes, at::kDouble) < 0.4; }

// ---------------------------------------------------------------------------
// Graph helpers.

v1::DType DTypeOf(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return v1::FLOAT64;
    case at::kFloat:
      return v1::FLOAT32;
    case at::kHalf:
      return v1::FLOAT16;
    case at::kBFloat16:
      return v1::BFLOAT16;
    case at::kLong:
      return v1::INT64;
    case at::kInt:
      return v1::INT32;
    case at::kBool:
      return v1::BOOL;
    case at::kByte:
      return v1::UINT8;
    default:
      return v1::DTYPE_UNSPECIFIED;
  }
}

ir::TensorMeta MetaOf(const at::Tensor& t, bool requires_grad) {
  ir::TensorMeta m;
  m.dtype = DTypeOf(t.scalar_type());
  for (int64_t s : t.sizes()) m.sizes.push_back(ir::SymInt{s});
  for (int64_t s : t.strides()) m.strides.push_back(ir::SymInt{s});
  m.device_type = "cpu";
  m.requires_grad = requires_grad;
  m.storage_offset = ir::SymInt{t.storage_offset()};
  return m;
}

Argument Str(std::string s) { return Argument{"", std::move(s)}; }
Argument Refs(std::vector<ValueId> vs) { return Argument{"", std::move(vs)}; }
Argument DType(v1::DType d) { return Argument{"", d}; }
Argument Bools(std::vector<bool> b) { return Argument{"", std::move(b)}; }

std::string Describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(std::string(c10::toString(t.scalar_type())), "[",
                      absl::StrJoin(t.sizes(), ","), "] strides [", absl::StrJoin(t.strides(), ","),
                      "]");
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::set<std::string>& Notes() {
  static std::set<std::string> notes;
  return notes;
}

void ExpectNoDeadNodes(const ir::Graph& g) {
  std::vector<bool> used(g.values().size(), false);
  for (ValueId v : g.outputs()) used[v] = true;
  for (const ir::Node& n : g.nodes()) {
    for (ValueId v : ir::Graph::Operands(n)) {
      if (v != ir::kNoValue) used[v] = true;
    }
  }
  for (const ir::Node& n : g.nodes()) {
    bool any = false;
    for (ValueId v : n.outputs) any = any || used[v];
    EXPECT_TRUE(any) << "dead node '" << n.name << "' (" << n.target << ") in the joint graph";
  }
}

void ExpectMetadataMatches(const ir::Graph& g, const std::vector<at::Tensor>& inputs) {
  v1::Graph proto = g.ToProto();
  std::set<std::string> outs(proto.outputs().begin(), proto.outputs().end());
  std::vector<ValueId> order(g.outputs().begin(), g.outputs().end());
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    if (outs.insert(g.value(v).name).second) {
      proto.add_outputs(g.value(v).name);
      order.push_back(v);
    }
  }
  auto all = ir::Graph::FromProto(proto);
  ASSERT_TRUE(all.ok()) << all.status();
  auto values = runtime::RunGraph(*all, inputs);
  ASSERT_TRUE(values.ok()) << values.status();
  for (size_t i = 0; i < order.size(); ++i) {
    const at::Tensor& t = (*values)[i];
    if (!t.defined()) continue;  // a backward op's masked-out output
    const ir::Value& v = g.value(order[i]);
    const std::string where =
        absl::StrCat("value '", v.name, "'",
                     v.producer >= 0 ? absl::StrCat(" of ", g.nodes()[v.producer].target)
                                     : std::string(" (input)"));
    EXPECT_EQ(v.meta.dtype, DTypeOf(t.scalar_type())) << where;
    std::vector<int64_t> sizes;
    bool constant = true;
    for (const ir::SymInt& s : v.meta.sizes) {
      constant = constant && s.is_constant();
      if (s.is_constant()) sizes.push_back(s.constant());
    }
    ASSERT_TRUE(constant) << where;
    EXPECT_EQ(sizes, t.sizes().vec()) << where;
    if (v.meta.strides.size() == v.meta.sizes.size()) {
      std::vector<int64_t> strides;
      for (const ir::SymInt& s : v.meta.strides)
        strides.push_back(s.is_constant() ? s.constant() : -1);
      bool same = true;
      for (size_t d = 0; d < strides.size(); ++d) {
        same = same && (sizes[d] <= 1 || strides[d] == t.strides()[d]);
      }
      if (!same) {
        Notes().insert(absl::StrCat(
            "strides of ",
            where.substr(where.find(" of ") == std::string::npos ? 0 : where.find(" of ") + 4),
            ": metadata [", absl::StrJoin(strides, ","), "], ATen [",
            absl::StrJoin(t.strides(), ","), "] for sizes [", absl::StrJoin(sizes, ","), "]"));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// One-op checks.

In G(at::Tensor t) { return {std::move(t), true}; }
In N(at::Tensor t) { return {std::move(t), false}; }

bool Check(const std::string& target, const std::vector<In>& inputs, std::vector<Argument> args,
           std::vector<Argument> kwargs, const Options& options) {
  std::vector<std::string> shapes;
  for (const In& in : inputs) shapes.push_back(Describe(in.value) + (in.grad ? " grad" : ""));
  SCOPED_TRACE(absl::StrCat(target, " over ", absl::StrJoin(shapes, "; ")));

  ir::GraphBuilder b("fwd");
  for (size_t i = 0; i < inputs.size(); ++i) {
    ValueId id = b.AddInput(MetaOf(inputs[i].value, inputs[i].grad), v1::Placeholder::USER_INPUT,
                            absl::StrCat("x", i));
    EXPECT_EQ(id, static_cast<ValueId>(i));
  }
  auto outs = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args), std::move(kwargs));
  if (!outs.ok()) {
    ADD_FAILURE() << outs.status();
    return true;
  }
  for (ValueId v : *outs) b.AddOutput(v);
  const ir::Graph fwd = std::move(b).Build();

  // libtorch.
  std::vector<at::Tensor> leaves, primals, wrt;
  for (const In& in : inputs) {
    at::Tensor leaf = in.value.detach();
    if (in.grad) {
      leaf.requires_grad_(true);
      wrt.push_back(leaf);
    }
    leaves.push_back(leaf);
    primals.push_back(in.value.detach());
  }
  absl::StatusOr<std::vector<at::Tensor>> ref_out =
      options.reference ? options.reference(leaves) : runtime::RunGraph(fwd, leaves);
  if (absl::IsNotFound(ref_out.status())) {
    // Newer than this libtorch: the joint graph must still build, with
    // gradients shaped like their inputs.
    auto jg = BuildJointGraph(fwd, {});
    if (!jg.ok()) {
      ADD_FAILURE() << jg.status();
      return false;
    }
    ExpectNoDeadNodes(jg->graph);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].grad) {
        EXPECT_EQ(jg->grad_output_index[i], -1) << "input " << i;
      }
      if (jg->grad_output_index[i] < 0) continue;
      const ir::TensorMeta& g = jg->graph.value(jg->graph.outputs()[jg->grad_output_index[i]]).meta;
      const ir::TensorMeta want = MetaOf(inputs[i].value, true);
      EXPECT_EQ(g.sizes, want.sizes) << "gradient of input " << i;
      EXPECT_EQ(g.dtype, want.dtype) << "gradient of input " << i;
    }
    return false;
  }
  if (!ref_out.ok()) {
    ADD_FAILURE() << ref_out.status();
    return true;
  }
  std::vector<bool> receive = options.receive;
  if (receive.empty()) {
    for (const at::Tensor& t : *ref_out) receive.push_back(t.defined() && t.requires_grad());
  }
  // The joint graph's own choice of tangents, for the report.
  auto defaults = BuildJointGraph(fwd, {});
  if (defaults.ok() && options.receive.empty() && defaults->outputs_receive_grad != receive) {
    Notes().insert(absl::StrCat("default outputs_receive_grad of ", target, " is [",
                                absl::StrJoin(defaults->outputs_receive_grad, ","),
                                "], libtorch differentiates [", absl::StrJoin(receive, ","), "]"));
  }

  // Kiln.
  JointOptions jopts;
  jopts.outputs_receive_grad = receive;
  auto jg = BuildJointGraph(fwd, jopts);
  if (!jg.ok()) {
    ADD_FAILURE() << jg.status();
    return true;
  }
  EXPECT_EQ(jg->num_primals, static_cast<int>(inputs.size()));

  // Tangents, laid out as the joint graph's metadata says where that is a
  // dense layout (a transposed output gets a transposed tangent).
  std::vector<at::Tensor> diff_outs, tangents;
  for (size_t j = 0; j < ref_out->size(); ++j) {
    if (!receive[j]) continue;
    const at::Tensor& o = (*ref_out)[j];
    at::Tensor t = at::randn(o.sizes(), o.options().requires_grad(false));
    const size_t input = jg->num_primals + tangents.size();
    if (input < jg->graph.inputs().size()) {
      const ir::TensorMeta& m = jg->graph.value(jg->graph.inputs()[input].value).meta;
      std::vector<int64_t> strides;
      for (const ir::SymInt& s : m.strides) strides.push_back(s.is_constant() ? s.constant() : -1);
      if (strides.size() == static_cast<size_t>(o.dim()) &&
          std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s >= 0; })) {
        at::Tensor laid = at::empty_strided(o.sizes(), strides, t.options());
        if (laid.is_non_overlapping_and_dense()) t = laid.copy_(t);
      }
    }
    diff_outs.push_back(o);
    tangents.push_back(t);
  }
  EXPECT_EQ(jg->num_tangents, static_cast<int>(tangents.size()));
  std::vector<at::Tensor> ref_grads(wrt.size());
  if (!diff_outs.empty() && !wrt.empty()) {
    try {
      ref_grads = torch::autograd::grad(diff_outs, wrt, tangents, /*retain_graph=*/false,
                                        /*create_graph=*/false, /*allow_unused=*/true);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "libtorch's autograd failed: " << FirstLine(e.what());
      return true;
    }
  }
  ExpectNoDeadNodes(jg->graph);
  std::vector<at::Tensor> joint_in = primals;
  joint_in.insert(joint_in.end(), tangents.begin(), tangents.end());
  auto joint_out = runtime::RunGraph(jg->graph, joint_in);
  if (!joint_out.ok()) {
    ADD_FAILURE() << joint_out.status() << "\njoint graph:\n" << jg->graph.ToProto().DebugString();
    return true;
  }
  ExpectMetadataMatches(jg->graph, joint_in);

  if (options.random) {
    options.check_random(joint_in, *joint_out, *jg);
    return true;
  }
  for (size_t j = 0; j < ref_out->size(); ++j) {
    const at::Tensor& want = (*ref_out)[j];
    const at::Tensor& have = (*joint_out)[j];
    if (!want.defined() || !have.defined() || want.numel() == 0) continue;
    EXPECT_TRUE(at::allclose(have, want.detach(), kRtol, kAtol, /*equal_nan=*/true))
        << "forward output " << j;
  }
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].grad) {
      EXPECT_EQ(jg->grad_output_index[i], -1) << "input " << i << " needs no gradient";
      continue;
    }
    const at::Tensor& want = ref_grads[k++];
    const int idx = jg->grad_output_index[i];
    const at::Tensor have = idx >= 0 ? (*joint_out)[idx] : at::Tensor();
    EXPECT_EQ(have.defined(), want.defined()) << "gradient of input " << i << ": kiln "
                                              << Describe(have) << ", libtorch " << Describe(want);
    if (!have.defined() || !want.defined()) continue;
    EXPECT_EQ(have.sizes(), want.sizes()) << "gradient of input " << i;
    EXPECT_EQ(have.scalar_type(), want.scalar_type()) << "gradient of input " << i;
    if (have.sizes() != want.sizes() || have.scalar_type() != want.scalar_type()) continue;
    EXPECT_TRUE(at::allclose(have, want, kRtol, kAtol, /*equal_nan=*/true))
        << "gradient of input " << i << "\nkiln:\n"
        << have << "\nlibtorch:\n"
        << want << "\njoint graph:\n"
        << jg->graph.ToProto().DebugString();
  }
  return true;
}

bool Unary(const std::string& target, std::function<at::Tensor(at::IntArrayRef)> make) {
  const int64_t a = Dim(), b = Dim();
  bool ok = Check(target, {G(make({a, b}))}, {Ref(0)});
  // A non-contiguous input.
  at::Tensor t = make({b, a}).t();
  Check(target, {G(t)}, {Ref(0)});
  Check(target, {G(make({}))}, {Ref(0)});
  return ok;
}

}  // namespace kiln::autograd::grad_check_test
