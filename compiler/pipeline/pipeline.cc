#include "compiler/pipeline/pipeline.h"

#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_driver.h"
#include "common/status_macros.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/codegen/modules.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/printer.h"
#include "compiler/loop/cat_in_place.h"
#include "compiler/loop/fold_column_sums.h"
#include "compiler/loop/lowering.h"
#include "compiler/loop/split_reductions.h"
#include "compiler/loop/sweep_order.h"
#include "compiler/ops/registry.h"
#include "compiler/pipeline/addmm_activation.h"
#include "compiler/pipeline/attention.h"
#include "compiler/pipeline/conv_layouts.h"
#include "compiler/pipeline/elide_copies.h"
#include "compiler/pipeline/matmul_layouts.h"
#include "compiler/pipeline/merge_sums.h"
#include "compiler/pipeline/unfuse_addmm.h"

namespace kiln::pipeline {
namespace {

struct Split {
  autograd::JointGraph joint;
  autograd::Partition partition;
};

absl::StatusOr<Split> JointAndPartition(const ir::Graph& graph, PhaseTimes* times) {
  Split s;
  ASSIGN_OR_RETURN(s.joint, times->Time("joint-graph", [&] {
    return autograd::BuildJointGraph(graph, autograd::JointOptions());
  }));
  ASSIGN_OR_RETURN(s.partition, times->Time("partition", [&] {
    return autograd::PartitionJointGraph(s.joint);
  }));
  return s;
}

// Gives every Launch of `plan` the grid and block its kernel is generated
// for, and the alignment it assumes of its buffers.
absl::Status SizeLaunches(const std::vector<loop::Kernel>& kernels,
                          const codegen::CodegenBackend& backend, v1::ExecutionPlan* plan) {
  std::map<std::string, std::pair<const loop::Kernel*, codegen::LaunchSize>> sizes;
  for (const loop::Kernel& k : kernels) {
    ASSIGN_OR_RETURN(codegen::LaunchSize size, backend.Launch(k));
    sizes[k.name] = {&k, std::move(size)};
  }
  for (v1::PlanStep& step : *plan->mutable_steps()) {
    if (!step.has_launch()) continue;
    auto it = sizes.find(step.launch().symbol());
    if (it == sizes.end()) {
      return absl::InternalError(
          absl::StrCat("plan launches '", step.launch().symbol(), "', which no kernel defines"));
    }
    const auto& [kernel, size] = it->second;
    v1::PlanStep::Launch* launch = step.mutable_launch();
    launch->clear_grid();
    launch->clear_block();
    launch->clear_alignment();
    launch->clear_written();
    *launch->add_grid() = ir::SymIntToProto(size.grid);
    launch->add_block()->set_int_value(size.block);
    if (size.alignment.empty()) continue;
    if (launch->buffers_size() != static_cast<int>(kernel->buffers.size()) ||
        size.alignment.size() != kernel->buffers.size()) {
      return absl::InternalError(absl::StrCat("plan launches '", kernel->name, "' with ",
                                              launch->buffers_size(), " buffers; it has ",
                                              kernel->buffers.size()));
    }
    for (size_t b = 0; b < kernel->buffers.size(); ++b) {
      launch->add_alignment(size.alignment[b]);
      launch->add_written(kernel->buffers[b].written);
    }
  }
  return absl::OkStatus();
}

// Graph rewrites that are optimizations only, each run on the latest graph:
// one that rewrites replaces it (dumped to the trace as
// PREFIXFILE_graph.txt), one that fails leaves it as it came (its error in
// PREFIXFILE_error.txt).
class Rewrites {
 public:
  Rewrites(const ir::Graph& graph, std::string prefix, PhaseTimes* times, Trace* trace)
      : latest_(&graph), prefix_(std::move(prefix)), times_(times), trace_(trace) {}

  // `pass(graph, &out)` returns how many rewrites it made, setting `out`
  // when there is one.
  template <typename Pass>
  void Run(const std::string& phase, const std::string& file, Pass pass) {
    ir::Graph out;
    absl::StatusOr<int> n = times_->Time(prefix_ + phase, [&] { return pass(*latest_, &out); });
    if (!n.ok()) {
      (*trace_)[prefix_ + file + "_error.txt"] = std::string(n.status().message());
    } else if (*n > 0) {
      rewritten_ = std::move(out);
      (*trace_)[prefix_ + file + "_graph.txt"] = ir::PrintReadable(rewritten_);
      latest_ = &rewritten_;
    }
  }

