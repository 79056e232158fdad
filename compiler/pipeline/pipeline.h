// The compile pipeline (docs/architecture.md §5): what runs after
// verification, in order, for each backend.
//
//   eager:      canonicalize
//   aot_eager:  canonicalize, joint graph, min-cut partition
//   kiln:       choose the target (compiler/target/target.h) from the options
//               and the graph's devices; on cuda, fuse softmax attention;
//               for training, joint graph and partition; then for the graph
//               (or each half, the two at once): the loop passes lower, fuse, plan,
//               split-reductions (cuda) and memory-plan
//               (compiler/loop/lowering.h), autotune (cuda, when given a
//               tuner), generate, compile with the target's toolchain (as
//               up to compile_jobs modules at once), and size the GPU
//               launches.
//
// kilnd's backends (server/backend.h) call these and add nothing but the
// artifact's common fields. Every stage is timed in `times` and leaves its
// output in `trace` as it finishes, so a failed compile still shows how far
// it got: for each graph "[forward_|backward_]" ir_before_fusion.txt,
// loop_lower.txt, loop_fuse.txt, ir_after_fusion.txt (the kernels and plan
// after every loop pass), memory_plan.txt and generated_code.<cc|cu> (every
// kernel in one file, though the modules may compile it in parts).
//
// Thread-safe: pure functions of their arguments (but for the tuner's
// cache of block sizes).
#ifndef KILN_COMPILER_PIPELINE_PIPELINE_H_
#define KILN_COMPILER_PIPELINE_PIPELINE_H_

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/autograd/partition.h"
#include "compiler/codegen/cuda_tuner.h"
#include "compiler/codegen/modules.h"
#include "compiler/ir/graph.h"
#include "compiler/pipeline/fault.h"
#include "compiler/target/target.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::pipeline {

// Collects the time of each named phase, in order.
class PhaseTimes {
 public:
  // Times `fn` as phase `name` and returns its result.
  template <typename Fn>
  auto Time(const std::string& name, Fn&& fn) {
    const absl::Time start = absl::Now();
    struct Record {
      PhaseTimes* self;
      std::string name;
      absl::Time start;
      ~Record() { self->Add(name, absl::ToInt64Microseconds(absl::Now() - start)); }
    } record{this, name, start};
    return fn();
  }
  void Add(const std::string& name, int64_t micros);
  const std::vector<v1::PhaseTime>& phases() const { return phases_; }

 private:
  std::vector<v1::PhaseTime> phases_;
};

using Trace = std::map<std::string, std::string>;

// Whether an input of `graph` requires grad: the kiln and aot_eager
// backends then build the joint forward/backward graph.
bool AnyInputRequiresGrad(const ir::Graph& graph);

// eager: the canonical graph into artifact->graph.
void RunEager(const ir::Graph& graph, PhaseTimes* times, v1::Artifact* artifact);

// aot_eager: RunEager, then the forward/backward split into
// artifact->autograd.
absl::Status RunAotEager(const ir::Graph& graph, PhaseTimes* times, v1::Artifact* artifact);

struct KilnOptions {
  target::ToolchainOptions toolchain;
  Fault fault;  // compiler/pipeline/fault.h; none by default
  // false: stop after generating the code (no toolchain run; modules hold
  // the source only).
  bool compile = true;
  // cuda: block sizes timed on this GPU before the code is generated
  // (compiler/codegen/cuda_tuner.h); null: the schedule's heuristics.
  codegen::CudaTuner* tuner = nullptr;
  // Native compiler processes per graph: its kernels are compiled as up to
  // this many modules at once (compiler/codegen/modules.h), each in a slot
  // of `compile_slots` where given.
  int compile_jobs = 1;
  codegen::CompileSlots* compile_slots = nullptr;
  // Kernels compiled before, in any graph, are taken from here rather than
  // compiled again (compiler/codegen/kernel_cache.h); null: each compiled.
  codegen::KernelCache* kernel_cache = nullptr;
  // Kernels of the same code compiled once (compiler/loop/share_kernels.h);
  // false only to measure what that saves (kiln_dump_code
  // --share_kernels=false).
  bool share_kernels = true;
  // cuda: the graphs whose 16-bit 2-D convolutions run channels-last
  // (compiler/pipeline/conv_layouts.h). Training graphs only when asked:
  // the bench's conv net trained slower channels-last.
  enum class ChannelsLast { kNever, kInference, kAlways };
  ChannelsLast channels_last = ChannelsLast::kInference;
};

// kiln: artifact->compiled for inference, or artifact->autograd with
// compiled_forward and compiled_backward when an input requires grad.
// `wanted` is the normalized options' target. Generated sources are in
// `trace` as "[forward_|backward_]generated_code.<cc|cu>".
absl::Status RunKiln(const ir::Graph& graph, const v1::Target& wanted, const KilnOptions& options,
                     PhaseTimes* times, Trace* trace, v1::Artifact* artifact);

// KilnOptions::channels_last from its flag's spelling: never, inference or
// always; INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<KilnOptions::ChannelsLast> ParseChannelsLast(absl::string_view text);

// The forward/backward split in wire form.
void FillAutograd(const autograd::JointGraph& joint, const autograd::Partition& split,
                  v1::AutogradGraphs* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_PIPELINE_H_
