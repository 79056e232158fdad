// Tests of the op registry as a whole: traits, coverage of the required ops,
// schemas, every shape rule on a sample call, CheckMetadata on the captured
// test graphs, and kiln_ops_doc's table (the kiln_ops_doc ctest).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/schema.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_rules_test_util.h"
#include "compiler/ops/shape_util.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.pb.h"

namespace kiln::ops::shape_rules_test {
namespace {

// ---------------------------------------------------------------------------
// The registry as a whole.

TEST(Registry, TraitsOfRepresentativeOps) {
  const Registry& r = DefaultRegistry();
  auto traits = [&](const std::string& t) {
    const OpDef* d = r.Find(t);
    EXPECT_NE(d, nullptr) << t;
    return d == nullptr ? OpTraits{} : d->traits;
  };
  EXPECT_TRUE(traits("aten.add.Tensor").pointwise);
  EXPECT_TRUE(traits("aten._to_copy.default").pointwise);
  EXPECT_TRUE(traits("aten.threshold_backward.default").pointwise);
  EXPECT_TRUE(traits("aten.view.default").view);
  EXPECT_TRUE(traits("aten.split_with_sizes.default").view);
  EXPECT_TRUE(traits("aten.sum.dim_IntList").reduction);
  EXPECT_TRUE(traits("aten._softmax.default").reduction);
  EXPECT_TRUE(traits("aten.native_layer_norm.default").reduction);
  EXPECT_TRUE(traits("aten.native_dropout.default").random);
  EXPECT_TRUE(traits("aten.mm.default").expensive);
  EXPECT_TRUE(traits("aten.convolution_backward.default").expensive);
  EXPECT_TRUE(traits("aten.full.default").creation);
  EXPECT_FALSE(traits("aten.mm.default").pointwise);
}

TEST(Registry, CoversTheRequiredOps) {
  const char* required[] = {
      "aten.abs.default",
      "aten.neg.default",
      "aten.exp.default",
      "aten.log.default",
      "aten.log1p.default",
      "aten.expm1.default",
      "aten.sqrt.default",
      "aten.rsqrt.default",
      "aten.reciprocal.default",
      "aten.sin.default",
      "aten.cos.default",
      "aten.tanh.default",
      "aten.sigmoid.default",
      "aten.relu.default",
      "aten.gelu.default",
      "aten.silu.default",
      "aten.erf.default",
      "aten.sign.default",
      "aten.logical_not.default",
      "aten.bitwise_not.default",
      "aten.pow.Tensor_Scalar",
      "aten.pow.Tensor_Tensor",
      "aten.clamp.default",
      "aten.add.Tensor",
      "aten.add.Scalar",
      "aten.sub.Tensor",
      "aten.sub.Scalar",
      "aten.rsub.Scalar",
      "aten.rsub.Tensor",
      "aten.mul.Tensor",
      "aten.mul.Scalar",
      "aten.div.Tensor",
      "aten.div.Tensor_mode",
      "aten.div.Scalar",
      "aten.maximum.default",
      "aten.minimum.default",
      "aten.eq.Tensor",
      "aten.eq.Scalar",
      "aten.ne.Tensor",
      "aten.ne.Scalar",
      "aten.lt.Tensor",
      "aten.lt.Scalar",
      "aten.le.Tensor",
      "aten.le.Scalar",
      "aten.gt.Tensor",
      "aten.gt.Scalar",
      "aten.ge.Tensor",
      "aten.ge.Scalar",
      "aten.where.self",
      "aten.logical_and.default",
      "aten.logical_or.default",
      "aten.masked_fill.Scalar",
      "aten.fill.Scalar",
      "aten._to_copy.default",
      "aten.clone.default",
      "aten.detach.default",
      "aten.lift_fresh_copy.default",
      "aten.alias.default",
      "aten.sum.dim_IntList",
      "aten.sum.default",
      "aten.mean.dim",
      "aten.mean.default",
      "aten.amax.default",
      "aten.amin.default",
      "aten.var.correction",
      "aten.var_mean.correction",
      "aten.argmax.default",
      "aten.prod.dim_int",
      "aten.max.dim",
      "aten._softmax.default",
      "aten._log_softmax.default",
      "aten.native_layer_norm.default",
      "aten.native_batch_norm.default",
      "aten._native_batch_norm_legit_functional.default",
      "aten._native_batch_norm_legit_no_training.default",
      "aten.nll_loss_forward.default",
      "aten.native_dropout.default",
      "aten.bernoulli.p",
      "aten.view.default",
      "aten._unsafe_view.default",
      "aten.permute.default",
      "aten.expand.default",
      "aten.squeeze.dim",
      "aten.squeeze.dims",
      "aten.unsqueeze.default",
      "aten.slice.Tensor",
      "aten.select.int",
      "aten.split_with_sizes.default",
      "aten.split.Tensor",
      "aten.cat.default",
      "aten.stack.default",
      "aten.as_strided.default",
      "aten.t.default",
      "aten.transpose.int",
      "aten.full.default",
      "aten.full_like.default",
      "aten.zeros_like.default",
      "aten.ones_like.default",
      "aten.empty_like.default",
      "aten.arange.start_step",
      "aten.arange.default",
      "aten.scalar_tensor.default",
      "aten.empty_strided.default",
      "aten.zeros.default",
      "aten.ones.default",
      "aten.new_zeros.default",
      "aten.mm.default",
      "aten.bmm.default",
      "aten.addmm.default",
      "aten.convolution.default",
      "aten.max_pool2d_with_indices.default",
      "aten.avg_pool2d.default",
      "aten.embedding.default",
      "aten.index.Tensor",
      "aten.gather.default",
      "aten.threshold_backward.default",
      "aten.gelu_backward.default",
      "aten.tanh_backward.default",
      "aten.sigmoid_backward.default",
      "aten._softmax_backward_data.default",
      "aten._log_softmax_backward_data.default",
      "aten.native_layer_norm_backward.default",
      "aten.native_batch_norm_backward.default",
      "aten.convolution_backward.default",
      "aten.max_pool2d_with_indices_backward.default",
      "aten.avg_pool2d_backward.default",
      "aten.embedding_dense_backward.default",
      "aten.native_dropout_backward.default",
      "aten.nll_loss_backward.default",
  };
  for (const char* t : required) {
    const OpDef* d = DefaultRegistry().Find(t);
    ASSERT_NE(d, nullptr) << t;
    EXPECT_TRUE(d->shape) << t;
  }
}

TEST(Registry, EveryOpHasASchema) {
  for (const OpDef* d : DefaultRegistry().All()) {
    EXPECT_NE(ir::FindSchema(d->target), nullptr) << d->target;
    EXPECT_TRUE(d->shape) << d->target;
  }
}

// A plausible argument for each schema parameter; tensors are float32
// [2, 3, 4, 5] unless the parameter's name suggests an index.
Argument SampleArgument(Env& env, const ir::SchemaParam& p) {
  using B = ir::SchemaType::Base;
  const bool index_like = absl::StrContains(p.name, "ind") || p.name == "target" ||
                          p.name == "mask" || p.name == "condition";
  auto tensor = [&] {
    if (p.name == "mask" || p.name == "condition") return env.In(v1::BOOL, {2, 3, 4, 5});
    if (index_like) return env.In(v1::INT64, {2, 3, 4, 5});
    return env.In(v1::FLOAT32, {2, 3, 4, 5});
  };
  switch (p.type.base) {
    case B::kTensor:
      if (p.type.is_list) return Tensors({tensor(), tensor()});
      return ir::Ref(tensor());
    case B::kInt:
    case B::kSymInt:
      if (p.type.is_list) return ir::Ints(std::vector<int64_t>(std::max(1, p.type.list_size), 1));
      return ir::Int(1);
    case B::kFloat:
      return p.type.is_list ? Argument{"", std::vector<double>{0.5}} : ir::Float(0.5);
    case B::kBool:
      return p.type.is_list ? Bools(std::vector<bool>(std::max(1, p.type.list_size), true))
                            : ir::Bool(false);
    case B::kScalar:
      return ir::Int(1);
    case B::kScalarType:
      return Dtype(v1::FLOAT32);
    case B::kStr:
      return StrArg("none");
    default:
      return ir::NoneArg();
  }
}

TEST(Registry, EveryShapeRuleRunsOnASampleCall) {
  int ok = 0;
  for (const OpDef* d : DefaultRegistry().All()) {
    const ir::OpSchema* schema = ir::FindSchema(d->target);
    ASSERT_NE(schema, nullptr) << d->target;
    Env env;
    // By name, so that parameters left to their defaults shift nothing.
    std::vector<Argument> kwargs;
    for (const ir::SchemaParam& p : schema->params) {
      if (p.required()) kwargs.push_back(ir::Kwarg(p.name, SampleArgument(env, p)));
    }
    auto r = env.Infer(d->target, {}, kwargs);
    if (!r.ok()) {
      // Sample arguments need not fit every op; a rule may refuse them, but
      // only as a request error.
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
          << d->target << ": " << r.status();
      continue;
    }
    ++ok;
    if (schema->num_returns != ir::OpSchema::kListReturn) {
      EXPECT_EQ(static_cast<int>(r->size()), schema->num_returns) << d->target;
    }
    for (const TensorMeta& m : *r) {
      EXPECT_NE(m.dtype, v1::DTYPE_UNSPECIFIED) << d->target;
      EXPECT_EQ(m.strides.size(), m.sizes.size()) << d->target;
      EXPECT_FALSE(m.requires_grad) << d->target;
    }
  }
  // Most rules accept the generic sample.
  EXPECT_GT(ok, static_cast<int>(DefaultRegistry().All().size()) / 2);
}

// ---------------------------------------------------------------------------
// CheckMetadata against the captured test graphs.

absl::StatusOr<ir::Graph> LoadGraph(const std::string& name) {
  const std::string path = absl::StrCat(KILN_SOURCE_DIR, "/tests/data/graphs/", name);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  auto status = google::protobuf::util::JsonStringToMessage(text.str(), &file);
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.ToString()));
  return ir::Graph::FromProto(file.graph());
}

