// Derivative rules of the expensive ops: matmul (mm, addmm, bmm),
// convolution, pooling and embedding.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/derivatives_internal.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops::derivatives_internal {
namespace {

// ---------------------------------------------------------------------------
// Matmul.

bool ColumnMajor(const ir::TensorMeta& m) {
  return m.sizes.size() == 2 && IsConstant(m.strides[0], 1) && m.strides[1] == m.sizes[0];
}

// mm_mat1_backward: grad.mm(mat2.t()), or (mat2.mm(grad.t())).t() for a
// column-major mat1 (so the gradient is column-major too).
Val MmMat1Backward(Ctx& c, ValueId g, ValueId mat1, ValueId mat2) {
  if (ColumnMajor(c.meta(mat1))) {
    ASSIGN_OR_RETURN(ValueId gt, c.Op("aten.t.default", {Ref(g)}));
    ASSIGN_OR_RETURN(ValueId p, c.Op("aten.mm.default", {Ref(mat2), Ref(gt)}));
    return c.Op("aten.t.default", {Ref(p)});
  }
  ASSIGN_OR_RETURN(ValueId m2t, c.Op("aten.t.default", {Ref(mat2)}));
  return c.Op("aten.mm.default", {Ref(g), Ref(m2t)});
}

// mm_mat2_backward: mat1.t().mm(grad), or (grad.t().mm(mat1)).t() for a
// column-major mat2.
Val MmMat2Backward(Ctx& c, ValueId g, ValueId mat1, ValueId mat2) {
  if (ColumnMajor(c.meta(mat2))) {
    ASSIGN_OR_RETURN(ValueId gt, c.Op("aten.t.default", {Ref(g)}));
    ASSIGN_OR_RETURN(ValueId p, c.Op("aten.mm.default", {Ref(gt), Ref(mat1)}));
    return c.Op("aten.t.default", {Ref(p)});
  }
  ASSIGN_OR_RETURN(ValueId m1t, c.Op("aten.t.default", {Ref(mat1)}));
  return c.Op("aten.mm.default", {Ref(m1t), Ref(g)});
}

// Whether each matrix of batched `m` is column-major (a transposed view of
// row-major matrices: attention's k^T as the matmul-layouts pass leaves it).
bool ColumnMajorBatches(const ir::TensorMeta& m) {
  return m.sizes.size() == 3 && m.strides.size() == 3 && IsConstant(m.strides[1], 1) &&
         m.strides[2] == m.sizes[1] && !IsConstant(m.sizes[1], 1) && !IsConstant(m.sizes[2], 1);
}

// bmm's self gradient: grad.bmm(mat2^T), or (mat2.bmm(grad^T))^T for a
// column-major self, so that the gradient is laid out as self is.
Val BmmSelfBackward(Ctx& c, ValueId g, ValueId self, ValueId mat2) {
  if (ColumnMajorBatches(c.meta(self))) {
    ASSIGN_OR_RETURN(ValueId gt, c.Op("aten.transpose.int", {Ref(g), ir::Int(1), ir::Int(2)}));
    ASSIGN_OR_RETURN(ValueId p, c.Op("aten.bmm.default", {Ref(mat2), Ref(gt)}));
    return c.Op("aten.transpose.int", {Ref(p), ir::Int(1), ir::Int(2)});
  }
  ASSIGN_OR_RETURN(ValueId t, c.Op("aten.transpose.int", {Ref(mat2), ir::Int(1), ir::Int(2)}));
  return c.Op("aten.bmm.default", {Ref(g), Ref(t)});
}

// bmm's mat2 gradient: self^T.bmm(grad), or (grad^T.bmm(self))^T for a
// column-major mat2. Attention's dk then comes out row-major in k's own
// order, rather than as a transposed view whose copies read one element per
// row.
Val BmmMat2Backward(Ctx& c, ValueId g, ValueId self, ValueId mat2) {
  if (ColumnMajorBatches(c.meta(mat2))) {
    ASSIGN_OR_RETURN(ValueId gt, c.Op("aten.transpose.int", {Ref(g), ir::Int(1), ir::Int(2)}));
    ASSIGN_OR_RETURN(ValueId p, c.Op("aten.bmm.default", {Ref(gt), Ref(self)}));
    return c.Op("aten.transpose.int", {Ref(p), ir::Int(1), ir::Int(2)});
  }
  ASSIGN_OR_RETURN(ValueId t, c.Op("aten.transpose.int", {Ref(self), ir::Int(1), ir::Int(2)}));
  return c.Op("aten.bmm.default", {Ref(t), Ref(g)});
}

}  // namespace

