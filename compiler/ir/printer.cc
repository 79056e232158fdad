#include "compiler/ir/printer.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kiln::ir {
namespace {

std::string ArgString(const Argument& a, const Graph& g) {
  std::string s = a.name.empty() ? "" : absl::StrCat(a.name, "=");
  std::visit(
      [&](const auto& k) {
        using T = std::decay_t<decltype(k)>;
        if constexpr (std::is_same_v<T, None>) {
          absl::StrAppend(&s, "None");
        } else if constexpr (std::is_same_v<T, ValueId>) {
          absl::StrAppend(&s, g.value(k).name);
        } else if constexpr (std::is_same_v<T, bool>) {
          absl::StrAppend(&s, k ? "True" : "False");
        } else if constexpr (std::is_same_v<T, int64_t>) {
          absl::StrAppend(&s, k);
        } else if constexpr (std::is_same_v<T, double>) {
          absl::StrAppend(&s, absl::StrFormat("%g", k));
        } else if constexpr (std::is_same_v<T, std::string>) {
          absl::StrAppend(&s, "'", k, "'");
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          absl::StrAppend(&s, "[", absl::StrJoin(k, ", "), "]");
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          absl::StrAppend(&s, "[", absl::StrJoin(k, ", "), "]");
        } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
          std::vector<std::string> v;
          for (bool b : k) v.push_back(b ? "True" : "False");
          absl::StrAppend(&s, "[", absl::StrJoin(v, ", "), "]");
        } else if constexpr (std::is_same_v<T, std::vector<ValueId>>) {
          std::vector<std::string> v;
          for (ValueId id : k) v.push_back(id == kNoValue ? "None" : g.value(id).name);
          absl::StrAppend(&s, "[", absl::StrJoin(v, ", "), "]");
        } else if constexpr (std::is_same_v<T, SymInt>) {
          absl::StrAppend(&s, k.ToString());
        } else if constexpr (std::is_same_v<T, std::vector<SymInt>>) {
          std::vector<std::string> v;
          for (const auto& x : k) v.push_back(x.ToString());
          absl::StrAppend(&s, "[", absl::StrJoin(v, ", "), "]");
        } else if constexpr (std::is_same_v<T, v1::DType>) {
          absl::StrAppend(&s, "torch.", absl::AsciiStrToLower(v1::DType_Name(k)));
        } else if constexpr (std::is_same_v<T, Device>) {
          absl::StrAppend(&s, "device('", k.type, k.index >= 0 ? absl::StrCat(":", k.index) : "",
                          "')");
        } else if constexpr (std::is_same_v<T, v1::MemoryFormat>) {
          absl::StrAppend(&s, "torch.", absl::AsciiStrToLower(v1::MemoryFormat_Name(k)));
        } else if constexpr (std::is_same_v<T, v1::Layout>) {
          absl::StrAppend(&s, "torch.", absl::AsciiStrToLower(v1::Layout_Name(k)));
        }
      },
      a.kind);
  return s;
}

}  // namespace

std::string DTypeShortName(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return "f32";
    case v1::FLOAT64:
      return "f64";
    case v1::FLOAT16:
      return "f16";
    case v1::BFLOAT16:
      return "bf16";
    case v1::INT64:
      return "i64";
    case v1::INT32:
      return "i32";
    case v1::INT16:
      return "i16";
    case v1::INT8:
      return "i8";
    case v1::UINT8:
      return "u8";
    case v1::BOOL:
      return "b8";
    case v1::COMPLEX64:
      return "c64";
    case v1::COMPLEX128:
      return "c128";
    default:
      return "?";
  }
}

std::string MetaShortString(const TensorMeta& meta) {
  std::vector<std::string> sizes;
  for (const auto& s : meta.sizes) sizes.push_back(s.ToString());
  return absl::StrCat(DTypeShortName(meta.dtype), "[", absl::StrJoin(sizes, ", "), "]");
}

std::string PrintReadable(const Graph& g) {
  std::string out = absl::StrCat("# graph '", g.name(), "'\ndef forward(self");
  for (const Input& in : g.inputs()) {
    const Value& v = g.value(in.value);
    absl::StrAppend(&out, ", ", v.name, ": \"", MetaShortString(v.meta), "\"");
  }
  absl::StrAppend(&out, "):\n");
  for (const Node& node : g.nodes()) {
    std::vector<std::string> lhs;
    for (ValueId id : node.outputs) {
      const Value& v = g.value(id);
      lhs.push_back(node.outputs.size() == 1
                        ? absl::StrCat(v.name, ": \"", MetaShortString(v.meta), "\"")
                        : v.name);
    }
    std::vector<std::string> args;
    for (const auto& a : node.args) args.push_back(ArgString(a, g));
    for (const auto& a : node.kwargs) args.push_back(ArgString(a, g));
    absl::StrAppend(&out, "    ", absl::StrJoin(lhs, ", "), " = ", node.target, "(",
                    absl::StrJoin(args, ", "), ")");
    if (node.outputs.size() > 1) {
      std::vector<std::string> metas;
      for (ValueId id : node.outputs) metas.push_back(MetaShortString(g.value(id).meta));
      absl::StrAppend(&out, "  # ", absl::StrJoin(metas, ", "));
    }
    absl::StrAppend(&out, "\n");
  }
  std::vector<std::string> outs;
  for (ValueId id : g.outputs()) outs.push_back(g.value(id).name);
  absl::StrAppend(&out, "    return (", absl::StrJoin(outs, ", "), outs.size() == 1 ? ",)" : ")",
                  "\n");
  return out;
}

}  // namespace kiln::ir
