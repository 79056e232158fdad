#include "compiler/ir/torch_conventions.h"

#include <gtest/gtest.h>

#include <string>

#include "compiler/ir/canonical.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verify.h"
#include "google/protobuf/text_format.h"

namespace kiln::ir {
namespace {

std::string Meta(const std::string& dtype, const std::string& sizes_strides) {
  return "meta { dtype: " + dtype + " " + sizes_strides + " device { type: \"cpu\" index: -1 } }";
}
const std::string kVec = "sizes { int_value: 4 } strides { int_value: 1 }";

// Inputs x (float32 [4]) and n (int64 [4]); `nodes` in proto text; returns o.
v1::Graph Parse(const std::string& nodes) {
  const std::string text = "inputs { value { name: \"x\" " + Meta("FLOAT32", kVec) + " } }\n" +
                           "inputs { value { name: \"n\" " + Meta("INT64", kVec) + " } }\n" +
                           nodes + "\noutputs: \"o\"\n";
  v1::Graph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g)) << text;
  return g;
}

std::string Out(const std::string& name, const std::string& dtype = "FLOAT32") {
  return "outputs { name: \"" + name + "\" " + Meta(dtype, kVec) + " }";
}

TEST(TorchConventionsTest, NumberInATensorOverloadMovesToTheScalarOverload) {
  // aten.add.Tensor(x, 1e-06), as torch 2's decompositions record it.
  auto g = Graph::FromProto(
      Parse("nodes { name: \"add\" target: \"aten.add.Tensor\" args { tensor: \"x\" } "
            "args { float_value: 1e-06 } " +
            Out("o") + " }"));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->nodes().size(), 1u);
  EXPECT_EQ(g->nodes()[0].target, "aten.add.Scalar");
  EXPECT_TRUE(Verify(*g).ok()) << Verify(*g);
}

TEST(TorchConventionsTest, SameKeyAsTheScalarSpelling) {
  auto torch2 = Graph::FromProto(
      Parse("nodes { name: \"mul\" target: \"aten.mul.Tensor\" args { tensor: \"x\" } "
            "args { int_value: 3 } " +
            Out("o") + " }"));
  auto schema = Graph::FromProto(
      Parse("nodes { name: \"mul\" target: \"aten.mul.Scalar\" args { tensor: \"x\" } "
            "args { int_value: 3 } " +
            Out("o") + " }"));
  ASSERT_TRUE(torch2.ok() && schema.ok());
  EXPECT_EQ(CacheKey(*torch2, v1::CompileOptions()), CacheKey(*schema, v1::CompileOptions()));
}

TEST(TorchConventionsTest, NumberWithNoScalarOverloadBecomesAZeroDimTensor) {
  // sub.Tensor(1, x): no overload takes a Scalar first; maximum has none.
  auto g = Graph::FromProto(
      Parse("nodes { name: \"rsub\" target: \"aten.sub.Tensor\" args { float_value: 1.0 } "
            "args { tensor: \"x\" } " +
            Out("r") +
            " }\n"
            "nodes { name: \"max\" target: \"aten.maximum.default\" args { tensor: \"n\" } "
            "args { int_value: 0 } " +
            Out("o", "INT64") + " }"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Verify(*g).ok()) << Verify(*g);
  const std::string printed = PrintReadable(*g);
  EXPECT_NE(printed.find("aten.scalar_tensor.default(1, dtype=torch.float32"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("aten.scalar_tensor.default(0, dtype=torch.int64"), std::string::npos)
      << printed;
  int scalar_tensors = 0;
  for (const Node& n : g->nodes()) {
    if (n.target == "aten.scalar_tensor.default") {
      ++scalar_tensors;
      EXPECT_TRUE(g->value(n.outputs[0]).meta.sizes.empty());
    }
  }
  EXPECT_EQ(scalar_tensors, 2);
}

TEST(TorchConventionsTest, SymbolicNumberBecomesAZeroDimTensor) {
  // mul.Tensor(x, s0) over x of size s0 (x * x.shape[0] with a dynamic
  // size): a Scalar is a constant of the kernels, so the number stays a
  // tensor whose value the plan evaluates.
  const std::string sym = "sizes { expr: \"s0\" } strides { int_value: 1 }";
  const std::string text =
      "inputs { value { name: \"x\" " + Meta("FLOAT32", sym) + " } }\n" +
      "nodes { name: \"mul\" target: \"aten.mul.Tensor\" args { tensor: \"x\" } "
      "args { sym_int { expr: \"s0\" } } outputs { name: \"o\" " +
      Meta("FLOAT32", sym) + " } }\noutputs: \"o\"\n";
  v1::Graph proto;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &proto)) << text;
  auto g = Graph::FromProto(proto);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Verify(*g).ok()) << Verify(*g);
  const std::string printed = PrintReadable(*g);
  EXPECT_NE(printed.find("aten.mul.Tensor"), std::string::npos) << printed;
  EXPECT_NE(printed.find("aten.scalar_tensor.default(s0, dtype=torch.int64"), std::string::npos)
      << printed;
}

