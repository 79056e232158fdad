#include "compiler/ir/schema.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace kiln::ir {
namespace {

// ATen schemas, as torch._C prints them (native_functions.yaml's `func:`).
// Where a schema changed between torch 1.13 and 2.x, the entry is the one
// whose parameter types accept the arguments of both (for example
// "int[1]? dim", which also takes the older non-optional list).
constexpr const char* kSchemas[] = {
    // Pointwise, unary.
    "abs(Tensor self) -> Tensor",
    "neg(Tensor self) -> Tensor",
    "exp(Tensor self) -> Tensor",
    "log(Tensor self) -> Tensor",
    "log1p(Tensor self) -> Tensor",
    "expm1(Tensor self) -> Tensor",
    "sqrt(Tensor self) -> Tensor",
    "rsqrt(Tensor self) -> Tensor",
    "reciprocal(Tensor self) -> Tensor",
    "sin(Tensor self) -> Tensor",
    "cos(Tensor self) -> Tensor",
    "tanh(Tensor self) -> Tensor",
    "sigmoid(Tensor self) -> Tensor",
    "relu(Tensor self) -> Tensor",
    "gelu(Tensor self, *, str approximate='none') -> Tensor",
    "silu(Tensor self) -> Tensor",
    "erf(Tensor self) -> Tensor",
    "sign(Tensor self) -> Tensor",
    "floor(Tensor self) -> Tensor",
    "ceil(Tensor self) -> Tensor",
    "isnan(Tensor self) -> Tensor",
    "bitwise_not(Tensor self) -> Tensor",
    "logical_not(Tensor self) -> Tensor",
    "leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor",
    "hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor",
    "clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor",
    "bernoulli.p(Tensor self, float p=0.5, *, Generator? generator=None) -> Tensor",
    "randn_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "rand_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "normal.Tensor_float(Tensor mean, float std=1, *, Generator? generator=None) -> Tensor",

    // Pointwise, binary and ternary.
    "pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor",
    "pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",
    "pow.Scalar(Scalar self, Tensor exponent) -> Tensor",
    "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
    "sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
    "rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
    "mul.Tensor(Tensor self, Tensor other) -> Tensor",
    "mul.Scalar(Tensor self, Scalar other) -> Tensor",
    "div.Tensor(Tensor self, Tensor other) -> Tensor",
    "div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
    "div.Scalar(Tensor self, Scalar other) -> Tensor",
    "div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor",
    "maximum(Tensor self, Tensor other) -> Tensor",
    "minimum(Tensor self, Tensor other) -> Tensor",
    "eq.Tensor(Tensor self, Tensor other) -> Tensor",
    "eq.Scalar(Tensor self, Scalar other) -> Tensor",
    "ne.Tensor(Tensor self, Tensor other) -> Tensor",
    "ne.Scalar(Tensor self, Scalar other) -> Tensor",
    "lt.Tensor(Tensor self, Tensor other) -> Tensor",
    "lt.Scalar(Tensor self, Scalar other) -> Tensor",
    "le.Tensor(Tensor self, Tensor other) -> Tensor",
    "le.Scalar(Tensor self, Scalar other) -> Tensor",
    "gt.Tensor(Tensor self, Tensor other) -> Tensor",
    "gt.Scalar(Tensor self, Scalar other) -> Tensor",
    "ge.Tensor(Tensor self, Tensor other) -> Tensor",
    "ge.Scalar(Tensor self, Scalar other) -> Tensor",
    "logical_and(Tensor self, Tensor other) -> Tensor",
    "logical_or(Tensor self, Tensor other) -> Tensor",
    "logical_xor(Tensor self, Tensor other) -> Tensor",
    "where.self(Tensor condition, Tensor self, Tensor other) -> Tensor",
    "masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor",

    // Copies, fills and factories.
    "_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor",
    "clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor",
    "copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor",
    "detach(Tensor(a) self) -> Tensor(a)",
    "lift_fresh_copy(Tensor self) -> Tensor",
    "fill.Scalar(Tensor self, Scalar value) -> Tensor",
    "full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None) -> Tensor",
    "full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None) -> Tensor",
    "ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None) -> Tensor",
    "zeros_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "ones_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "empty_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "new_zeros(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None) -> Tensor",
    "arange(Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None) -> Tensor",
    "arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, "
    "Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
    "scalar_tensor(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None) -> Tensor",
    "empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
    "empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, "
    "Device? device=None, bool? pin_memory=None) -> Tensor",

    // Reductions.
    "sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",
    "sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> "
    "Tensor",
    "mean(Tensor self, *, ScalarType? dtype=None) -> Tensor",
    "mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor",
    "amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor",
    "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
    "min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
    "var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) "
    "-> Tensor",
    "var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, "
    "bool keepdim=False) -> (Tensor, Tensor)",
    "argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",
    "argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",
    "prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
    "_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",

    // Normalization, dropout, losses.
    "native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, "
    "float eps) -> (Tensor, Tensor, Tensor)",
    "native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, "
    "int group, float eps) -> (Tensor, Tensor, Tensor)",
    "native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
    "Tensor? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
    "_native_batch_norm_legit_functional(Tensor input, Tensor? weight, Tensor? bias, "
    "Tensor running_mean, Tensor running_var, bool training, float momentum, float eps) "
    "-> (Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out)",
    "_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, "
    "Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, "
    "Tensor)",
    "native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)",
    "binary_cross_entropy(Tensor self, Tensor target, Tensor? weight=None, int reduction=1) -> "
    "Tensor",
    "nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt "
    "ignore_index) "
    "-> (Tensor output, Tensor total_weight)",

    // Views and shape manipulation.
    "view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
    "_unsafe_view(Tensor self, SymInt[] size) -> Tensor",
    "permute(Tensor(a) self, int[] dims) -> Tensor(a)",
    "expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)",
    "squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)",
    "squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a)",
    "unsqueeze(Tensor(a) self, int dim) -> Tensor(a)",
    "slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) "
    "-> Tensor(a)",
    "select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)",
    "split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
    "split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]",
    "unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]",
    "cat(Tensor[] tensors, int dim=0) -> Tensor",
    "stack(Tensor[] tensors, int dim=0) -> Tensor",
    "as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) "
    "-> Tensor(a)",
    "as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, "
    "SymInt? storage_offset=None) -> Tensor",
    "alias(Tensor(a) self) -> Tensor(a)",
    "t(Tensor(a) self) -> Tensor(a)",
    "transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)",
    "constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor",
    "index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
    "gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor",
    "scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor",
    "scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor",
    "scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor",
    "slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, "
    "SymInt step=1) -> Tensor",
    "scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, "
    "bool include_self=True) -> Tensor",
    "index_select(Tensor self, int dim, Tensor index) -> Tensor",
    "index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor",
    "index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor",
    "flip(Tensor self, int[] dims) -> Tensor",
    "cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
    "sinh(Tensor self) -> Tensor",
    "cosh(Tensor self) -> Tensor",
    "tan(Tensor self) -> Tensor",
    "atan(Tensor self) -> Tensor",
    "asin(Tensor self) -> Tensor",
    "acos(Tensor self) -> Tensor",
    "asinh(Tensor self) -> Tensor",
    "acosh(Tensor self) -> Tensor",
    "atanh(Tensor self) -> Tensor",
    "log2(Tensor self) -> Tensor",
    "log10(Tensor self) -> Tensor",
    "exp2(Tensor self) -> Tensor",
    "erfinv(Tensor self) -> Tensor",
    "lgamma(Tensor self) -> Tensor",
    "digamma(Tensor self) -> Tensor",
    "polygamma(int n, Tensor self) -> Tensor",
    "erfc(Tensor self) -> Tensor",
    "special_erfcx(Tensor self) -> Tensor",
    "special_ndtri(Tensor self) -> Tensor",
    "i0(Tensor self) -> Tensor",
    "special_i1(Tensor self) -> Tensor",
    "atan2(Tensor self, Tensor other) -> Tensor",
    "hypot(Tensor self, Tensor other) -> Tensor",
    "fmod.Tensor(Tensor self, Tensor other) -> Tensor",
    "fmod.Scalar(Tensor self, Scalar other) -> Tensor",
    "remainder.Tensor(Tensor self, Tensor other) -> Tensor",
    "remainder.Scalar(Tensor self, Scalar other) -> Tensor",
    "cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)",
    "median.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
    "kthvalue(Tensor self, SymInt k, int dim=-1, bool keepdim=False) -> (Tensor values, "
    "Tensor indices)",
    "sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)",
    "topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> "
    "(Tensor values, Tensor indices)",

    // Matmul, convolution, pooling, embedding.
    "mm(Tensor self, Tensor mat2) -> Tensor",
    "bmm(Tensor self, Tensor mat2) -> Tensor",
    "_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, "
    "Tensor? attn_bias, bool compute_log_sumexp, float dropout_p=0.0, bool is_causal=False, *, "
    "float? scale=None) -> (Tensor output, Tensor log_sumexp, Tensor philox_seed, "
    "Tensor philox_offset)",
    "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
    "Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, "
    "bool enable_gqa=False) -> Tensor",
    // ATen's text says `Tensor attn_bias`; its kernel and its autograd
    // formula take an undefined tensor when there is no bias (None here).
    "_scaled_dot_product_efficient_attention_backward(Tensor grad_out_, Tensor query, "
    "Tensor key, Tensor value, Tensor? attn_bias, Tensor out, Tensor logsumexp, "
    "Tensor philox_seed, Tensor philox_offset, float dropout_p, bool[4] grad_input_mask, "
    "bool is_causal=False, *, float? scale=None) -> (Tensor, Tensor, Tensor, Tensor)",
    // Likewise cum_seq_q and cum_seq_k: undefined for padded batches.
    "_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
    "Tensor out, Tensor logsumexp, Tensor? cum_seq_q, Tensor? cum_seq_k, SymInt max_q, "
    "SymInt max_k, float dropout_p, bool is_causal, Tensor rng_state, Tensor unused, *, "
    "float? scale=None, SymInt? window_size_left=None, SymInt? window_size_right=None) -> "
    "(Tensor, Tensor, Tensor)",
    "_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
    "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, "
    "bool return_debug_mask, *, float? scale=None, SymInt? window_size_left=None, "
    "SymInt? window_size_right=None, Tensor? seqused_k=None, Tensor? alibi_slopes=None) -> "
    "(Tensor output, Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, "
    "Tensor debug_attn_mask)",
    "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
    "_addmm_activation(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1, "
    "bool use_gelu=False) -> Tensor",
    "convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, "
    "SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor",
    "max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, "
    "int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)",
    "max_pool3d_with_indices(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, "
    "int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)",
    "_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor",
    "_adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor",
    "adaptive_max_pool2d(Tensor self, int[2] output_size) -> (Tensor, Tensor)",
    "avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, "
    "bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
    "avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, "
    "bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
    "embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool "
    "scale_grad_by_freq=False, "
    "bool sparse=False) -> Tensor",

    // Backward.
    "threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",
    "gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor",
    "tanh_backward(Tensor grad_output, Tensor output) -> Tensor",
    "sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor",
    "_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) "
    "-> Tensor",
    "_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType "
    "input_dtype) "
    "-> Tensor",
    "native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor "
    "mean, "
    "Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
    "max_pool3d_with_indices_backward(Tensor grad_output, Tensor self, int[3] kernel_size, "
    "int[3] stride, int[3] padding, int[3] dilation, bool ceil_mode, Tensor indices) -> Tensor",
    "_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor",
    "_adaptive_avg_pool3d_backward(Tensor grad_output, Tensor self) -> Tensor",
    "binary_cross_entropy_backward(Tensor grad_output, Tensor self, Tensor target, "
    "Tensor? weight=None, int reduction=1) -> Tensor",
    "adaptive_max_pool2d_backward(Tensor grad_output, Tensor self, Tensor indices) -> Tensor",
    "native_group_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, "
    "Tensor? weight, SymInt N, SymInt C, SymInt HxW, int group, bool[3] output_mask) -> "
    "(Tensor, Tensor, Tensor)",
    "native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? "
    "running_mean, "
    "Tensor? running_var, Tensor? save_mean, Tensor? save_invstd, bool train, float eps, "
    "bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
    "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, "
    "SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] "
    "output_padding, "
    "SymInt groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
    "max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, "
    "int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor",
    "avg_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, "
    "int[2] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor",
    "avg_pool3d_backward(Tensor grad_output, Tensor self, int[3] kernel_size, int[3] stride, "
    "int[3] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor",
    "embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, "
    "SymInt padding_idx, bool scale_grad_by_freq) -> Tensor",
    "native_dropout_backward(Tensor grad_output, Tensor mask, float scale) -> Tensor",
    "nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, int "
    "reduction, "
    "SymInt ignore_index, Tensor total_weight) -> Tensor",
};

// ---------------------------------------------------------------------------
// Parsing.

constexpr std::pair<absl::string_view, SchemaType::Base> kBaseNames[] = {
    {"Tensor", SchemaType::Base::kTensor},
    {"int", SchemaType::Base::kInt},
    {"SymInt", SchemaType::Base::kSymInt},
    {"float", SchemaType::Base::kFloat},
    {"bool", SchemaType::Base::kBool},
    {"Scalar", SchemaType::Base::kScalar},
    {"ScalarType", SchemaType::Base::kScalarType},
    {"Layout", SchemaType::Base::kLayout},
    {"Device", SchemaType::Base::kDevice},
    {"MemoryFormat", SchemaType::Base::kMemoryFormat},
    {"str", SchemaType::Base::kStr},
    {"Generator", SchemaType::Base::kGenerator},
};

bool IsIdentStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsIdentChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Consumes an identifier from the front of *s; empty when there is none.
absl::string_view ConsumeIdent(absl::string_view* s) {
  if (s->empty() || !IsIdentStart(s->front())) return {};
  size_t n = 1;
  while (n < s->size() && IsIdentChar((*s)[n])) ++n;
  absl::string_view id = s->substr(0, n);
  s->remove_prefix(n);
  return id;
}

// Bracket depth while reading a schema left to right, with quoted strings
// skipped: Step returns whether `c` stands outside quotes (and so counts).
struct Nesting {
  int depth = 0;
  char quote = 0;
  bool Step(char c) {
    if (quote != 0) {
      if (c == quote) quote = 0;
      return false;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      return false;
    }
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    return true;
  }
};

// The index of the bracket closing the one at s[open], skipping quoted
// strings; npos when it is unbalanced.
size_t MatchingClose(absl::string_view s, size_t open) {
  Nesting n;
  for (size_t i = open; i < s.size(); ++i) {
    if (n.Step(s[i]) && (s[i] == ')' || s[i] == ']') && n.depth == 0) return i;
  }
  return absl::string_view::npos;
}

// Splits at commas outside brackets and quotes; pieces are stripped.
std::vector<absl::string_view> SplitTopLevel(absl::string_view s) {
  std::vector<absl::string_view> out;
  if (absl::StripAsciiWhitespace(s).empty()) return out;
  Nesting n;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (n.Step(s[i]) && s[i] == ',' && n.depth == 0) {
      out.push_back(absl::StripAsciiWhitespace(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  out.push_back(absl::StripAsciiWhitespace(s.substr(start)));
  return out;
}

// Consumes a type from the front of *s: a base name, an optional alias
// annotation, then "?", "[N]" and "?" in ATen's order.
absl::StatusOr<SchemaType> ConsumeType(absl::string_view* s) {
  absl::string_view whole = *s;
  absl::string_view base = ConsumeIdent(s);
  SchemaType t;
  auto it = std::find_if(std::begin(kBaseNames), std::end(kBaseNames),
                         [&](const auto& e) { return e.first == base; });
  if (it == std::end(kBaseNames)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown type '", base.empty() ? whole : base, "'"));
  }
  t.base = it->second;
  if (absl::StartsWith(*s, "(")) {  // alias annotation: "(a)", "(a!)", "(a -> *)"
    size_t close = MatchingClose(*s, 0);
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("unbalanced alias annotation in '", whole, "'"));
    }
    s->remove_prefix(close + 1);
  }
  bool question = absl::ConsumePrefix(s, "?");
  if (absl::StartsWith(*s, "[")) {
    size_t close = s->find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("unbalanced list type in '", whole, "'"));
    }
    absl::string_view size = s->substr(1, close - 1);
    t.is_list = true;
    t.element_optional = question;
    question = false;
    if (!size.empty() && (!absl::SimpleAtoi(size, &t.list_size) || t.list_size <= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("bad list size in '", whole, "'"));
    }
    s->remove_prefix(close + 1);
    question = absl::ConsumePrefix(s, "?");
  }
  t.optional = question;
  if (t.element_optional && t.base != SchemaType::Base::kTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("only Tensor lists may have optional elements, in '", whole, "'"));
  }
  return t;
}

