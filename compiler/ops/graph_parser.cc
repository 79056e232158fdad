#include "compiler/ops/graph_parser.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/parse_text.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/schema.h"
#include "compiler/ir/sym_expr.h"
#include "compiler/ir/verify.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops {
namespace {

using ir::Argument;
using ir::SchemaType;
using ir::SymInt;
using ir::TensorMeta;
using ir::ValueId;

using ir::text::Error;
using ir::text::IsIntegerLiteral;
using ir::text::kQuoteLimit;
using ir::text::Quote;

bool IsName(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// The length of the name at the start of `s` (0 when none).
size_t NameLength(absl::string_view s) {
  size_t n = 0;
  while (n < s.size() && (absl::ascii_isalnum(static_cast<unsigned char>(s[n])) || s[n] == '_')) {
    ++n;
  }
  return n > 0 && absl::ascii_isdigit(static_cast<unsigned char>(s[0])) ? 0 : n;
}

// The position of the first `stop` outside brackets, parentheses and quotes
// at or after `from`, or npos.
size_t FindTopLevel(absl::string_view text, char stop, size_t from = 0) {
  int depth = 0;
  char quote = 0;
  for (size_t k = from; k < text.size(); ++k) {
    const char c = text[k];
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == stop && depth == 0) return k;
    if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '(' || c == '[') {
      ++depth;
    } else if (c == ')' || c == ']') {
      --depth;
    }
  }
  return absl::string_view::npos;
}

// Splits at the commas outside brackets and quotes, each piece stripped;
// blank text is no pieces. A trailing comma ("(a,)") adds no piece.
std::vector<absl::string_view> SplitTopLevel(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  if (absl::StripAsciiWhitespace(text).empty()) return pieces;
  size_t start = 0;
  while (true) {
    const size_t comma = FindTopLevel(text, ',', start);
    const absl::string_view piece = absl::StripAsciiWhitespace(text.substr(
        start, comma == absl::string_view::npos ? absl::string_view::npos : comma - start));
    if (comma == absl::string_view::npos) {
      if (!piece.empty() || pieces.empty()) pieces.push_back(piece);
      return pieces;
    }
    pieces.push_back(piece);
    start = comma + 1;
  }
}

// An integer (a constant SymInt) or a size expression.
// Expressions longer than `max_length` are refused before they are parsed.
absl::StatusOr<SymInt> ParseSymInt(int line, absl::string_view text, absl::string_view what,
                                   int64_t max_length) {
  if (text.empty()) return Error(line, absl::StrCat("expected ", what, ", got nothing"));
  if (static_cast<int64_t>(text.size()) > max_length) {
    return Error(line, absl::StrCat(what, " ", Quote(text), " is longer than ", max_length,
                                    " characters (GraphLimits.max_expr_length)"));
  }
  if (IsIntegerLiteral(text)) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(text, &value)) {
      return Error(line, absl::StrCat(what, " ", Quote(text), " is out of range of int64"));
    }
    return SymInt{value};
  }
  absl::StatusOr<ir::SymExpr> expr = ir::SymExpr::Parse(text);
  if (!expr.ok()) {
    // SymExpr's message quotes the whole text; keep only its reason.
    absl::string_view why = expr.status().message();
    const size_t quoted = why.rfind("': ");
    if (quoted != absl::string_view::npos) why.remove_prefix(quoted + 3);
    return Error(line, absl::StrCat("expected ", what, ", got ", Quote(text), " (",
                                    why.substr(0, 2 * kQuoteLimit), ")"));
  }
  return SymInt{std::string(text)};
}

// "torch.<name>" of an enum value: DType, Layout, MemoryFormat.
template <typename E>
std::optional<E> ParseTorchEnum(absl::string_view text, int min, int max, bool (*valid)(int),
                                const std::function<std::string(E)>& name) {
  if (!absl::ConsumePrefix(&text, "torch.")) return std::nullopt;
  for (int v = min; v <= max; ++v) {
    if (!valid(v)) continue;
    const E e = static_cast<E>(v);
    if (absl::AsciiStrToLower(name(e)) == text) return e;
  }
  return std::nullopt;
}