TEST(TorchConventionsTest, AnOptionalTensorParameterStillRefusesANumber) {
  auto g = Graph::FromProto(Parse(
      "nodes { name: \"ln\" target: \"aten.native_layer_norm.default\" args { tensor: \"x\" } "
      "args { ints { values: 4 } } args { int_value: 0 } args { none {} } "
      "args { float_value: 1e-5 } " +
      Out("o") + Out("m") + Out("r") + " }"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Verify(*g).message(),
            "node 'ln' argument 2 'weight': aten.native_layer_norm.default takes Tensor?, got an "
            "int");
}

TEST(TorchConventionsTest, AssertTensorMetadataIsCheckedThenDropped) {
  const std::string relu =
      "nodes { name: \"relu\" target: \"aten.relu.default\" args { tensor: \"x\" } " + Out("o") +
      " }\n";
  auto ok = Graph::FromProto(
      Parse(relu + "nodes { name: \"check\" target: \"aten._assert_tensor_metadata.default\" "
                   "args { tensor: \"o\" } args { none {} } args { none {} } "
                   "args { dtype: FLOAT32 } kwargs { name: \"device\" device { type: \"cpu\" "
                   "index: -1 } } }"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->nodes().size(), 1u);
  EXPECT_EQ(ok->nodes()[0].target, "aten.relu.default");

  auto bad_dtype = Graph::FromProto(
      Parse(relu + "nodes { name: \"check\" target: \"aten._assert_tensor_metadata.default\" "
                   "args { tensor: \"o\" } kwargs { name: \"dtype\" dtype: FLOAT16 } }"));
  EXPECT_EQ(bad_dtype.status().message(),
            "node 'check' (aten._assert_tensor_metadata.default): dtype is asserted to be "
            "FLOAT16, but 'o' has FLOAT32");
  auto bad_size = Graph::FromProto(
      Parse(relu + "nodes { name: \"check\" target: \"aten._assert_tensor_metadata.default\" "
                   "args { tensor: \"o\" } args { ints { values: 5 } } }"));
  EXPECT_EQ(bad_size.status().message(),
            "node 'check' (aten._assert_tensor_metadata.default): size[0] is asserted to be 5, "
            "but 'o' has 4");
}

// x: float32 [s0, 8] (or [4, 8] when `static_batch`); `nodes`; output o.
v1::Graph ParseSized(const std::string& nodes, bool static_batch = false) {
  const std::string batch = static_batch ? "int_value: 4" : "expr: \"s0\"";
  const std::string text =
      "inputs { value { name: \"x\" meta { dtype: FLOAT32 sizes { " + batch +
      " } sizes { int_value: 8 } strides { int_value: 8 } strides { int_value: 1 } "
      "device { type: \"cpu\" index: -1 } } } }\n" +
      nodes + "\noutputs: \"o\"\n";
  v1::Graph g;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &g)) << text;
  return g;
}

