#include "tests/integration/graphs.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace kiln::testing {
namespace {

v1::TensorMeta Meta(int64_t batch, bool symbolic = false) {
  v1::TensorMeta m;
  m.set_dtype(v1::FLOAT32);
  if (symbolic) {
    m.add_sizes()->set_expr("s0");
  } else {
    m.add_sizes()->set_int_value(batch);
  }
  m.add_sizes()->set_int_value(16);
  m.add_strides()->set_int_value(16);
  m.add_strides()->set_int_value(1);
  m.mutable_device()->set_type("cpu");
  m.mutable_device()->set_index(-1);
  return m;
}

std::string MetaText(const std::string& sizes, const std::string& strides) {
  return "meta { dtype: FLOAT32 " + sizes + " " + strides + " device { type: \"cpu\" index: -1 } }";
}

std::string Ints(const std::string& field, const std::vector<std::string>& values) {
  std::string out;
  for (const std::string& v : values) {
    const bool number = !v.empty() && (std::isdigit(v[0]) || v[0] == '-');
    out += field + (number ? " { int_value: " + v + " } " : " { expr: \"" + v + "\" } ");
  }
  return out;
}

}  // namespace

v1::Graph OneNodeGraph(const std::vector<std::string>& sizes,
                       const std::vector<std::string>& strides, const std::string& target,
                       const std::string& args, int outputs,
                       const std::vector<std::string>& out_sizes) {
  std::string text = "inputs { value { name: \"x\" " +
                     MetaText(Ints("sizes", sizes), Ints("strides", strides)) + " } }\n";
  text += "nodes { name: \"n\" target: \"" + target + "\" args { tensor: \"x\" } " + args;
  std::vector<std::string> out_strides(out_sizes.size(), "1");
  for (int i = 0; i < outputs; ++i) {
    text += " outputs { name: \"o" + std::to_string(i) + "\" " +
            MetaText(Ints("sizes", out_sizes), Ints("strides", out_strides)) + " }";
  }
  text += " }\noutputs: \"o0\"\n";
  v1::Graph g;
  if (!google::protobuf::TextFormat::ParseFromString(text, &g)) {
    std::fprintf(stderr, "OneNodeGraph: not a graph:\n%s\n", text.substr(0, 500).c_str());
    std::abort();
  }
  return g;
}

v1::Graph ChainGraph(int nodes, int64_t batch, int salt, bool symbolic) {
  v1::Graph g;
  g.set_name(absl::StrCat("chain", nodes));
  auto* in = g.add_inputs();
  in->set_kind(v1::Placeholder::USER_INPUT);
  in->mutable_value()->set_name("x");
  *in->mutable_value()->mutable_meta() = Meta(batch, symbolic);
  std::string prev = "x", prev2 = "x";
  for (int i = 0; i < nodes; ++i) {
    auto* n = g.add_nodes();
    n->set_name(absl::StrCat("op", i));
    const std::string out = absl::StrCat("t", i);
    switch (i % 3) {
      case 0:
        n->set_target("aten.relu.default");
        n->add_args()->set_tensor(prev);
        break;
      case 1:
        n->set_target("aten.neg.default");
        n->add_args()->set_tensor(prev);
        break;
      default: {
        n->set_target("aten.add.Tensor");
        n->add_args()->set_tensor(prev);
        n->add_args()->set_tensor(prev2);
        auto* alpha = n->add_kwargs();
        alpha->set_name("alpha");
        alpha->set_int_value(i == 2 ? 1 + salt : 1);
        break;
      }
    }
    auto* o = n->add_outputs();
    o->set_name(out);
    *o->mutable_meta() = Meta(batch, symbolic);
    prev2 = prev;
    prev = out;
  }
  g.add_outputs(prev);
  return g;
}

v1::GuardSet ChainGuards(int64_t batch) {
  v1::GuardSet g;
  auto* t = g.add_tensors();
  t->set_name("x");
  t->set_dtype(v1::FLOAT32);
  t->mutable_device()->set_type("cpu");
  t->mutable_device()->set_index(-1);
  t->add_sizes()->set_int_value(batch);
  t->add_sizes()->set_int_value(16);
  t->set_stride_check(v1::TensorGuard::CONTIGUOUS);
  return g;
}

v1::InputSignature ChainSignature(int64_t batch) {
  v1::InputSignature s;
  auto* t = s.add_inputs();
  t->set_dtype(v1::FLOAT32);
  t->mutable_device()->set_type("cpu");
  t->mutable_device()->set_index(-1);
  t->add_sizes(batch);
  t->add_sizes(16);
  t->add_strides(16);
  t->add_strides(1);
  return s;
}

v1::GraphFile LoadGraphFile(const std::string& name) {
  return LoadGraphFileAt(absl::StrCat(KILN_SOURCE_DIR, "/tests/data/graphs/", name));
}

v1::GraphFile LoadGraphFileAt(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::abort();
  }
  std::stringstream text;
  text << in.rdbuf();
  v1::GraphFile file;
  auto status = google::protobuf::util::JsonStringToMessage(text.str(), &file);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), status.ToString().c_str());
    std::abort();
  }
  return file;
}

}  // namespace kiln::testing