// "Tensor(a!) self=None", after the type: a name and an optional default.
absl::StatusOr<SchemaParam> ParseParam(absl::string_view text) {
  SchemaParam p;
  absl::string_view rest = text;
  ASSIGN_OR_RETURN(p.type, ConsumeType(&rest));
  if (rest.empty() || !absl::ascii_isspace(rest.front())) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", text, "' has no name"));
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  p.name = std::string(ConsumeIdent(&rest));
  if (p.name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", text, "' has no name"));
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (absl::ConsumePrefix(&rest, "=")) {
    rest = absl::StripAsciiWhitespace(rest);
    if (rest.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", text, "' has an empty default"));
    }
    p.default_value = std::string(rest);
  } else if (!rest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected '", rest, "' after parameter '", p.name, "'"));
  }
  return p;
}

// One return, "Tensor", "Tensor(a)[]" or "Tensor output"; true when it is a list.
absl::StatusOr<bool> ParseReturn(absl::string_view text) {
  absl::string_view rest = text;
  ASSIGN_OR_RETURN(SchemaType t, ConsumeType(&rest));
  if (t.base != SchemaType::Base::kTensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("return '", text, "' is not a Tensor (only Tensor returns are supported)"));
  }
  if (!rest.empty()) {  // a return may be named: "Tensor output"
    bool spaced = absl::ascii_isspace(rest.front());
    rest = absl::StripLeadingAsciiWhitespace(rest);
    if (!spaced || ConsumeIdent(&rest).empty() || !rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read return '", text, "'"));
    }
  }
  return t.is_list;
}