void RegisterMatmulAndConvolution(Registry* r) {
  Def(r, "aten.mm.default",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    return MmMat1Backward(c, g, self, mat2);
                  }},
                 {"mat2", [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    return MmMat2Backward(c, g, self, mat2);
                  }}}));
  Def(r, "aten.addmm.default",
      ParamRule({{"self", [](Ctx& c, ValueId g) { return MaybeMultiply(c, g, "beta"); }},
                 {"mat1",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId mat1, Tensor(c, "mat1"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    ASSIGN_OR_RETURN(ValueId p, MmMat1Backward(c, g, mat1, mat2));
                    return MaybeMultiply(c, p, "alpha");
                  }},
                 {"mat2", [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId mat1, Tensor(c, "mat1"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    ASSIGN_OR_RETURN(ValueId p, MmMat2Backward(c, g, mat1, mat2));
                    return MaybeMultiply(c, p, "alpha");
                  }}}));
  Def(r, "aten.bmm.default",
      ParamRule({{"self",
                  [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    return BmmSelfBackward(c, g, self, mat2);
                  }},
                 {"mat2", [](Ctx& c, ValueId g) -> Val {
                    ASSIGN_OR_RETURN(ValueId self, Tensor(c, "self"));
                    ASSIGN_OR_RETURN(ValueId mat2, Tensor(c, "mat2"));
                    return BmmMat2Backward(c, g, self, mat2);
                  }}}));
  Def(r, "aten.convolution.default", [](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    const bool mask[3] = {c.NeedsGrad("input"), c.NeedsGrad("weight"), c.NeedsGrad("bias")};
    if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
    Argument bias_sizes = ir::NoneArg();
    if (!c.call().IsNone("bias")) {
      ASSIGN_OR_RETURN(const ir::TensorMeta b, MetaOf(c, "bias"));
      bias_sizes = SizesArg(b.sizes);
    }
    ASSIGN_OR_RETURN(std::vector<ValueId> gs,
                     c.OpN("aten.convolution_backward.default",
                           {Ref(c.grad_output(0)), Arg(c, "input"), Arg(c, "weight"), bias_sizes,
                            Arg(c, "stride"), Arg(c, "padding"), Arg(c, "dilation"),
                            Arg(c, "transposed"), Arg(c, "output_padding"), Arg(c, "groups"),
                            Argument{"", std::vector<bool>{mask[0], mask[1], mask[2]}}}));
    const char* params[3] = {"input", "weight", "bias"};
    for (int i = 0; i < 3; ++i) {
      if (mask[i]) RETURN_IF_ERROR(SetReduced(c, params[i], gs[i]));
    }
    return absl::OkStatus();
  });
  Def(r, "aten.max_pool2d_with_indices.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.max_pool2d_with_indices_backward.default",
                    {Ref(g), Arg(c, "self"), Arg(c, "kernel_size"), Arg(c, "stride"),
                     Arg(c, "padding"), Arg(c, "dilation"), Arg(c, "ceil_mode"), Ref(c.output(1))});
      }));
  Def(r, "aten.max_pool3d_with_indices.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.max_pool3d_with_indices_backward.default",
                    {Ref(g), Arg(c, "self"), Arg(c, "kernel_size"), Arg(c, "stride"),
                     Arg(c, "padding"), Arg(c, "dilation"), Arg(c, "ceil_mode"), Ref(c.output(1))});
      }));
  for (const char* d : {"2d", "3d"}) {
    const std::string backward = absl::StrCat("aten.avg_pool", d, "_backward.default");
    Def(r, absl::StrCat("aten.avg_pool", d, ".default"), SelfRule([backward](Ctx& c, ValueId g) {
          return c.Op(backward, {Ref(g), Arg(c, "self"), Arg(c, "kernel_size"), Arg(c, "stride"),
                                 Arg(c, "padding"), Arg(c, "ceil_mode"),
                                 Arg(c, "count_include_pad"), Arg(c, "divisor_override")});
        }));
    const std::string adaptive = absl::StrCat("aten._adaptive_avg_pool", d, "_backward.default");
    Def(r, absl::StrCat("aten._adaptive_avg_pool", d, ".default"),
        SelfRule([adaptive](Ctx& c, ValueId g) {
          return c.Op(adaptive, {Ref(g), Arg(c, "self")});
        }));
  }
  Def(r, "aten.adaptive_max_pool2d.default", SelfRule([](Ctx& c, ValueId g) {
        return c.Op("aten.adaptive_max_pool2d_backward.default",
                    {Ref(g), Arg(c, "self"), Ref(c.output(1))});
      }));
  // Memory-efficient attention: ATen's backward from the output and the
  // log-sum-exp the forward computed (the attention rewrite asks for it in
  // training graphs); the RNG's seed and offset pass through (no dropout).
  Def(r, "aten._scaled_dot_product_efficient_attention.default", [](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    const bool mask[3] = {c.NeedsGrad("query"), c.NeedsGrad("key"), c.NeedsGrad("value")};
    if (!mask[0] && !mask[1] && !mask[2]) return absl::OkStatus();
    ASSIGN_OR_RETURN(bool log_sumexp, c.call().Bool("compute_log_sumexp"));
    if (!log_sumexp) {
      return absl::UnimplementedError(absl::StrCat(
          "derivative of ", c.call().Where(), ": needs compute_log_sumexp=True in the forward"));
    }
    ASSIGN_OR_RETURN(std::vector<ValueId> gs,
                     c.OpN("aten._scaled_dot_product_efficient_attention_backward.default",
                           {Ref(c.grad_output(0)), Arg(c, "query"), Arg(c, "key"), Arg(c, "value"),
                            Argument{"", ir::None{}}, Ref(c.output(0)), Ref(c.output(1)),
                            Ref(c.output(2)), Ref(c.output(3)), Arg(c, "dropout_p"),
                            Argument{"", std::vector<bool>{mask[0], mask[1], mask[2], false}},
                            Arg(c, "is_causal")},
                           {Argument{"scale", Arg(c, "scale").kind}}));
    const char* params[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; ++i) {
      if (mask[i]) c.SetGrad(params[i], gs[i]);
    }
    return absl::OkStatus();
  });
  // Flash attention: ATen's backward from the output, the log-sum-exp and
  // the RNG state the forward returned (no dropout: it draws nothing).
  Def(r, "aten._flash_attention_forward.default", [](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    if (!c.NeedsGrad("query") && !c.NeedsGrad("key") && !c.NeedsGrad("value")) {
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(
        std::vector<ValueId> gs,
        c.OpN("aten._flash_attention_backward.default",
              {Ref(c.grad_output(0)), Arg(c, "query"), Arg(c, "key"), Arg(c, "value"),
               Ref(c.output(0)), Ref(c.output(1)), Argument{"", ir::None{}},
               Argument{"", ir::None{}}, Arg(c, "max_q"), Arg(c, "max_k"), Arg(c, "dropout_p"),
               Arg(c, "is_causal"), Ref(c.output(2)), Ref(c.output(3))},
              {Argument{"scale", Arg(c, "scale").kind}}));
    const char* params[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; ++i) {
      if (c.NeedsGrad(params[i])) c.SetGrad(params[i], gs[i]);
    }
    return absl::OkStatus();
  });
  // embedding: the dense backward (sparse gradients are not supported).
  Def(r, "aten.embedding.default",
      [](Ctx& c) -> absl::Status {
        if (!c.NeedsGrad("weight") || c.grad_output(0) == kNoValue) return absl::OkStatus();
        ASSIGN_OR_RETURN(bool sparse, c.call().Bool("sparse"));
        if (sparse) {
          return absl::UnimplementedError(
              absl::StrCat("derivative of ", c.call().Where(), ": sparse gradients"));
        }
        ASSIGN_OR_RETURN(const ir::TensorMeta w, MetaOf(c, "weight"));
        ASSIGN_OR_RETURN(ValueId g,
                         c.Op("aten.embedding_dense_backward.default",
                              {Ref(c.grad_output(0)), Arg(c, "indices"), SymIntArg(w.sizes[0]),
                               Arg(c, "padding_idx"), Arg(c, "scale_grad_by_freq")}));
        return SetReduced(c, "weight", g);
      },
      {"indices"});
}

}  // namespace kiln::ops::derivatives_internal
