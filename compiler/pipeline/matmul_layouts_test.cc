#include "compiler/pipeline/matmul_layouts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/ir/builder.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/rewrite_test_util.h"

namespace kiln::pipeline {
namespace {

using ir::Ref;

const ir::Node* Find(const ir::Graph& g, const std::string& target, int nth = 0) {
  for (const ir::Node& n : g.nodes()) {
    if (n.target == target && nth-- == 0) return &n;
  }
  return nullptr;
}

// Dynamo's q @ k.transpose(-1, -2) for q and k of [B, H, L, D] taken from
// [B, L, H, D] (a qkv projection's heads): expand, clone and view each
// operand to [B * H, ., .], then bmm.
struct Scores {
  ir::Graph graph;
  std::string kt_clone;  // the clone of k^T
};

Scores QKt(bool kt_is_output = false, bool reshape_kt = false) {
  ir::GraphBuilder b("scores");
  ir::TensorMeta m = ir::ContiguousMeta({2, 16, 3, 8}, v1::FLOAT32);
  m.device_type = "cuda";
  m.device_index = 0;
  const ir::ValueId q_in = b.AddInput(m, v1::Placeholder::USER_INPUT, "q");
  const ir::ValueId k_in = b.AddInput(m, v1::Placeholder::USER_INPUT, "k");
  const ir::ValueId q = Op(b, "aten.permute.default", {Ref(q_in), ir::Ints({0, 2, 1, 3})});
  const ir::ValueId k = Op(b, "aten.permute.default", {Ref(k_in), ir::Ints({0, 2, 1, 3})});
  const ir::ValueId kt = Op(b, "aten.permute.default", {Ref(k), ir::Ints({0, 1, 3, 2})});
  const ir::ValueId q3 =
      Op(b, "aten.view.default",
         {Ref(Contiguous(b, Op(b, "aten.expand.default", {Ref(q), ir::Ints({2, 3, 16, 8})}))),
          ir::Ints({6, 16, 8})});
  const ir::ValueId kt_copy =
      Contiguous(b, Op(b, "aten.expand.default", {Ref(kt), ir::Ints({2, 3, 8, 16})}));
  const ir::ValueId kt3 =
      Op(b, "aten.view.default",
         {Ref(kt_copy), reshape_kt ? ir::Ints({6, 16, 8}) : ir::Ints({6, 8, 16})});
  if (reshape_kt) {
    b.AddOutput(Op(b, "aten.bmm.default",
                   {Ref(q3), Ref(Op(b, "aten.permute.default", {Ref(kt3), ir::Ints({0, 2, 1})}))}));
  } else {
    b.AddOutput(Op(b, "aten.bmm.default", {Ref(q3), Ref(kt3)}));
  }
  if (kt_is_output) b.AddOutput(kt_copy);
  Scores s{std::move(b).Build(), ""};
  s.kt_clone = s.graph.value(kt_copy).name;
  return s;
}

TEST(MatmulLayoutsTest, TheTransposingCopyOfKIsMadeAlongMemory) {
  const Scores s = QKt();
  ir::Graph out;
  absl::StatusOr<int> n = TransposeMatmulCopies(s.graph, &out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);  // q's copy is along memory already
  const absl::Status verified = ir::Verify(out);
  ASSERT_TRUE(verified.ok()) << verified;

  // The copy of k reads rows of its input (last stride 1) and keeps its name.
  const ir::Node* copy = Find(out, "aten.clone.default", 1);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(out.value(copy->outputs[0]).name, s.kt_clone);
  const ir::TensorMeta& read = out.value(ir::Graph::Operands(*copy)[0]).meta;
  EXPECT_EQ(Strides(read).back(), 1);
  EXPECT_EQ(Strides(out.value(copy->outputs[0]).meta), (std::vector<int64_t>{384, 128, 8, 1}));

  // bmm reads k^T as a transposed view: [6, 8, 16] over [6, 16, 8].
  const ir::Node* bmm = Find(out, "aten.bmm.default");
  ASSERT_NE(bmm, nullptr);
  const ir::TensorMeta& kt = out.value(ir::Graph::Operands(*bmm)[1]).meta;
  EXPECT_EQ(Strides(kt), (std::vector<int64_t>{128, 1, 8}));
  std::vector<int64_t> sizes;
  for (const ir::SymInt& x : kt.sizes) sizes.push_back(x.constant());
  EXPECT_EQ(sizes, (std::vector<int64_t>{6, 8, 16}));
  // The product's metadata is the same.
  const ir::Node* before = Find(s.graph, "aten.bmm.default");
  EXPECT_TRUE(out.value(bmm->outputs[0]).meta.sizes ==
              s.graph.value(before->outputs[0]).meta.sizes);
  EXPECT_EQ(Strides(out.value(bmm->outputs[0]).meta),
            Strides(s.graph.value(before->outputs[0]).meta));
}

TEST(MatmulLayoutsTest, CopiesWhoseLayoutIsSeenStay) {
  for (bool output : {true, false}) {
    SCOPED_TRACE(output ? "the copy is a graph output" : "a view reshapes the last two dims");
    const Scores s = QKt(/*kt_is_output=*/output, /*reshape_kt=*/!output);
    ir::Graph out;
    absl::StatusOr<int> n = TransposeMatmulCopies(s.graph, &out);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, 0);
  }
}

}  // namespace
}  // namespace kiln::pipeline