absl::StatusOr<int> ParseReturns(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(text, "(")) {
    if (MatchingClose(text, 0) != text.size() - 1) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read returns '", text, "'"));
    }
    std::vector<absl::string_view> parts = SplitTopLevel(text.substr(1, text.size() - 2));
    for (absl::string_view part : parts) {
      ASSIGN_OR_RETURN(bool is_list, ParseReturn(part));
      if (is_list) {
        return absl::InvalidArgumentError(
            absl::StrCat("a list inside a tuple of returns is not supported: '", text, "'"));
      }
    }
    return static_cast<int>(parts.size());
  }
  ASSIGN_OR_RETURN(bool is_list, ParseReturn(text));
  return is_list ? OpSchema::kListReturn : 1;
}

absl::StatusOr<OpSchema> ParseSchemaImpl(absl::string_view s) {
  OpSchema schema;
  absl::string_view rest = absl::StripAsciiWhitespace(s);
  absl::ConsumePrefix(&rest, "aten::");
  schema.name = std::string(ConsumeIdent(&rest));
  if (schema.name.empty()) return absl::InvalidArgumentError("no operator name");
  if (absl::ConsumePrefix(&rest, ".")) {
    schema.overload = std::string(ConsumeIdent(&rest));
    if (schema.overload.empty()) return absl::InvalidArgumentError("empty overload name");
    if (schema.overload == "default") {
      return absl::InvalidArgumentError("'default' is spelled by leaving the overload out");
    }
  }
  if (!absl::StartsWith(rest, "(")) {
    return absl::InvalidArgumentError("expected '(' after the operator name");
  }
  size_t close = MatchingClose(rest, 0);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("unbalanced parameter list");
  }
  bool kwarg_only = false;
  for (absl::string_view piece : SplitTopLevel(rest.substr(1, close - 1))) {
    if (piece == "*") {
      if (kwarg_only) return absl::InvalidArgumentError("'*' appears twice");
      kwarg_only = true;
      continue;
    }
    ASSIGN_OR_RETURN(SchemaParam p, ParseParam(piece));
    p.kwarg_only = kwarg_only;
    if (schema.FindParam(p.name) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' appears twice"));
    }
    schema.params.push_back(std::move(p));
  }
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(close + 1));
  if (!absl::ConsumePrefix(&rest, "->")) {
    return absl::InvalidArgumentError("expected '->' after the parameter list");
  }
  ASSIGN_OR_RETURN(schema.num_returns, ParseReturns(rest));
  return schema;
}

