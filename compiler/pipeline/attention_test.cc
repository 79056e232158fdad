#include "compiler/pipeline/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cache/shape_family.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/service.pb.h"

namespace kiln::pipeline {
namespace {

using ir::Argument;
using ir::ValueId;

Argument Arg(Argument::Kind kind) { return Argument{"", std::move(kind)}; }

struct Spelling {
  std::vector<int64_t> batch = {2, 4};  // [B, H], or [B] for rank 3
  int64_t l = 16, s = 24, d = 64, dv = 64;
  v1::DType dtype = v1::BFLOAT16;
  std::string device = "cuda";
  bool clone = true;        // Dynamo's clone after each expand
  bool scores_out = false;  // the scores are a graph output too
  bool multiply = false;    // mul.Scalar instead of div.Scalar
  bool requires_grad = false;
};

class Attention {
 public:
  explicit Attention(const Spelling& sp) : sp_(sp), b_("attention") {
    q_ = Input("q", Dims(sp.l, sp.d));
    k_ = Input("k", Dims(sp.s, sp.d));
    v_ = Input("v", Dims(sp.s, sp.dv));
    int64_t bh = 1;
    for (int64_t x : sp.batch) bh *= x;
    const int rank = static_cast<int>(sp.batch.size()) + 2;
    std::vector<int64_t> swap =
        rank == 4 ? std::vector<int64_t>{0, 1, 3, 2} : std::vector<int64_t>{0, 2, 1};
    const ValueId kt = Op("aten.permute.default", {Arg(k_), Arg(swap)});
    const ValueId q3 = Batched(q_, Dims(sp.l, sp.d), {bh, sp.l, sp.d});
    const ValueId k3 = Batched(kt, Dims(sp.d, sp.s), {bh, sp.d, sp.s});
    const ValueId s3 = Op("aten.bmm.default", {Arg(q3), Arg(k3)});
    scores_ = Op("aten.view.default", {Arg(s3), Arg(Dims(sp.l, sp.s))});
    const ValueId scaled = Op(sp.multiply ? "aten.mul.Scalar" : "aten.div.Scalar",
                              {Arg(scores_), Arg(sp.multiply ? 0.125 : 8.0)});
    const ValueId p = Op("aten._softmax.default", {Arg(scaled), Arg(int64_t{-1}), Arg(false)});
    const ValueId pe = Op("aten.expand.default", {Arg(p), Arg(Dims(sp.l, sp.s))});
    const ValueId p3 =
        Op("aten.view.default", {Arg(pe), Arg(std::vector<int64_t>{bh, sp.l, sp.s})});
    const ValueId v3 = Batched(v_, Dims(sp.s, sp.dv), {bh, sp.s, sp.dv});
    const ValueId o3 = Op("aten.bmm.default", {Arg(p3), Arg(v3)});
    out_ = Op("aten.view.default", {Arg(o3), Arg(Dims(sp.l, sp.dv))});
    b_.AddOutput(out_);
    if (sp.scores_out) b_.AddOutput(scores_);
    out_meta_ = b_.value(out_).meta;
  }

  ir::Graph Build() && { return std::move(b_).Build(); }
  const ir::TensorMeta& out_meta() const { return out_meta_; }

 private:
  std::vector<int64_t> Dims(int64_t rows, int64_t cols) const {
    std::vector<int64_t> d = sp_.batch;
    d.push_back(rows);
    d.push_back(cols);
    return d;
  }
  ValueId Input(const std::string& name, const std::vector<int64_t>& sizes) {
    ir::TensorMeta m = ir::ContiguousMeta(sizes, sp_.dtype);
    m.device_type = sp_.device;
    m.device_index = sp_.device == "cuda" ? 0 : -1;
    m.requires_grad = sp_.requires_grad;
    return b_.AddInput(m, v1::Placeholder::USER_INPUT, name);
  }
  ValueId Op(const std::string& target, std::vector<Argument> args) {
    auto out = ops::Emit(b_, ops::DefaultRegistry(), target, std::move(args));
    EXPECT_TRUE(out.ok()) << target << ": " << out.status();
    return out.ok() ? (*out)[0] : ir::kNoValue;
  }
  // Dynamo's spelling of a matmul operand: expand, clone, view to 3-D.
  ValueId Batched(ValueId x, const std::vector<int64_t>& sizes, std::vector<int64_t> three) {
    ValueId e = Op("aten.expand.default", {Arg(x), Arg(sizes)});
    if (sp_.clone) e = Op("aten.clone.default", {Arg(e)});
    return Op("aten.view.default", {Arg(e), Arg(std::move(three))});
  }