std::optional<ir::Device> ParseDeviceText(absl::string_view text) {
  ir::Device d;
  const size_t colon = text.find(':');
  d.type = std::string(text.substr(0, colon));
  if (!IsName(d.type)) return std::nullopt;
  if (colon != absl::string_view::npos) {
    const absl::string_view index = text.substr(colon + 1);
    if (!IsIntegerLiteral(index) || index[0] == '-' || !absl::SimpleAtoi(index, &d.index)) {
      return std::nullopt;
    }
  }
  return d;
}

// An argument of kind T (spelled out: a bool or an int must not pick
// another alternative of the variant).
template <typename T>
Argument::Kind Of(T value) {
  return Argument::Kind(std::in_place_type<T>, std::move(value));
}

struct ParsedValue {
  std::string name;
  TensorMeta meta;
  int line = 0;  // where it is defined
};

struct ParsedNode {
  int line = 0;
  std::string target;
  std::vector<Argument> args;
  std::vector<Argument> kwargs;
  std::vector<ValueId> outputs;
};

// A line of the text: its 1-based number and its text without surrounding
// whitespace.
struct Line {
  int number = 0;
  absl::string_view text;
};

class GraphParser {
 public:
  GraphParser(const ParseOptions& options, ir::Device device)
      : options_(options), device_(std::move(device)) {}

  absl::StatusOr<ir::Graph> Parse(const std::vector<Line>& lines) {
    size_t i = 0;
    if (i < lines.size() && absl::StartsWith(lines[i].text, "# graph '")) {
      absl::string_view t = lines[i].text.substr(9);
      if (!absl::ConsumeSuffix(&t, "'")) {
        return Error(lines[i].number, "expected \"# graph '<name>'\"");
      }
      name_ = std::string(t);
      ++i;
    }
    for (; i < lines.size() && absl::StartsWith(lines[i].text, "#"); ++i) {
    }
    if (i == lines.size()) return Error(LineAfter(lines), "expected 'def forward(self, ...):'");
    RETURN_IF_ERROR(Header(lines[i++]));
    bool returned = false;
    for (; i < lines.size(); ++i) {
      const Line& line = lines[i];
      if (absl::StartsWith(line.text, "#")) continue;
      if (returned) return Error(line.number, "expected nothing after the return");
      if (absl::StartsWith(line.text, "return ") || line.text == "return") {
        RETURN_IF_ERROR(Return(line));
        returned = true;
        continue;
      }
      RETURN_IF_ERROR(NodeLine(line));
    }
    if (!returned) return Error(LineAfter(lines), "expected 'return (...)' ending the graph");
    return Build();
  }

 private:
  static int LineAfter(const std::vector<Line>& lines) {
    return lines.empty() ? 1 : lines.back().number + 1;
  }