const char* kGraphs[] = {"attention.json", "conv_block.json", "mlp.json", "rmsnorm.json"};

TEST(CheckMetadata, CapturedGraphsPass) {
  for (const char* name : kGraphs) {
    auto g = LoadGraph(name);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(CheckMetadata(DefaultRegistry(), *g).ok())
        << name << ": " << CheckMetadata(DefaultRegistry(), *g);
  }
}

// Beyond what CheckMetadata compares: the rules reproduce the captured
// strides and storage offsets too.
TEST(CheckMetadata, RulesReproduceCapturedStrides) {
  for (const char* name : kGraphs) {
    auto g = LoadGraph(name);
    ASSERT_TRUE(g.ok()) << g.status();
    auto meta_of = [&](ir::ValueId v) -> const TensorMeta& { return g->value(v).meta; };
    for (const ir::Node& node : g->nodes()) {
      auto r = InferMetas(DefaultRegistry(), node.target, node.args, node.kwargs, meta_of);
      ASSERT_TRUE(r.ok()) << name << " " << node.name << ": " << r.status();
      ASSERT_EQ(r->size(), node.outputs.size());
      for (size_t j = 0; j < r->size(); ++j) {
        const TensorMeta& have = g->value(node.outputs[j]).meta;
        EXPECT_EQ(Str((*r)[j].strides), Str(have.strides)) << name << " " << node.name << " " << j;
        EXPECT_EQ((*r)[j].storage_offset, have.storage_offset) << name << " " << node.name;
      }
    }
  }
}