  const ir::Graph& graph() const { return *latest_; }

 private:
  const ir::Graph* latest_;
  ir::Graph rewritten_;
  const std::string prefix_;
  PhaseTimes* const times_;
  Trace* const trace_;
};

// Lower, fuse and plan one graph, then generate and compile its kernels.
absl::StatusOr<v1::CompiledGraph> CompileGraph(const ir::Graph& graph, const std::string& prefix,
                                               const target::Target& target,
                                               const codegen::CodegenBackend& backend,
                                               const KilnOptions& options, PhaseTimes* times,
                                               Trace* trace) {
  // Sums of the same product computed once (a decomposed batch norm's
  // backward has two pairs).
  Rewrites rewrites(graph, prefix, times, trace);
  rewrites.Run("merge-sums", "merge_sums", MergeEquivalentSums);
  (*trace)[prefix + "ir_before_fusion.txt"] = ir::PrintReadable(rewrites.graph());
  ASSIGN_OR_RETURN(const ir::Graph faulty, ApplyFault(rewrites.graph(), options.fault));
  // The loop passes (compiler/loop/lowering.h), each timed and dumped.
  ASSIGN_OR_RETURN(std::vector<loop::NodeLowering> nodes, times->Time(prefix + "lower", [&] {
    return loop::LowerNodes(faulty, ops::DefaultRegistry());
  }));
  (*trace)[prefix + "loop_lower.txt"] = loop::PrintNodeLowerings(faulty, nodes);
  ASSIGN_OR_RETURN(loop::FusedGraph fused, times->Time(prefix + "fuse", [&] {
    return loop::Fuse(faulty, nodes, target.fusion_policy());
  }));
  (*trace)[prefix + "loop_fuse.txt"] = loop::PrintFused(faulty, fused);
  loop::LoweredGraph lowered =
      times->Time(prefix + "plan", [&] { return loop::BuildPlan(faulty, std::move(fused)); });
  if (target.multiprocessors() > 0) {
    // A sum over rows of what a row kernel reads joins it, the rows dealt
    // into as many groups as the SMs keep resident (cuda_schedule.h), each
    // group with 8 rows or more.
    const int64_t sms = target.multiprocessors();
    loop::ColumnSumPolicy sums;
    sums.groups = [&backend, sms](const loop::Kernel& k) -> int64_t {
      absl::StatusOr<codegen::LaunchSize> size = backend.Launch(k);
      if (!size.ok() || !size->row_in_registers) return 0;
      int64_t rows = 1;
      for (const ir::SymInt& s : k.outer) {
        if (!s.is_constant()) return 0;
        rows *= s.constant();
      }
      const int64_t groups = std::min<int64_t>(
          sms * std::max(1, codegen::kRowGroupThreadsPerSm / size->block), rows / 8);
      return groups >= sms ? groups : 0;
    };
    times->Time(prefix + "fold-column-sums", [&] { loop::FoldColumnSums(sums, &lowered); });
    // Split what leaves SMs idle into two blocks per SM, so that each has a
    // second block to switch to while the first waits on memory.
    loop::SplitPolicy policy;
    policy.split_below = target.multiprocessors();
    policy.min_blocks = 2 * target.multiprocessors();
    // The column layout's blocks count in threads: one of narrow rows (128
    // threads) is an eighth of one of 1024, so that a channels-last mean
    // over 4096 pixels of 128 x 32 channels is split to 2048 such blocks,
    // as many threads as the 32-lane layout's 512 blocks.
    policy.blocks = [&backend](const loop::Kernel& k) -> std::optional<int64_t> {
      absl::StatusOr<codegen::LaunchSize> size = backend.Launch(k);
      if (!size.ok() || !size->grid.is_constant()) return std::nullopt;
      if (size->rows_per_block > 1 && size->block < 1024) {
        return std::max<int64_t>(1, size->grid.constant() * size->block / 1024);
      }
      return size->grid.constant();
    };
    // A block that reduces several rows at once (the column layout),
    // its warps striding along them, reads 8 or more elements of each
    // per thread in slices of 256: a bias gradient over 4096 rows of 3072
    // columns takes 16 slices (192 blocks) rather than 4 (48 blocks, 62 us
    // with GELU's backward in them on an H100).
    auto several_rows = [&backend](const loop::Kernel& k) {
      absl::StatusOr<codegen::LaunchSize> size = backend.Launch(k);
      return size.ok() && size->rows_per_block > 1;
    };
    policy.min_slice_of = [several_rows, &policy](const loop::Kernel& k) -> int64_t {
      return several_rows(k) ? 256 : policy.min_slice;
    };
    // Those blocks' warps sweep each slice together and then combine
    // through shared memory: where the slices that give every SM two
    // blocks would be many more than needed, fewer longer ones that give
    // nearly every SM two do better. On an H200, in bfloat16: the partial
    // sums over the 8192 rows of [8192, 8192], 36.9 us in 8 slices of 1024
    // rows (256 blocks), 40.4 us in 16 (512 blocks); MLP's GELU gradient
    // beside its bias gradient over [8192, 4096], 75.6 us in 16 slices (256
    // blocks), 82.0 us in 32. Short of that, SMs are left a block alone:
    // GPT-2's tanh GELU gradient and bias gradient over [8192, 3072] took
    // 52.1 us in 16 slices (192 blocks), 48.0 us in 32 (384 blocks).
    policy.fewer_slices_of = several_rows;
    times->Time(prefix + "split-reductions", [&] { loop::SplitReductions(policy, &lowered); });
  }
  times->Time(prefix + "cat-in-place", [&] { loop::WriteCatsInPlace(&lowered); });
  if (target.multiprocessors() > 0) {
    // What the ATen op before a kernel wrote last is read first, from L2.
    times->Time(prefix + "sweep-order", [&] { loop::ReverseAfterExterns(&lowered); });
  }
  if (options.share_kernels) {
    times->Time(prefix + "share-kernels", [&] { loop::ShareIdenticalKernels(&lowered); });
  }
  if (target.multiprocessors() > 0) {
    times->Time(prefix + "streamed-loads", [&] { loop::MarkStreamedLoads(&lowered); });
  }
  times->Time(prefix + "memory-plan", [&] { loop::PlanMemory(&lowered.plan); });
  (*trace)[prefix + "memory_plan.txt"] = loop::PrintSteps(lowered.plan);
  const bool cuda = target.device_type() == "cuda";
  if (cuda && options.tuner != nullptr && options.compile && !lowered.kernels.empty()) {
    absl::Status tuned = times->Time(prefix + "autotune", [&] {
      return options.tuner->Tune(backend, target.proto().sm_arch(), lowered.symbols,
                                 &lowered.kernels, &lowered.decisions, options.compile_jobs);
    });
    // An optimization only: what it did not reach keeps the heuristics.
    if (!tuned.ok()) lowered.decisions.push_back(absl::StrCat("tune: stopped: ", tuned.message()));
  }
  (*trace)[prefix + "ir_after_fusion.txt"] = loop::PrintLowered(lowered);
  v1::CompiledGraph out;
  *out.mutable_plan() = lowered.plan;
  if (lowered.kernels.empty()) return out;
  ASSIGN_OR_RETURN(std::string source, times->Time(prefix + "codegen", [&] {
    return backend.Generate(lowered.kernels, lowered.symbols);
  }));
  (*trace)[absl::StrCat(prefix, "generated_code", cuda ? ".cu" : ".cc")] = source;
  if (cuda) RETURN_IF_ERROR(SizeLaunches(lowered.kernels, backend, out.mutable_plan()));
  if (!options.compile) {
    v1::CompiledModule* module = out.add_modules();
    module->set_language(backend.language());
    module->set_source(std::move(source));
    return out;
  }
  auto modules = times->Time(prefix + "native-compile", [&] {
    return codegen::CompileModules(backend, lowered.kernels, lowered.symbols, options.compile_jobs,
                                   options.compile_slots, options.kernel_cache,
                                   /*urgent=*/options.toolchain.quick);
  });
  if (!modules.ok()) {
    // The whole compiler log, when the code generator attached it.
    auto log = modules.status().GetPayload(codegen::kCompilerLogPayload);
    (*trace)[prefix + "compile_error.txt"] =
        log.has_value() ? std::string(*log) : std::string(modules.status().message());
    return modules.status();
  }
  for (v1::PlanStep& step : *out.mutable_plan()->mutable_steps()) {
    if (!step.has_launch()) continue;
    auto it = modules->module_of.find(step.launch().symbol());
    if (it == modules->module_of.end()) {
      return absl::InternalError(
          absl::StrCat("plan launches '", step.launch().symbol(), "', which no module defines"));
    }
    step.mutable_launch()->set_module(it->second);
    if (auto renamed = modules->symbol_of.find(step.launch().symbol());
        renamed != modules->symbol_of.end()) {
      step.mutable_launch()->set_symbol(renamed->second);
    }
  }
  if (!modules->reused.empty()) {
    std::string text;
    for (const std::string& name : modules->reused) {
      auto renamed = modules->symbol_of.find(name);
      absl::StrAppend(&text, name, ": module ", modules->module_of.at(name), ", compiled before",
                      renamed == modules->symbol_of.end() ? "" : " as " + renamed->second, "\n");
    }
    (*trace)[prefix + "kernels_reused.txt"] = text;
  }
  for (v1::CompiledModule& m : modules->modules) *out.add_modules() = std::move(m);
  return out;
}

}  // namespace

void PhaseTimes::Add(const std::string& name, int64_t micros) {
  v1::PhaseTime t;
  t.set_phase(name);
  t.set_micros(micros);
  phases_.push_back(std::move(t));
}

bool AnyInputRequiresGrad(const ir::Graph& graph) {
  for (const auto& in : graph.inputs()) {
    if (graph.value(in.value).meta.requires_grad) return true;
  }
  return false;
}

void RunEager(const ir::Graph& graph, PhaseTimes* times, v1::Artifact* artifact) {
  *artifact->mutable_graph() = times->Time("canonicalize", [&] { return ir::Canonicalize(graph); });
  artifact->mutable_graph()->set_name(graph.name());
}

absl::Status RunAotEager(const ir::Graph& graph, PhaseTimes* times, v1::Artifact* artifact) {
  RunEager(graph, times, artifact);
  ASSIGN_OR_RETURN(Split split, JointAndPartition(graph, times));
  FillAutograd(split.joint, split.partition, artifact->mutable_autograd());
  return absl::OkStatus();
}

absl::StatusOr<KilnOptions::ChannelsLast> ParseChannelsLast(absl::string_view text) {
  using ChannelsLast = KilnOptions::ChannelsLast;
  if (text == "never") return ChannelsLast::kNever;
  if (text == "inference") return ChannelsLast::kInference;
  if (text == "always") return ChannelsLast::kAlways;
  return absl::InvalidArgumentError(
      absl::StrCat("channels_last: '", text.substr(0, 32), "' is not never, inference or always"));
}

absl::Status RunKiln(const ir::Graph& graph, const v1::Target& wanted, const KilnOptions& options,
                     PhaseTimes* times, Trace* trace, v1::Artifact* artifact) {
  (*trace)["input_graph.txt"] = ir::PrintReadable(graph);
  ASSIGN_OR_RETURN(std::unique_ptr<target::Target> target, target::SelectTarget(wanted, graph));
  std::unique_ptr<codegen::CodegenBackend> backend = target->MakeCodegen(options.toolchain);

  const bool training = AnyInputRequiresGrad(graph);
  // On CUDA, graph rewrites before lowering (in training graphs before the
  // joint graph is built, so that the backward derives from their result).
  Rewrites rewrites(graph, "", times, trace);
  if (target->device_type() == "cuda") {
    // One fused attention kernel for softmax attention spelled as matmuls,
    // whose backward is the fused kernel's. SelectTarget checked the arch's
    // form.
    absl::StatusOr<cuda::SmArch> arch = cuda::ParseSmArch(target->proto().sm_arch());
    AttentionOptions attention;
    attention.flash = arch.ok() && arch->major >= 8;
    attention.training = training;
    rewrites.Run("attention", "attention", [&](const ir::Graph& g, ir::Graph* out) {
      return RewriteAttention(g, out, attention);
    });
    // Copies the graph could read around: attention's output copied into
    // the matmul's layout and then back into the kernel's.
    rewrites.Run("elide-copies", "elide_copies", ElideCopies);
    // Without gradients, a linear layer's tanh GELU as cuBLASLt's
    // epilogue of its GEMM.
    if (!training) {
      rewrites.Run("addmm-activation", "addmm_activation", FuseAddmmActivations);
    }
    // float32 addmm as a GEMM and a bias add fused into its reader.
    rewrites.Run("unfuse-addmm", "unfuse_addmm", UnfuseAddmm);
    // Copies that transpose a matmul's operand made along memory instead.
    rewrites.Run("matmul-layouts", "matmul_layouts", TransposeMatmulCopies);
    // Convolutions channels-last, the layout cuDNN's kernels run in.
    using ChannelsLast = KilnOptions::ChannelsLast;
    if (options.channels_last == ChannelsLast::kAlways ||
        (options.channels_last == ChannelsLast::kInference && !training)) {
      rewrites.Run("conv-layouts", "conv_layouts", ChannelsLastConvolutions);
    }
  }
  if (!training) {
    ASSIGN_OR_RETURN(*artifact->mutable_compiled(),
                     CompileGraph(rewrites.graph(), "", *target, *backend, options, times, trace));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Split split, JointAndPartition(rewrites.graph(), times));
  (*trace)["joint_graph.txt"] = ir::PrintReadable(split.joint.graph);
  (*trace)["forward_graph.txt"] = ir::PrintReadable(split.partition.forward);
  (*trace)["backward_graph.txt"] = ir::PrintReadable(split.partition.backward);
  FillAutograd(split.joint, split.partition, artifact->mutable_autograd());
  // The two halves at once, the backward on a thread of its own with its own
  // times and trace, merged after (the forward's first, as if in turn).
  PhaseTimes backward_times;
  Trace backward_trace;
  std::optional<absl::StatusOr<v1::CompiledGraph>> backward;
  std::thread backward_thread([&] {
    backward = CompileGraph(split.partition.backward, "backward_", *target, *backend, options,
                            &backward_times, &backward_trace);
  });
  absl::StatusOr<v1::CompiledGraph> forward =
      CompileGraph(split.partition.forward, "forward_", *target, *backend, options, times, trace);
  backward_thread.join();
  for (const v1::PhaseTime& t : backward_times.phases()) times->Add(t.phase(), t.micros());
  trace->merge(backward_trace);
  if (!forward.ok()) return forward.status();
  if (!backward->ok()) return backward->status();
  *artifact->mutable_compiled_forward() = *std::move(forward);
  *artifact->mutable_compiled_backward() = **std::move(backward);
  return absl::OkStatus();
}

void FillAutograd(const autograd::JointGraph& joint, const autograd::Partition& split,
                  v1::AutogradGraphs* out) {
  split.forward.ToProto(out->mutable_forward());
  split.backward.ToProto(out->mutable_backward());
  joint.graph.ToProto(out->mutable_joint());
  out->set_num_forward_outputs(split.num_forward_outputs);
  for (const auto& s : split.saved) out->add_saved(s);
  out->set_saved_bytes(split.saved_bytes);
  for (bool b : joint.inputs_need_grad) out->add_inputs_need_grad(b);
  for (bool b : joint.outputs_receive_grad) out->add_outputs_receive_grad(b);
  std::vector<int> by_output(joint.graph.outputs().size() - joint.num_forward_outputs, -1);
  for (size_t i = 0; i < joint.grad_output_index.size(); ++i) {
    if (joint.grad_output_index[i] >= 0) {
      by_output[joint.grad_output_index[i] - joint.num_forward_outputs] = static_cast<int>(i);
    }
  }
  for (int i : by_output) out->add_grad_input_index(i);
  for (const auto& r : split.recomputed) out->add_recomputed(r);
}

}  // namespace kiln::pipeline