  // "f32[s0, 16]" with the device of the options, contiguous strides.
  absl::StatusOr<TensorMeta> Meta(int line, absl::string_view text) {
    const size_t open = text.find('[');
    if (open == absl::string_view::npos || !absl::EndsWith(text, "]")) {
      return Error(line,
                   absl::StrCat("expected metadata such as \"f32[4, s0]\", got ", Quote(text)));
    }
    TensorMeta meta;
    const absl::string_view dtype = text.substr(0, open);
    for (int d = v1::DType_MIN; d <= v1::DType_MAX; ++d) {
      if (!v1::DType_IsValid(d)) continue;
      const std::string name = ir::DTypeShortName(static_cast<v1::DType>(d));
      if (name != "?" && name == dtype) meta.dtype = static_cast<v1::DType>(d);
    }
    if (meta.dtype == v1::DTYPE_UNSPECIFIED) {
      return Error(line, absl::StrCat("expected a dtype (f32, i64, b8, ...), got ", Quote(dtype)));
    }
    const absl::string_view sizes = text.substr(open + 1, text.size() - open - 2);
    for (absl::string_view piece : SplitTopLevel(sizes)) {
      if (static_cast<int64_t>(meta.sizes.size()) == options_.limits.max_rank) {
        return Error(line, absl::StrCat("more than ", options_.limits.max_rank,
                                        " dimensions (GraphLimits.max_rank)"));
      }
      ASSIGN_OR_RETURN(SymInt size,
                       ParseSymInt(line, piece, "a size", options_.limits.max_expr_length));
      meta.sizes.push_back(std::move(size));
    }
    meta.strides = ContiguousStrides(meta.sizes);
    meta.device_type = device_.type;
    meta.device_index = device_.index;
    return meta;
  }

  absl::StatusOr<ValueId> Define(int line, absl::string_view name, TensorMeta meta) {
    if (!IsName(name)) return Error(line, absl::StrCat("expected a name, got ", Quote(name)));
    const ValueId id = static_cast<ValueId>(values_.size());
    if (!ids_.emplace(std::string(name), id).second) {
      return Error(line, absl::StrCat(Quote(name), " is defined twice"));
    }
    values_.push_back(ParsedValue{std::string(name), std::move(meta), line});
    return id;
  }

  absl::StatusOr<ValueId> Use(int line, absl::string_view name) {
    auto it = ids_.find(name);
    if (it == ids_.end()) {
      return Error(line, absl::StrCat("expected a value, got ", Quote(name),
                                      ", which no input or earlier node defines"));
    }
    return it->second;
  }

  // def forward(self, x: "f32[4]", w: "f32[4]"):
  absl::Status Header(const Line& line) {
    absl::string_view t = line.text;
    const int n = line.number;
    if (!absl::ConsumePrefix(&t, "def forward(self") || !absl::ConsumeSuffix(&t, "):")) {
      return Error(n, absl::StrCat("expected 'def forward(self, ...):', got ", Quote(t)));
    }
    while (!t.empty()) {
      if (!absl::ConsumePrefix(&t, ", ")) {
        return Error(n, absl::StrCat("expected ', <input>: \"<metadata>\"', got ", Quote(t)));
      }
      const size_t len = NameLength(t);
      const absl::string_view name = t.substr(0, len);
      t.remove_prefix(len);
      if (len == 0 || !absl::ConsumePrefix(&t, ": \"")) {
        return Error(n, absl::StrCat("expected '<input>: \"<metadata>\"', got ", Quote(t)));
      }
      const size_t close = t.find('"');
      if (close == absl::string_view::npos) {
        return Error(n, absl::StrCat("expected '\"' closing the metadata of ", Quote(name)));
      }
      ASSIGN_OR_RETURN(TensorMeta meta, Meta(n, t.substr(0, close)));
      t.remove_prefix(close + 1);
      const std::string key(name);
      meta.requires_grad = options_.requires_grad.count(key) > 0;
      meta.storage_offset = SymInt{int64_t{0}};
      ASSIGN_OR_RETURN(ValueId id, Define(n, name, std::move(meta)));
      auto kind = options_.input_kinds.find(key);
      inputs_.push_back(ir::Input{
          id, kind == options_.input_kinds.end() ? v1::Placeholder::USER_INPUT : kind->second});
    }
    return absl::OkStatus();
  }

  // return (a, b)
  absl::Status Return(const Line& line) {
    absl::string_view t = line.text;
    if (!absl::ConsumePrefix(&t, "return (") || !absl::ConsumeSuffix(&t, ")")) {
      return Error(line.number, absl::StrCat("expected 'return (<values>)', got ", Quote(t)));
    }
    for (absl::string_view name : SplitTopLevel(t)) {
      ASSIGN_OR_RETURN(ValueId id, Use(line.number, name));
      outputs_.push_back(id);
    }
    return absl::OkStatus();
  }