// Alters one output of one node in the wire form and expects the named
// error.
void ExpectAlteredGraphFails(const std::string& graph, const std::string& node_name,
                             const std::function<void(v1::Value*)>& alter,
                             const std::string& want) {
  const std::string path = absl::StrCat(KILN_SOURCE_DIR, "/tests/data/graphs/", graph);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &file).ok());
  bool found = false;
  for (v1::Node& n : *file.mutable_graph()->mutable_nodes()) {
    if (n.name() != node_name) continue;
    alter(n.mutable_outputs(n.outputs_size() > 1 ? 1 : 0));
    found = true;
  }
  ASSERT_TRUE(found) << node_name;
  auto g = ir::Graph::FromProto(file.graph());
  ASSERT_TRUE(g.ok()) << g.status();
  absl::Status s = CheckMetadata(DefaultRegistry(), *g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(want));
}

TEST(CheckMetadata, AlteredDtypeOrSizeIsNamed) {
  ExpectAlteredGraphFails(
      "rmsnorm.json", "mean", [](v1::Value* v) { v->mutable_meta()->set_dtype(v1::FLOAT16); },
      "node 'mean' (aten.mean.dim) output 0 'mean': dtype is FLOAT16 in the graph, but the op "
      "gives FLOAT32");
  ExpectAlteredGraphFails(
      "mlp.json", "native_layer_norm",
      [](v1::Value* v) { v->mutable_meta()->mutable_sizes(0)->set_int_value(9); },
      "node 'native_layer_norm' (aten.native_layer_norm.default) output 1 "
      "'native_layer_norm_out1': size[0] is 9 in the graph, but the op gives 8");
  ExpectAlteredGraphFails(
      "attention.json", "bmm",
      [](v1::Value* v) { v->mutable_meta()->mutable_sizes(2)->set_int_value(32); },
      "node 'bmm' (aten.bmm.default) output 0 'bmm': size[2] is 32 in the graph, but the op "
      "gives 16");
  ExpectAlteredGraphFails(
      "conv_block.json", "convolution", [](v1::Value* v) { v->mutable_meta()->add_sizes(); },
      "node 'convolution' (aten.convolution.default) output 0 'convolution': rank is 5");
}