// ---------------------------------------------------------------------------
// The table.

using SchemaTable = absl::flat_hash_map<std::string, OpSchema>;

SchemaTable BuildTable() {
  SchemaTable table;
  for (const char* s : kSchemas) {
    absl::StatusOr<OpSchema> schema = ParseSchema(s);
    // The table is compiled in: a bad entry is a programmer error, and the
    // schema test runs into it.
    if (!schema.ok()) {
      std::fprintf(stderr, "kiln: bad ATen schema in the table: %s\n",
                   std::string(schema.status().message()).c_str());
      std::abort();
    }
    std::string target = schema->target();
    if (!table.emplace(target, *std::move(schema)).second) {
      std::fprintf(stderr, "kiln: ATen schema table lists %s twice\n", target.c_str());
      std::abort();
    }
  }
  return table;
}

const SchemaTable& Table() {
  static const SchemaTable* const table = new SchemaTable(BuildTable());
  return *table;
}

// ---------------------------------------------------------------------------
// Checking.

template <typename T>
bool Holds(const Argument::Kind& k) {
  return std::holds_alternative<T>(k);
}

bool AcceptsList(const SchemaType& t, const Argument::Kind& k) {
  using B = SchemaType::Base;
  if (IsEmptyList(k)) return true;
  switch (t.base) {
    case B::kTensor:
      if (const auto* ids = std::get_if<std::vector<ValueId>>(&k)) {
        return t.element_optional || std::find(ids->begin(), ids->end(), kNoValue) == ids->end();
      }
      return false;
    case B::kInt:
    case B::kSymInt:
      if (t.list_size > 0 && (Holds<int64_t>(k) || Holds<SymInt>(k))) return true;
      return Holds<std::vector<int64_t>>(k) || Holds<std::vector<SymInt>>(k);
    case B::kFloat:
      return Holds<std::vector<double>>(k) || Holds<std::vector<int64_t>>(k);
    case B::kBool:
      return Holds<std::vector<bool>>(k);
    default:
      return false;
  }
}