  // name: "meta" = target(args)   or   a, b = target(args)  # meta, meta
  absl::Status NodeLine(const Line& line) {
    const int n = line.number;
    if (static_cast<int64_t>(nodes_.size()) >= options_.limits.max_nodes) {
      return Error(n, absl::StrCat("more than ", options_.limits.max_nodes,
                                   " nodes (GraphLimits.max_nodes)"));
    }
    absl::string_view t = line.text;
    std::vector<absl::string_view> names;
    std::optional<TensorMeta> single;
    const size_t len = NameLength(t);
    if (len > 0 && absl::StartsWith(t.substr(len), ": \"")) {
      names.push_back(t.substr(0, len));
      t.remove_prefix(len + 3);
      const size_t close = t.find('"');
      if (close == absl::string_view::npos) {
        return Error(n, absl::StrCat("expected '\"' closing the metadata of ", Quote(names[0])));
      }
      ASSIGN_OR_RETURN(single, Meta(n, t.substr(0, close)));
      t.remove_prefix(close + 1);
      if (!absl::ConsumePrefix(&t, " = ")) {
        return Error(n, absl::StrCat("expected ' = ' after the output, got ", Quote(t)));
      }
    } else {
      const size_t eq = t.find('=');
      if (eq == absl::string_view::npos) {
        return Error(n, absl::StrCat("expected '<outputs> = <target>(...)', got ", Quote(t)));
      }
      names = SplitTopLevel(t.substr(0, eq));
      t = absl::StripLeadingAsciiWhitespace(t.substr(eq + 1));
    }
    ParsedNode node;
    node.line = n;
    const size_t open = t.find('(');
    if (open == absl::string_view::npos) {
      return Error(n, absl::StrCat("expected '<target>(...)', got ", Quote(t)));
    }
    node.target = std::string(t.substr(0, open));
    const ir::OpSchema* schema = ir::FindSchema(node.target);
    if (schema == nullptr) {
      return Error(n, absl::StrCat("unknown target ", Quote(node.target),
                                   " (no ATen schema in compiler/ir/schema.cc)"));
    }
    const size_t close = FindTopLevel(t, ')', open + 1);
    if (close == absl::string_view::npos) {
      return Error(n, absl::StrCat("expected ')' closing the arguments of ", node.target));
    }
    RETURN_IF_ERROR(Arguments(n, *schema, t.substr(open + 1, close - open - 1), &node));
    absl::string_view rest = absl::StripAsciiWhitespace(t.substr(close + 1));

    // The outputs' metadata: on the left of a single output, in a trailing
    // comment for several.
    std::vector<TensorMeta> metas;
    if (single.has_value()) {
      metas.push_back(*std::move(single));
      if (!rest.empty() && !absl::StartsWith(rest, "#")) {
        return Error(n, absl::StrCat("expected the end of the line, got ", Quote(rest)));
      }
    } else if (!names.empty()) {
      if (!absl::ConsumePrefix(&rest, "#")) {
        if (names.size() == 1) {
          return Error(n, absl::StrCat("expected '", names[0], ": \"<metadata>\" = ...'"));
        }
        return Error(n, "expected '# <metadata>, ...' of the outputs after the call");
      }
      for (absl::string_view m : SplitTopLevel(rest)) {
        ASSIGN_OR_RETURN(TensorMeta meta, Meta(n, m));
        metas.push_back(std::move(meta));
      }
      if (metas.size() != names.size()) {
        return Error(n, absl::StrCat(names.size(), " outputs but ", metas.size(), " metadata"));
      }
    }
    if (schema->num_returns != ir::OpSchema::kListReturn &&
        static_cast<int>(names.size()) != schema->num_returns) {
      return Error(n, absl::StrCat(node.target, " returns ", schema->num_returns,
                                   " outputs, the line names ", names.size()));
    }
    if (static_cast<int64_t>(names.size()) > options_.limits.max_outputs_per_node) {
      return Error(n, absl::StrCat("more than ", options_.limits.max_outputs_per_node,
                                   " outputs (GraphLimits.max_outputs_per_node)"));
    }
    RETURN_IF_ERROR(ShapeRuleMetas(node, &metas));
    for (size_t j = 0; j < names.size(); ++j) {
      ASSIGN_OR_RETURN(ValueId id, Define(n, names[j], std::move(metas[j])));
      node.outputs.push_back(id);
    }
    nodes_.push_back(std::move(node));
    return absl::OkStatus();
  }