std::string FlatView(const std::string& size_arg, const std::string& size_meta) {
  return "nodes { name: \"view\" target: \"aten.view.default\" args { tensor: \"x\" } "
         "args { " +
         size_arg + " } outputs { name: \"o\" meta { dtype: FLOAT32 sizes { " + size_meta +
         " } strides { int_value: 1 } device { type: \"cpu\" index: -1 } } } }";
}

const std::string kSizeNodes =
    "nodes { name: \"sym_size_int\" target: \"aten.sym_size.int\" args { tensor: \"x\" } "
    "args { int_value: 0 } outputs { name: \"sym_size_int\" } }\n"
    "nodes { name: \"mul\" target: \"_operator.mul\" args { sym_int { expr: \"sym_size_int\" } } "
    "args { int_value: 8 } outputs { name: \"mul\" } }\n";

TEST(TorchConventionsTest, SymIntNodesFoldIntoTheArgumentsThatUseThem) {
  auto g = Graph::FromProto(
      ParseSized(kSizeNodes + FlatView("sym_ints { values { expr: \"mul\" } }", "expr: \"8*s0\"")));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->nodes().size(), 1u);
  const auto& size = std::get<std::vector<SymInt>>(g->nodes()[0].args[1].kind);
  ASSERT_EQ(size.size(), 1u);
  EXPECT_EQ(size[0].expr(), "s0*8");
  EXPECT_TRUE(Verify(*g).ok()) << Verify(*g);

  // The same graph as a client that folds them itself sends it.
  auto folded = Graph::FromProto(
      ParseSized(FlatView("sym_ints { values { expr: \"s0*8\" } }", "expr: \"8*s0\"")));
  ASSERT_TRUE(folded.ok()) << folded.status();
  EXPECT_EQ(CacheKey(*g, v1::CompileOptions()), CacheKey(*folded, v1::CompileOptions()));

  // A reference by name, as an FX graph spells it, folds the same way; with
  // static sizes the arithmetic is done.
  auto by_name = Graph::FromProto(
      ParseSized(kSizeNodes + FlatView("tensors { names: \"mul\" }", "int_value: 32"),
                 /*static_batch=*/true));
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  const auto& constant = std::get<std::vector<SymInt>>(by_name->nodes()[0].args[1].kind);
  EXPECT_EQ(constant[0].constant(), 32);
  EXPECT_TRUE(Verify(*by_name).ok()) << Verify(*by_name);
}

TEST(TorchConventionsTest, BadSymIntNodesAreRefusedByName) {
  auto out_of_range = Graph::FromProto(
      ParseSized("nodes { name: \"size5\" target: \"aten.sym_size.int\" args { tensor: \"x\" } "
                 "args { int_value: 5 } outputs { name: \"size5\" } }\n" +
                 FlatView("sym_ints { values { expr: \"size5\" } }", "expr: \"s0\"")));
  EXPECT_EQ(out_of_range.status().message(),
            "node 'size5' (aten.sym_size.int): dim 5 is out of range for rank 2");
  auto returned = Graph::FromProto(ParseSized(
      "nodes { name: \"numel\" target: \"aten.sym_numel.default\" args { tensor: \"x\" } "
      "outputs { name: \"o\" } }\n"));
  EXPECT_EQ(returned.status().message(),
            "graph output 'o' is a SymInt; Kiln's graphs return tensors");
  auto division = Graph::FromProto(
      ParseSized("nodes { name: \"div\" target: \"_operator.floordiv\" args { int_value: 4 } "
                 "args { int_value: 0 } outputs { name: \"div\" } }\n" +
                 FlatView("sym_ints { values { expr: \"div\" } }", "expr: \"s0\"")));
  EXPECT_EQ(division.status().message(), "node 'div' (_operator.floordiv): division by zero");
}

}  // namespace
}  // namespace kiln::ir