bool Accepts(const SchemaType& t, const Argument::Kind& k) {
  using B = SchemaType::Base;
  if (Holds<None>(k)) return t.optional;
  if (t.is_list) return AcceptsList(t, k);
  switch (t.base) {
    case B::kTensor:
      return Holds<ValueId>(k);
    case B::kInt:
    case B::kSymInt:
      return Holds<int64_t>(k) || Holds<SymInt>(k);
    case B::kFloat:
      return Holds<double>(k) || Holds<int64_t>(k);
    case B::kBool:
      return Holds<bool>(k);
    case B::kScalar:
      return Holds<int64_t>(k) || Holds<double>(k) || Holds<bool>(k) || Holds<SymInt>(k);
    case B::kScalarType:
      return Holds<v1::DType>(k);
    case B::kLayout:
      return Holds<v1::Layout>(k);
    case B::kDevice:
      return Holds<Device>(k);
    case B::kMemoryFormat:
      return Holds<v1::MemoryFormat>(k);
    case B::kStr:
      return Holds<std::string>(k);
    case B::kGenerator:
      return false;  // only None, handled above
  }
  return false;
}

std::string Plural(int n, absl::string_view word) {
  return absl::StrCat(n, " ", word, n == 1 ? "" : "s");
}

}  // namespace