  // Strides, storage offsets and devices from the op's shape rule, where it has one
  // and agrees on the rank; requires_grad from the operands.
  absl::Status ShapeRuleMetas(const ParsedNode& node, std::vector<TensorMeta>* metas) {
    bool requires_grad = false;
    auto read = [&](ValueId id) {
      if (id != ir::kNoValue) requires_grad = requires_grad || values_[id].meta.requires_grad;
    };
    for (const auto* list : {&node.args, &node.kwargs}) {
      for (const Argument& a : *list) {
        if (const auto* id = std::get_if<ValueId>(&a.kind)) read(*id);
        if (const auto* ids = std::get_if<std::vector<ValueId>>(&a.kind)) {
          for (ValueId id : *ids) read(id);
        }
      }
    }
    for (TensorMeta& m : *metas) m.requires_grad = requires_grad;
    if (options_.registry == nullptr || options_.registry->Find(node.target) == nullptr) {
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<TensorMeta>> inferred =
        InferMetas(*options_.registry, node.target, node.args, node.kwargs,
                   [this](ValueId v) -> const TensorMeta& { return values_[v].meta; });
    if (!inferred.ok()) {
      if (inferred.status().code() == absl::StatusCode::kUnimplemented) return absl::OkStatus();
      return Error(node.line, inferred.status().message().substr(0, 4 * kQuoteLimit));
    }
    if (inferred->size() != metas->size()) {
      return Error(node.line, absl::StrCat(node.target, " gives ", inferred->size(),
                                           " outputs here, the line names ", metas->size()));
    }
    for (size_t j = 0; j < metas->size(); ++j) {
      TensorMeta& m = (*metas)[j];
      const TensorMeta& want = (*inferred)[j];
      if (want.strides.size() != m.sizes.size()) continue;
      m.strides = want.strides;
      m.storage_offset = want.storage_offset;
      // Some outputs live elsewhere (attention's philox seed is on the CPU).
      if (!want.device_type.empty()) {
        m.device_type = want.device_type;
        m.device_index = want.device_index;
      }
    }
    return absl::OkStatus();
  }

  // The text between the parentheses of a call, bound to the schema.
  absl::Status Arguments(int line, const ir::OpSchema& schema, absl::string_view text,
                         ParsedNode* node) {
    std::vector<bool> given(schema.params.size(), false);
    for (absl::string_view piece : SplitTopLevel(text)) {
      const size_t len = NameLength(piece);
      const bool keyword =
          len > 0 && len + 1 < piece.size() && piece[len] == '=' && piece[len + 1] != '=';
      int index;
      if (keyword) {
        const absl::string_view name = piece.substr(0, len);
        index = schema.FindParam(name);
        if (index < 0) {
          return Error(line, absl::StrCat(schema.target(), " has no parameter ", Quote(name)));
        }
        piece.remove_prefix(len + 1);
      } else {
        if (!node->kwargs.empty()) {
          return Error(
              line, absl::StrCat("positional argument ", Quote(piece), " after keyword arguments"));
        }
        index = static_cast<int>(node->args.size());
        if (index >= schema.num_positional()) {
          return Error(line, absl::StrCat(schema.target(), " takes ", schema.num_positional(),
                                          " positional arguments, got more"));
        }
      }
      const ir::SchemaParam& param = schema.params[index];
      if (given[index]) {
        return Error(line, absl::StrCat("argument ", Quote(param.name), " given twice"));
      }
      given[index] = true;
      Argument a;
      if (keyword) a.name = param.name;
      ASSIGN_OR_RETURN(a.kind, Value(line, param, piece));
      (keyword ? node->kwargs : node->args).push_back(std::move(a));
    }
    for (size_t k = 0; k < schema.params.size(); ++k) {
      if (!given[k] && schema.params[k].required()) {
        return Error(line,
                     absl::StrCat(schema.target(), " needs argument ", Quote(schema.params[k].name),
                                  " (", schema.params[k].type.ToString(), ")"));
      }
    }
    return absl::OkStatus();
  }

  // One argument's text, read as its parameter's type.
  absl::StatusOr<Argument::Kind> Value(int line, const ir::SchemaParam& param,
                                       absl::string_view text) {
    const SchemaType& type = param.type;
    auto expected = [&](absl::string_view what) {
      return Error(line, absl::StrCat("expected ", what, " for ", Quote(param.name), " (",
                                      type.ToString(), "), got ", Quote(text)));
    };
    if (text == "None") {
      if (type.optional || type.base == SchemaType::Base::kGenerator) return Of(ir::None{});
      return expected("a value");
    }
    if (type.base == SchemaType::Base::kGenerator) return expected("None");
    if (type.is_list) {
      if (!absl::StartsWith(text, "[") || !absl::EndsWith(text, "]")) {
        const bool sized = type.list_size > 0 && (type.base == SchemaType::Base::kInt ||
                                                  type.base == SchemaType::Base::kSymInt);
        if (!sized) return expected("a list");
        return Scalar(line, param, text);
      }
      return List(line, param, text.substr(1, text.size() - 2));
    }
    return Scalar(line, param, text);
  }

  absl::StatusOr<Argument::Kind> Scalar(int line, const ir::SchemaParam& param,
                                        absl::string_view text) {
    auto expected = [&](absl::string_view what) {
      return Error(line, absl::StrCat("expected ", what, " for ", Quote(param.name), " (",
                                      param.type.ToString(), "), got ", Quote(text)));
    };
    using Base = SchemaType::Base;
    switch (param.type.base) {
      case Base::kTensor: {
        if (!IsName(text)) return expected("a value");
        ASSIGN_OR_RETURN(ValueId id, Use(line, text));
        return Of(id);
      }
      case Base::kInt:
      case Base::kSymInt: {
        ASSIGN_OR_RETURN(SymInt s,
                         ParseSymInt(line, text, "an integer", options_.limits.max_expr_length));
        if (s.is_constant()) return Of(s.constant());
        return Of(std::move(s));
      }
      case Base::kFloat: {
        double d = 0;
        if (!absl::SimpleAtod(text, &d)) return expected("a float");
        return Of(d);
      }
      case Base::kBool:
        if (text == "True") return Of(true);
        if (text == "False") return Of(false);
        return expected("True or False");
      case Base::kScalar: {
        if (text == "True") return Of(true);
        if (text == "False") return Of(false);
        if (IsIntegerLiteral(text)) {
          ASSIGN_OR_RETURN(SymInt s,
                           ParseSymInt(line, text, "an integer", options_.limits.max_expr_length));
          return Of(s.constant());
        }
        double d = 0;
        if (!text.empty() && !absl::ascii_isalpha(static_cast<unsigned char>(text[0])) &&
            absl::SimpleAtod(text, &d)) {
          return Of(d);
        }
        if (text == "inf" || text == "nan") {
          absl::SimpleAtod(text, &d);
          return Of(d);
        }
        ASSIGN_OR_RETURN(SymInt s,
                         ParseSymInt(line, text, "a number", options_.limits.max_expr_length));
        return Of(std::move(s));
      }
      case Base::kStr:
        if (text.size() < 2 || text.front() != '\'' || text.back() != '\'') {
          return expected("a string in single quotes");
        }
        return Of(std::string(text.substr(1, text.size() - 2)));
      case Base::kScalarType: {
        auto d = ParseTorchEnum<v1::DType>(text, v1::DType_MIN, v1::DType_MAX, v1::DType_IsValid,
                                           [](v1::DType e) { return v1::DType_Name(e); });
        if (!d.has_value()) return expected("a dtype such as torch.float32");
        return Of(*d);
      }
      case Base::kLayout: {
        auto l =
            ParseTorchEnum<v1::Layout>(text, v1::Layout_MIN, v1::Layout_MAX, v1::Layout_IsValid,
                                       [](v1::Layout e) { return v1::Layout_Name(e); });
        if (!l.has_value()) return expected("a layout such as torch.strided");
        return Of(*l);
      }
      case Base::kMemoryFormat: {
        auto f = ParseTorchEnum<v1::MemoryFormat>(
            text, v1::MemoryFormat_MIN, v1::MemoryFormat_MAX, v1::MemoryFormat_IsValid,
            [](v1::MemoryFormat e) { return v1::MemoryFormat_Name(e); });
        if (!f.has_value()) return expected("a memory format such as torch.contiguous_format");
        return Of(*f);
      }
      case Base::kDevice: {
        absl::string_view t = text;
        std::optional<ir::Device> d;
        if (absl::ConsumePrefix(&t, "device('") && absl::ConsumeSuffix(&t, "')")) {
          d = ParseDeviceText(t);
        }
        if (!d.has_value()) return expected("device('<type>[:<index>]')");
        return Of(*d);
      }
      case Base::kGenerator:
        return expected("None");
    }
    return expected("a value");
  }

  // The elements of a list argument (the text between its brackets).
  absl::StatusOr<Argument::Kind> List(int line, const ir::SchemaParam& param,
                                      absl::string_view text) {
    const std::vector<absl::string_view> items = SplitTopLevel(text);
    auto expected = [&](absl::string_view what, absl::string_view item) {
      return Error(line, absl::StrCat("expected ", what, " in the list ", Quote(param.name), " (",
                                      param.type.ToString(), "), got ", Quote(item)));
    };
    using Base = SchemaType::Base;
    switch (param.type.base) {
      case Base::kTensor: {
        std::vector<ValueId> ids;
        for (absl::string_view item : items) {
          if (item == "None" && param.type.element_optional) {
            ids.push_back(ir::kNoValue);
            continue;
          }
          if (!IsName(item)) return expected("a value", item);
          ASSIGN_OR_RETURN(ValueId id, Use(line, item));
          ids.push_back(id);
        }
        return Of(std::move(ids));
      }
      case Base::kInt:
      case Base::kSymInt: {
        std::vector<SymInt> syms;
        bool constant = true;
        for (absl::string_view item : items) {
          ASSIGN_OR_RETURN(SymInt s,
                           ParseSymInt(line, item, "an integer", options_.limits.max_expr_length));
          constant = constant && s.is_constant();
          syms.push_back(std::move(s));
        }
        if (!constant) return Of(std::move(syms));
        std::vector<int64_t> ints;
        for (const SymInt& s : syms) ints.push_back(s.constant());
        return Of(std::move(ints));
      }
      case Base::kFloat: {
        std::vector<double> floats;
        for (absl::string_view item : items) {
          double d = 0;
          if (!absl::SimpleAtod(item, &d)) return expected("a float", item);
          floats.push_back(d);
        }
        return Of(std::move(floats));
      }
      case Base::kBool: {
        std::vector<bool> bools;
        for (absl::string_view item : items) {
          if (item != "True" && item != "False") return expected("True or False", item);
          bools.push_back(item == "True");
        }
        return Of(std::move(bools));
      }
      default:
        return Error(line, absl::StrCat("lists of ", param.type.ToString(), " for ",
                                        Quote(param.name), " are not supported"));
    }
  }

  // The graph, verified. Nodes are named after their first output, made
  // unique among the value names.
  absl::StatusOr<ir::Graph> Build() {
    ir::GraphBuilder b(name_);
    for (const ir::Input& in : inputs_) {
      b.AddInput(values_[in.value].meta, in.kind, values_[in.value].name);
    }
    absl::flat_hash_set<std::string> node_names;
    for (ParsedNode& node : nodes_) {
      std::string base = node.outputs.empty() ? absl::StrCat("node", node_names.size())
                                              : values_[node.outputs[0]].name + "_node";
      std::string name = base;
      for (int k = 1; ids_.contains(name) || node_names.contains(name); ++k) {
        name = absl::StrCat(base, "_", k);
      }
      node_names.insert(name);
      std::vector<TensorMeta> metas;
      std::vector<std::string> names;
      for (ValueId id : node.outputs) {
        metas.push_back(values_[id].meta);
        names.push_back(values_[id].name);
      }
      b.AddNode(node.target, std::move(node.args), std::move(node.kwargs), std::move(metas), name,
                std::move(names));
    }
    for (ValueId id : outputs_) b.AddOutput(id);
    ir::Graph graph = std::move(b).Build();
    absl::Status status = ir::Verify(graph, options_.limits);
    if (status.ok() && options_.registry != nullptr) {
      status = CheckMetadata(*options_.registry, graph);
    }
    if (status.ok()) return graph;
    // Name the line of the node or value the error names (searching a short
    // prefix of the message, so that this stays linear in the text).
    const absl::string_view message = status.message().substr(0, 8 * kQuoteLimit);
    for (size_t k = 0; k < graph.nodes().size(); ++k) {
      if (absl::StrContains(message, absl::StrCat("'", graph.nodes()[k].name, "'"))) {
        return Error(nodes_[k].line, message);
      }
    }
    for (const ParsedValue& v : values_) {
      if (absl::StrContains(message, absl::StrCat("'", v.name, "'"))) return Error(v.line, message);
    }
    return absl::InvalidArgumentError(absl::StrCat("the parsed graph: ", message));
  }

  const ParseOptions& options_;
  const ir::Device device_;
  std::string name_;
  std::vector<ParsedValue> values_;
  absl::flat_hash_map<std::string, ValueId> ids_;
  std::vector<ir::Input> inputs_;
  std::vector<ParsedNode> nodes_;
  std::vector<ValueId> outputs_;
};

}  // namespace

absl::StatusOr<ir::Graph> ParseReadable(absl::string_view text, const ParseOptions& options) {
  std::optional<ir::Device> device = ParseDeviceText(options.device);
  if (!device.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParseOptions.device: expected '<type>[:<index>]', got ", Quote(options.device)));
  }
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view stripped = absl::StripAsciiWhitespace(l);
    if (!stripped.empty()) lines.push_back(Line{number, stripped});
  }
  GraphParser parser(options, *std::move(device));
  ASSIGN_OR_RETURN(ir::Graph graph, parser.Parse(lines));
  // Options naming no input are mistakes in the test that wrote them.
  std::set<std::string> inputs;
  for (const ir::Input& in : graph.inputs()) inputs.insert(graph.value(in.value).name);
  for (const std::string& name : options.requires_grad) {
    if (!inputs.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ParseOptions.requires_grad names ", Quote(name), ", which is no input"));
    }
  }
  for (const auto& [name, kind] : options.input_kinds) {
    if (!inputs.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ParseOptions.input_kinds names ", Quote(name), ", which is no input"));
    }
  }
  return graph;
}

}  // namespace kiln::ops
