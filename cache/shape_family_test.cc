#include "cache/shape_family.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

v1::SymInt Int(int64_t v) {
  v1::SymInt s;
  s.set_int_value(v);
  return s;
}

void SetMeta(v1::TensorMeta* m, std::vector<int64_t> sizes) {
  m->set_dtype(v1::FLOAT32);
  int64_t stride = 1;
  std::vector<int64_t> strides(sizes.size());
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= sizes[d];
  }
  for (int64_t s : sizes) *m->add_sizes() = Int(s);
  for (int64_t s : strides) *m->add_strides() = Int(s);
  *m->mutable_storage_offset() = Int(0);
}

// x: [batch, 16], y: [batch2, 16]; flat = view(x, [batch*16]);
// total = sum(x, [1]); cat = cat([x, y]); a `tail` int argument.
v1::Graph Program(int64_t batch, int64_t batch2, int64_t tail = 3,
                  const std::string& reduce = "aten.sum.dim_IntList") {
  v1::Graph g;
  g.set_name("program");
  auto* x = g.add_inputs()->mutable_value();
  x->set_name("x");
  SetMeta(x->mutable_meta(), {batch, 16});
  auto* y = g.add_inputs()->mutable_value();
  y->set_name("y");
  SetMeta(y->mutable_meta(), {batch2, 16});

  v1::Node* view = g.add_nodes();
  view->set_name("view");
  view->set_target("aten.view.default");
  view->add_args()->set_tensor("x");
  view->add_args()->mutable_ints()->add_values(batch * 16);
  auto* flat = view->add_outputs();
  flat->set_name("flat");
  SetMeta(flat->mutable_meta(), {batch * 16});

  v1::Node* sum = g.add_nodes();
  sum->set_name("sum");
  sum->set_target(reduce);
  sum->add_args()->set_tensor("x");
  sum->add_args()->mutable_ints()->add_values(1);
  auto* total = sum->add_outputs();
  total->set_name("total");
  SetMeta(total->mutable_meta(), {batch});

  v1::Node* cat = g.add_nodes();
  cat->set_name("cat");
  cat->set_target("aten.cat.default");
  auto* both = cat->add_args()->mutable_tensors();
  both->add_names("x");
  both->add_names("y");
  cat->add_args()->set_int_value(tail);
  auto* joined = cat->add_outputs();
  joined->set_name("joined");
  SetMeta(joined->mutable_meta(), {batch + batch2, 16});

  g.add_outputs("flat");
  g.add_outputs("total");
  g.add_outputs("joined");
  return g;
}

v1::Graph P(const v1::Graph& g) { return PositionalForm(g); }

TEST(ShapeFamilyTest, FamilyIgnoresIntegersAndNamesOnly) {
  const std::string f = ShapeFamily(P(Program(4, 8)), "salt");
  EXPECT_EQ(ShapeFamily(P(Program(6, 9, 7)), "salt"), f);
  EXPECT_NE(ShapeFamily(P(Program(4, 8)), "other options"), f);
  EXPECT_NE(ShapeFamily(P(Program(4, 8, 3, "aten.amax.default")), "salt"), f);
  v1::Graph renamed = Program(4, 8);
  renamed.mutable_inputs(0)->mutable_value()->set_name("input");
  renamed.mutable_nodes(0)->mutable_args(0)->set_tensor("input");
  renamed.mutable_nodes(1)->mutable_args(0)->set_tensor("input");
  renamed.mutable_nodes(2)->mutable_args(0)->mutable_tensors()->set_names(0, "input");
  EXPECT_EQ(P(renamed).DebugString(), P(Program(4, 8)).DebugString());
}

TEST(ShapeFamilyTest, GeneralizesDifferingSizesIntoSymbols) {
  auto g = Generalize(P(Program(4, 8)), P(Program(5, 8)));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->symbols, std::vector<std::string>{"s0"});
  EXPECT_EQ(g->dims[0], (std::vector<std::pair<int, int>>{{0, 0}}));
  const v1::Graph& s = g->graph;
  EXPECT_EQ(s.inputs(0).value().meta().sizes(0).expr(), "s0");
  EXPECT_EQ(s.inputs(0).value().meta().sizes(1).int_value(), 16);
  EXPECT_EQ(s.inputs(1).value().meta().sizes(0).int_value(), 8);  // unchanged: static
  EXPECT_EQ(s.nodes(0).args(1).sym_ints().values(0).expr(), "16*s0");
  EXPECT_EQ(s.nodes(0).outputs(0).meta().sizes(0).expr(), "16*s0");
  EXPECT_EQ(s.nodes(1).outputs(0).meta().sizes(0).expr(), "s0");
  EXPECT_EQ(s.nodes(2).outputs(0).meta().sizes(0).expr(), "s0 + 8");
  EXPECT_TRUE(IsStatic(Program(4, 8)));
  EXPECT_FALSE(IsStatic(s));

  // Every later batch is an instance; a graph that differs elsewhere is not.
  EXPECT_TRUE(CheckInstance(s, P(Program(64, 8))).ok());
  EXPECT_TRUE(CheckInstance(s, P(Program(4, 8))).ok());
  absl::Status other_y = CheckInstance(s, P(Program(64, 9)));
  EXPECT_EQ(other_y.code(), absl::StatusCode::kFailedPrecondition);
  absl::Status other_tail = CheckInstance(s, P(Program(64, 8, 2)));
  EXPECT_NE(other_tail.message().find("is 2 where the general graph gives 3"), std::string::npos)
      << other_tail;
  EXPECT_FALSE(CheckInstance(s, P(Program(64, 8, 3, "aten.amax.default"))).ok());
  // A graph of the family whose view does not follow the batch.
  v1::Graph odd = Program(64, 8);
  odd.mutable_nodes(0)->mutable_args(1)->mutable_ints()->set_values(0, 16 * 63);
  EXPECT_FALSE(CheckInstance(s, P(odd)).ok());
}