std::string SchemaType::ToString() const {
  auto it = std::find_if(std::begin(kBaseNames), std::end(kBaseNames),
                         [&](const auto& e) { return e.second == base; });
  std::string s(it->first);
  if (element_optional) s += "?";
  if (is_list) s += list_size > 0 ? absl::StrCat("[", list_size, "]") : "[]";
  if (optional) s += "?";
  return s;
}

std::string OpSchema::target() const {
  return absl::StrCat("aten.", name, ".", overload.empty() ? "default" : overload);
}

int OpSchema::num_positional() const {
  int n = 0;
  while (n < static_cast<int>(params.size()) && !params[n].kwarg_only) ++n;
  return n;
}

int OpSchema::FindParam(absl::string_view param) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == param) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<OpSchema> ParseSchema(absl::string_view schema) {
  absl::StatusOr<OpSchema> parsed = ParseSchemaImpl(schema);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("schema '", schema, "': ", parsed.status().message()));
  }
  return parsed;
}

const OpSchema* FindSchema(absl::string_view target) {
  const SchemaTable& table = Table();
  auto it = table.find(target);
  return it == table.end() ? nullptr : &it->second;
}

std::vector<std::string> KnownTargets() {
  std::vector<std::string> out;
  for (const auto& [target, schema] : Table()) out.push_back(target);
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status CheckArguments(const Node& node, const Graph& /*graph*/) {
  const OpSchema* schema = FindSchema(node.target);
  if (schema == nullptr) return absl::OkStatus();
  const std::string at_node = absl::StrCat("node '", node.name, "'");

  const int num_positional = schema->num_positional();
  if (static_cast<int>(node.args.size()) > num_positional) {
    return absl::InvalidArgumentError(absl::StrCat(at_node, ": ", node.target, " takes ",
                                                   Plural(num_positional, "positional argument"),
                                                   ", got ", node.args.size()));
  }
  auto check_kind = [&](const SchemaParam& p, const Argument& a,
                        const std::string& which) -> absl::Status {
    if (Accepts(p.type, a.kind)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(at_node, " argument ", which, ": ", node.target,
                                                   " takes ", p.type.ToString(), ", got ",
                                                   KindName(a.kind)));
  };

  std::vector<bool> given(schema->params.size(), false);
  for (size_t i = 0; i < node.args.size(); ++i) {
    const SchemaParam& p = schema->params[i];
    given[i] = true;
    RETURN_IF_ERROR(check_kind(p, node.args[i], absl::StrCat(i, " '", p.name, "'")));
  }
  for (const Argument& kw : node.kwargs) {
    int i = schema->FindParam(kw.name);
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(at_node, ": ", node.target, " has no argument '", kw.name, "'"));
    }
    if (given[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(at_node, ": ", node.target, " argument '", kw.name, "' is given twice"));
    }
    given[i] = true;
    RETURN_IF_ERROR(check_kind(schema->params[i], kw, absl::StrCat("'", kw.name, "'")));
  }
  for (size_t i = 0; i < schema->params.size(); ++i) {
    const SchemaParam& p = schema->params[i];
    if (!given[i] && p.required()) {
      return absl::InvalidArgumentError(absl::StrCat(at_node, ": ", node.target,
                                                     " is missing required argument ", i, " '",
                                                     p.name, "' (", p.type.ToString(), ")"));
    }
  }

  const int outputs = static_cast<int>(node.outputs.size());
  if (schema->num_returns != OpSchema::kListReturn && outputs != schema->num_returns) {
    return absl::InvalidArgumentError(absl::StrCat(at_node, ": ", node.target, " returns ",
                                                   Plural(schema->num_returns, "tensor"),
                                                   ", node has ", Plural(outputs, "output")));
  }
  return absl::OkStatus();
}

}  // namespace kiln::ir