// ---------------------------------------------------------------------------
// kiln_ops_doc lists every registry op (registered as its own ctest).

TEST(OpsDocTool, ListsEveryRegistryOp) {
  const std::string command =
      absl::StrCat(KILN_OPS_DOC_PATH, " ", KILN_SOURCE_DIR, "/compiler/ops/core_aten_ops.txt");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe.get())) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(pipe.release()), 0);
  EXPECT_THAT(out,
              HasSubstr("build/bin/kiln_ops_doc compiler/ops/core_aten_ops.txt > docs/ops.md"));
  for (const OpDef* d : DefaultRegistry().All()) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("| `", d->target, "` |"))) << d->target;
  }
  EXPECT_THAT(out,
              HasSubstr("`add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor`"));
  // Every op of torch's core opset has a row saying how kiln serves it.
  std::ifstream core(absl::StrCat(KILN_SOURCE_DIR, "/compiler/ops/core_aten_ops.txt"));
  std::string line;
  int core_ops = 0;
  while (std::getline(core, line)) {
    if (line.empty() || line[0] == '#') continue;
    ++core_ops;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("| `", line, "` | "))) << line;
  }
  EXPECT_GT(core_ops, 150);
  // docs/ops.md is this output: regenerated whenever the registry changes.
  std::ifstream doc(absl::StrCat(KILN_SOURCE_DIR, "/docs/ops.md"));
  const std::string committed((std::istreambuf_iterator<char>(doc)),
                              std::istreambuf_iterator<char>());
  EXPECT_EQ(committed, out) << "docs/ops.md is stale: build/bin/kiln_ops_doc "
                               "compiler/ops/core_aten_ops.txt > docs/ops.md";
}

}  // namespace
}  // namespace kiln::ops::shape_rules_test