  Spelling sp_;
  ir::GraphBuilder b_;
  ValueId q_, k_, v_, scores_, out_;
  ir::TensorMeta out_meta_;
};

std::vector<std::string> Targets(const ir::Graph& g) {
  std::vector<std::string> t;
  for (const ir::Node& n : g.nodes()) t.push_back(n.target);
  return t;
}

int Count(const std::vector<std::string>& targets, const std::string& t) {
  return static_cast<int>(std::count(targets.begin(), targets.end(), t));
}

constexpr char kEfficient[] = "aten._scaled_dot_product_efficient_attention.default";
constexpr char kSdpa[] = "aten.scaled_dot_product_attention.default";
constexpr char kFlash[] = "aten._flash_attention_forward.default";

int Fused(const std::vector<std::string>& targets) {
  return Count(targets, kEfficient) + Count(targets, kSdpa);
}

TEST(AttentionRewriteTest, HeadsBecomeOneFusedKernelAndACopyWhereLayoutsDiffer) {
  for (bool flash : {true, false}) {
    for (v1::DType dtype : {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16}) {
      for (bool multiply : {false, true}) {
        SCOPED_TRACE(v1::DType_Name(dtype) + (multiply ? " mul" : " div") +
                     (flash ? " flash" : ""));
        Spelling sp;
        sp.dtype = dtype;
        sp.multiply = multiply;
        Attention a(sp);
        const ir::TensorMeta want = a.out_meta();
        ir::Graph g = std::move(a).Build();
        auto fused = RewriteAttention(g, &g, {flash});
        ASSERT_TRUE(fused.ok()) << fused.status();
        EXPECT_EQ(*fused, 1);
        const std::vector<std::string> t = Targets(g);
        const bool want_sdpa = flash && dtype != v1::FLOAT32;
        EXPECT_EQ(Count(t, kSdpa), want_sdpa ? 1 : 0);
        EXPECT_EQ(Count(t, kEfficient), want_sdpa ? 0 : 1);
        EXPECT_EQ(Count(t, "aten.bmm.default"), 0);
        EXPECT_EQ(Count(t, "aten._softmax.default"), 0);
        // The composite writes q's layout, which is out's here.
        EXPECT_EQ(Count(t, "aten.clone.default"), want_sdpa ? 0 : 1);
        ASSERT_EQ(g.outputs().size(), 1u);
        const ir::TensorMeta& got = g.value(g.outputs()[0]).meta;
        EXPECT_EQ(got.sizes, want.sizes);
        EXPECT_EQ(got.strides, want.strides);
        EXPECT_EQ(got.dtype, want.dtype);
        for (const ir::Node& n : g.nodes()) {
          if (n.target != kSdpa && n.target != kEfficient) continue;
          ASSERT_EQ(n.kwargs.size(), 1u);
          EXPECT_EQ(n.kwargs[0].name, "scale");
          EXPECT_DOUBLE_EQ(std::get<double>(n.kwargs[0].kind), 0.125);
          // The composite: [B, H, L, Dv] laid out as q is (contiguous); the
          // other: [B, H, L, Dv] laid out as [B, L, H, Dv].
          const ir::TensorMeta& m = g.value(n.outputs[0]).meta;
          const std::vector<int64_t> sizes = {2, 4, 16, 64};
          const std::vector<int64_t> strides = want_sdpa ? std::vector<int64_t>{4096, 1024, 64, 1}
                                                         : std::vector<int64_t>{4096, 64, 256, 1};
          for (int d = 0; d < 4; ++d) {
            EXPECT_EQ(m.sizes[d].constant(), sizes[d]) << d;
            EXPECT_EQ(m.strides[d].constant(), strides[d]) << d;
          }
        }
      }
    }
  }
}

TEST(AttentionRewriteTest, ThreeDimensionalAttentionGoesThroughOneHead) {
  Spelling sp;
  sp.batch = {3};
  sp.clone = false;
  sp.dtype = v1::FLOAT32;
  Attention a(sp);
  const ir::TensorMeta want = a.out_meta();
  ir::Graph g = std::move(a).Build();
  auto fused = RewriteAttention(g, &g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(*fused, 1);
  const std::vector<std::string> t = Targets(g);
  EXPECT_EQ(Fused(t), 1);
  EXPECT_EQ(Count(t, "aten.unsqueeze.default"), 3);
  EXPECT_EQ(Count(t, "aten.bmm.default"), 0);
  EXPECT_EQ(Count(t, "aten.clone.default"), 0);  // contiguous already
  EXPECT_EQ(g.value(g.outputs()[0]).meta.sizes, want.sizes);
  EXPECT_EQ(g.value(g.outputs()[0]).meta.strides, want.strides);
}

TEST(AttentionRewriteTest, WhatTheKernelCannotComputeIsLeftAlone) {
  struct Case {
    std::string what;
    Spelling sp;
  };
  std::vector<Case> cases;
  cases.push_back({"cpu tensors", {}});
  cases.back().sp.device = "cpu";
  cases.push_back({"a head dim of 12", {}});
  cases.back().sp.d = 12;
  cases.push_back({"a value head dim over 256", {}});
  cases.back().sp.dv = 264;
  cases.push_back({"float64", {}});
  cases.back().sp.dtype = v1::FLOAT64;
  cases.push_back({"the scores read elsewhere", {}});
  cases.back().sp.scores_out = true;
  // Memory-efficient attention's kernel for heads over 128 is slower than
  // the matmuls.
  cases.push_back({"float32 heads of 192", {}});
  cases.back().sp.dtype = v1::FLOAT32;
  cases.back().sp.d = cases.back().sp.dv = 192;
  cases.push_back({"bfloat16 heads of 192 and 128 (no composite)", {}});
  cases.back().sp.dtype = v1::BFLOAT16;
  cases.back().sp.d = 192;
  cases.back().sp.dv = 128;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ir::Graph g = Attention(c.sp).Build();
    const size_t nodes = g.nodes().size();
    auto fused = RewriteAttention(g, &g);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(*fused, 0);
    EXPECT_EQ(g.nodes().size(), nodes);
    EXPECT_EQ(Fused(Targets(g)), 0);
  }
}

// 16-bit inference with equal head dims over 128 still gets the composite,
// whose kernels (cuDNN's, flash attention) take heads up to 256.
TEST(AttentionRewriteTest, WideSixteenBitHeadsGetTheCompositeInInference) {
  Spelling sp;
  sp.dtype = v1::BFLOAT16;
  sp.d = sp.dv = 192;
  ir::Graph g = Attention(sp).Build();
  auto fused = RewriteAttention(g, &g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(*fused, 1);
  EXPECT_EQ(Count(Targets(g), kSdpa), 1);
}

// In 16-bit training, flash attention where the target has it and
// memory-efficient attention (with its log-sum-exp) where it does not; the
// joint graph differentiates either with ATen's backward of the fused
// kernel, and the scores are never materialized in either direction.
// float32 training keeps the matmuls.
TEST(AttentionRewriteTest, TrainingGraphsGetTheFusedKernelAndItsBackward) {
  {
    Spelling sp;
    sp.dtype = v1::FLOAT32;
    sp.requires_grad = true;
    AttentionOptions options;
    options.training = true;
    ir::Graph g = Attention(sp).Build();
    auto fused = RewriteAttention(g, &g, options);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(*fused, 0) << "float32 training";
  }
  for (bool flash : {true, false}) {
    SCOPED_TRACE(flash ? "flash" : "no flash");
    Spelling sp;
    sp.dtype = v1::BFLOAT16;
    sp.requires_grad = true;
    AttentionOptions options;
    options.training = true;
    options.flash = flash;
    {  // heads over 128 wide stay matmuls in training
      Spelling wide = sp;
      wide.d = wide.dv = 192;
      ir::Graph g = Attention(wide).Build();
      auto fused = RewriteAttention(g, &g, options);
      ASSERT_TRUE(fused.ok()) << fused.status();
      EXPECT_EQ(*fused, 0);
    }
    ir::Graph g = Attention(sp).Build();
    auto fused = RewriteAttention(g, &g, options);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(*fused, 1);
    const std::vector<std::string> targets = Targets(g);
    EXPECT_EQ(Count(targets, kEfficient), flash ? 0 : 1);
    EXPECT_EQ(Count(targets, kFlash), flash ? 1 : 0);
    EXPECT_EQ(Count(targets, kSdpa), 0);
    for (const ir::Node& n : g.nodes()) {
      if (n.target != kEfficient) continue;
      EXPECT_EQ(std::get<bool>(n.args[4].kind), true) << "compute_log_sumexp";
    }
    absl::StatusOr<autograd::JointGraph> joint = autograd::BuildJointGraph(g, {});
    ASSERT_TRUE(joint.ok()) << joint.status();
    const std::vector<std::string> all = Targets(joint->graph);
    EXPECT_EQ(Count(all, flash ? "aten._flash_attention_backward.default"
                               : "aten._scaled_dot_product_efficient_attention_backward.default"),
              1);
    EXPECT_EQ(Count(all, "aten.bmm.default"), 0);
    EXPECT_EQ(Count(all, "aten._softmax_backward_data.default"), 0);
    EXPECT_EQ(joint->grad_output_index.size(), 3u);
    for (int index : joint->grad_output_index) EXPECT_GE(index, 0);
    // The backward's arguments (no bias: None) are what its schema takes.
    const absl::Status verified = ir::Verify(joint->graph);
    EXPECT_TRUE(verified.ok()) << verified;
  }
}

// A batch of symbolic size, as kilnd's automatic dynamic shapes make it.
TEST(AttentionRewriteTest, ASymbolicBatchIsRewrittenToo) {
  ir::GraphBuilder b("attention");
  const ir::SymInt s0{std::string("s0")};
  auto sym = [](std::vector<ir::SymInt> v) { return v; };
  auto meta = [&](int64_t rows, int64_t cols) {
    ir::TensorMeta m;
    m.dtype = v1::BFLOAT16;
    m.device_type = "cuda";
    m.device_index = 0;
    m.sizes = {s0, ir::SymInt{int64_t{4}}, ir::SymInt{rows}, ir::SymInt{cols}};
    m.strides = ops::ContiguousStrides(m.sizes);
    m.storage_offset = ir::SymInt{int64_t{0}};
    return m;
  };
  const ValueId q = b.AddInput(meta(16, 64), v1::Placeholder::USER_INPUT, "q");
  const ValueId k = b.AddInput(meta(24, 64), v1::Placeholder::USER_INPUT, "k");
  const ValueId v = b.AddInput(meta(24, 64), v1::Placeholder::USER_INPUT, "v");
  auto op = [&](const std::string& target, std::vector<Argument> args) {
    auto out = ops::Emit(b, ops::DefaultRegistry(), target, std::move(args));
    EXPECT_TRUE(out.ok()) << target << ": " << out.status();
    return out.ok() ? (*out)[0] : ir::kNoValue;
  };
  const ir::SymInt bh{std::string("4*s0")};
  auto i = [](int64_t x) { return ir::SymInt{x}; };
  const ValueId kt = op("aten.permute.default", {Arg(k), Arg(std::vector<int64_t>{0, 1, 3, 2})});
  const ValueId q3 = op("aten.view.default", {Arg(q), Arg(sym({bh, i(16), i(64)}))});
  const ValueId k3 = op("aten.view.default",
                        {Arg(op("aten.clone.default", {Arg(kt)})), Arg(sym({bh, i(64), i(24)}))});
  const ValueId s4 = op("aten.view.default", {Arg(op("aten.bmm.default", {Arg(q3), Arg(k3)})),
                                              Arg(sym({s0, i(4), i(16), i(24)}))});
  const ValueId p = op("aten._softmax.default", {Arg(op("aten.div.Scalar", {Arg(s4), Arg(8.0)})),
                                                 Arg(int64_t{-1}), Arg(false)});
  const ValueId p3 = op("aten.view.default", {Arg(p), Arg(sym({bh, i(16), i(24)}))});
  const ValueId v3 = op("aten.view.default", {Arg(v), Arg(sym({bh, i(24), i(64)}))});
  const ValueId out = op("aten.view.default", {Arg(op("aten.bmm.default", {Arg(p3), Arg(v3)})),
                                               Arg(sym({s0, i(4), i(16), i(64)}))});
  b.AddOutput(out);
  const ir::TensorMeta want = b.value(out).meta;
  ir::Graph g = std::move(b).Build();
  auto fused = RewriteAttention(g, &g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(*fused, 1);
  EXPECT_EQ(Count(Targets(g), kSdpa), 1);
  EXPECT_EQ(Count(Targets(g), "aten.bmm.default"), 0);
  // The composite writes q's layout, which is out's: no copy, symbolic
  // strides and all.
  EXPECT_EQ(Count(Targets(g), "aten.clone.default"), 0);
  EXPECT_EQ(g.value(g.outputs()[0]).meta.sizes, want.sizes);
}

// Two sizes of one program, generalized by kilnd's automatic dynamic shapes
// (cache/shape_family.h): the symbolic graph is rewritten as well.
TEST(AttentionRewriteTest, AGeneralizedFamilyIsRewritten) {
  Spelling small, large;
  small.batch = {2, 4};
  small.l = small.s = 128;
  large.batch = {8, 12};
  large.l = large.s = 1024;
  const v1::Graph a = cache::PositionalForm(Attention(small).Build().ToProto());
  const v1::Graph b = cache::PositionalForm(Attention(large).Build().ToProto());
  auto general = cache::Generalize(a, b);
  ASSERT_TRUE(general.ok()) << general.status();
  auto g = ir::Graph::FromProto(cache::ConstantsAsInts(general->graph));
  ASSERT_TRUE(g.ok()) << g.status();
  auto fused = RewriteAttention(*g, &*g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(*fused, 1) << ir::PrintReadable(*g);
  // Strides are products of the symbols, not lines through the two sample
  // points (the input's first stride is H * L * 64).
  EXPECT_EQ(g->value(g->inputs()[0].value).meta.strides[0].ToString(), "64*s1*s2");
  EXPECT_EQ(Count(Targets(*g), kSdpa), 1);
  EXPECT_EQ(Count(Targets(*g), "aten.clone.default"), 0);  // the composite writes out's layout
}

// The graph Dynamo captured of softmax(q @ k^T / sqrt(d)) @ v, its tensors
// moved to the GPU.
TEST(AttentionRewriteTest, TheCapturedGraphIsRewritten) {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/data/graphs/attention.json");
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok());
  auto cuda = [](v1::TensorMeta* m) {
    m->mutable_device()->set_type("cuda");
    m->mutable_device()->set_index(0);
  };
  for (auto& in : *file.mutable_graph()->mutable_inputs()) cuda(in.mutable_value()->mutable_meta());
  for (auto& n : *file.mutable_graph()->mutable_nodes()) {
    for (auto& out : *n.mutable_outputs()) cuda(out.mutable_meta());
  }
  auto g = ir::Graph::FromProto(file.graph());
  ASSERT_TRUE(g.ok()) << g.status();
  auto fused = RewriteAttention(*g, &*g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(*fused, 1);
  EXPECT_EQ(Fused(Targets(*g)), 1);
}

}  // namespace
}  // namespace kiln::pipeline