TEST(ShapeFamilyTest, EqualSizePairsShareOneSymbol) {
  auto g = Generalize(P(Program(4, 4)), P(Program(6, 6)));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->symbols.size(), 1u);
  EXPECT_EQ(g->dims[0], (std::vector<std::pair<int, int>>{{0, 0}, {1, 0}}));
  EXPECT_EQ(g->graph.nodes(2).outputs(0).meta().sizes(0).expr(), "2*s0");
  EXPECT_TRUE(CheckInstance(g->graph, P(Program(10, 10))).ok());
  EXPECT_FALSE(CheckInstance(g->graph, P(Program(10, 11))).ok());

  auto two = Generalize(P(Program(4, 5)), P(Program(6, 8)));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->symbols.size(), 2u);
  EXPECT_TRUE(CheckInstance(two->graph, P(Program(10, 11))).ok());
}

TEST(ShapeFamilyTest, RefusesWhatItCannotExplain) {
  auto ones = Generalize(P(Program(1, 8)), P(Program(5, 8)));
  EXPECT_NE(ones.status().message().find("sizes 0 and 1 are specialized"), std::string::npos)
      << ones.status();
  auto same = Generalize(P(Program(4, 8)), P(Program(4, 8, 5)));
  EXPECT_NE(same.status().message().find("no input size differs"), std::string::npos);
  // The tail argument goes 3 -> 4 while the batch goes 4 -> 6: no integer slope.
  auto odd = Generalize(P(Program(4, 8, 3)), P(Program(6, 8, 4)));
  EXPECT_NE(odd.status().message().find("which no expression of the input sizes fits"),
            std::string::npos)
      << odd.status();
  auto structure = Generalize(P(Program(4, 8)), P(Program(6, 8, 3, "aten.amax.default")));
  EXPECT_NE(structure.status().message().find("differ in more than their integers"),
            std::string::npos);
  auto symbolic = Generalize(P(Program(4, 8)), P(Program(4, 8)));
  EXPECT_FALSE(symbolic.ok());
}

TEST(ShapeFamilyTest, GuardsFollowTheGeneralizedInputs) {
  auto g = Generalize(P(Program(4, 8)), P(Program(5, 8)));
  ASSERT_TRUE(g.ok()) << g.status();
  v1::GuardSet guards;
  guards.set_client_guard_digest("opaque");
  for (int i = 0; i < 2; ++i) {
    v1::TensorGuard* t = guards.add_tensors();
    t->set_name(i == 0 ? "x" : "y");
    *t->mutable_sizes() = Program(5, 8).inputs(i).value().meta().sizes();
    t->set_stride_check(v1::TensorGuard::EXACT);
    *t->mutable_strides() = Program(5, 8).inputs(i).value().meta().strides();
  }
  v1::GuardSet out = GeneralizeGuards(guards, *g);
  EXPECT_EQ(out.tensors(0).sizes(0).expr(), "s0");
  EXPECT_EQ(out.tensors(0).strides(0).int_value(), 16);
  EXPECT_EQ(out.tensors(1).sizes(0).int_value(), 8);
  ASSERT_EQ(out.shape_guards_size(), 1);
  EXPECT_EQ(out.shape_guards(0), "s0 >= 2");
  EXPECT_EQ(out.client_guard_digest(), "opaque");
}

TEST(ShapeFamilyTest, ConstantsReturnToTheirSchemaKinds) {
  v1::Graph g = ConstantsAsInts(P(Program(4, 8)));
  EXPECT_EQ(g.nodes(0).args(1).ints().values(0), 64);
  EXPECT_EQ(g.nodes(2).args(1).int_value(), 3);
  auto s = Generalize(P(Program(4, 8)), P(Program(5, 8)));
  ASSERT_TRUE(s.ok());
  v1::Graph kept = ConstantsAsInts(s->graph);
  EXPECT_EQ(kept.nodes(0).args(1).sym_ints().values(0).expr(), "16*s0");
  EXPECT_EQ(kept.nodes(1).args(1).ints().values(0), 1);
}

}  // namespace
}  // namespace kiln::cache
