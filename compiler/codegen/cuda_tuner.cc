#include "compiler/codegen/cuda_tuner.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cuda_driver.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/codegen/modules.h"

namespace kiln::codegen {
namespace {

bool AllConstant(const std::vector<ir::SymInt>& v) {
  return std::all_of(v.begin(), v.end(), [](const ir::SymInt& s) { return s.is_constant(); });
}

// The bytes of each buffer `k` reaches (the largest element offset of its
// accesses, plus one element); nullopt when a size, stride or offset is
// symbolic or negative, or when the kernel gathers or scatters (where it
// reaches, and how fast, depends on the indices' values: such a kernel
// keeps the heuristic's launch).
std::optional<std::vector<int64_t>> BufferBytes(const loop::Kernel& k) {
  if (!AllConstant(k.outer) || !AllConstant(k.inner)) return std::nullopt;
  std::vector<int64_t> elements(k.buffers.size(), 1);
  for (const loop::Stmt& s : k.stmts) {
    if (s.kind == loop::StmtKind::kGather || s.kind == loop::StmtKind::kScatterAdd) {
      return std::nullopt;
    }
    if (s.kind != loop::StmtKind::kLoad && s.kind != loop::StmtKind::kStore) continue;
    if (s.buffer < 0 || s.buffer >= static_cast<int>(k.buffers.size())) return std::nullopt;
    const loop::Index& x = s.index;
    if (!x.offset.is_constant() || x.offset.constant() < 0 || !AllConstant(x.outer_strides) ||
        !AllConstant(x.inner_strides)) {
      return std::nullopt;
    }
    int64_t last = x.offset.constant();
    auto reach = [&](const std::vector<ir::SymInt>& sizes, const std::vector<ir::SymInt>& strides) {
      for (size_t d = 0; d < sizes.size() && d < strides.size(); ++d) {
        if (sizes[d].constant() > 0)
          last += (sizes[d].constant() - 1) * std::abs(strides[d].constant());
      }
    };
    reach(k.outer, x.outer_strides);
    reach(k.inner, x.inner_strides);
    elements[s.buffer] = std::max(elements[s.buffer], last + 1);
  }
  std::vector<int64_t> bytes(k.buffers.size());
  for (size_t b = 0; b < k.buffers.size(); ++b) {
    bytes[b] = elements[b] * StorageBytes(k.buffers[b].dtype);
  }
  return bytes;
}

// What the cache knows a kernel by: its code, whatever block it had.
std::string CacheKey(const std::string& sm_arch, const loop::Kernel& k) {
  loop::Kernel untuned = k;
  untuned.block = 0;
  return Sha256Hex(absl::StrCat(sm_arch, "\n", loop::KernelCode(untuned)));
}

constexpr int64_t kMaxTuneBytes = int64_t{4} << 30;
// Kernels that move less than this (about 10 us at an H100's bandwidth)
// are not worth the compile time their variants cost.
constexpr int64_t kMinTuneBytes = int64_t{32} << 20;
// A candidate replaces the heuristic only when this much faster.
constexpr double kMinGain = 0.03;

}  // namespace

#ifdef KILN_HAVE_CUDA_DRIVER

namespace {

// Device memory for one kernel's buffers, freed on scope exit.
class Buffers {
 public:
  explicit Buffers(cuda::Driver& d) : d_(d) {}
  ~Buffers() {
    for (CUdeviceptr p : ptrs_) d_.cuMemFree(p);
  }
  absl::Status Allocate(const std::vector<int64_t>& bytes) {
    for (int64_t n : bytes) {
      CUdeviceptr p = 0;
      const size_t size = static_cast<size_t>(std::max<int64_t>(n, 16));
      RETURN_IF_ERROR(d_.Check(d_.cuMemAlloc(&p, size), "cuMemAlloc"));
      ptrs_.push_back(p);
      RETURN_IF_ERROR(d_.Check(d_.cuMemsetD8(p, 0, size), "cuMemsetD8"));
    }
    return absl::OkStatus();
  }
  const std::vector<CUdeviceptr>& ptrs() const { return ptrs_; }

 private:
  cuda::Driver& d_;
  std::vector<CUdeviceptr> ptrs_;
};

class Events {
 public:
  explicit Events(cuda::Driver& d) : d_(d) {
    d_.cuEventCreate(&start_, CU_EVENT_DEFAULT);
    d_.cuEventCreate(&end_, CU_EVENT_DEFAULT);
  }
  ~Events() {
    if (start_ != nullptr) d_.cuEventDestroy(start_);
    if (end_ != nullptr) d_.cuEventDestroy(end_);
  }
  // Milliseconds `launches` runs of `launch` take, or an error.
  template <typename Launch>
  absl::StatusOr<double> Time(int launches, Launch&& launch) {
    if (start_ == nullptr || end_ == nullptr) return absl::InternalError("cuEventCreate failed");
    RETURN_IF_ERROR(d_.Check(d_.cuEventRecord(start_, nullptr), "cuEventRecord"));
    for (int i = 0; i < launches; ++i) {
      if (absl::Status s = launch(); !s.ok()) return s;
    }
    RETURN_IF_ERROR(d_.Check(d_.cuEventRecord(end_, nullptr), "cuEventRecord"));
    RETURN_IF_ERROR(d_.Check(d_.cuEventSynchronize(end_), "cuEventSynchronize"));
    float ms = 0;
    RETURN_IF_ERROR(d_.Check(d_.cuEventElapsedTime(&ms, start_, end_), "cuEventElapsedTime"));
    return static_cast<double>(ms);
  }

 private:
  cuda::Driver& d_;
  CUevent start_ = nullptr, end_ = nullptr;
};

// Milliseconds per launch of `fn` over `params`: repetitions of at least
// ~0.2 ms, the fastest of three.
absl::StatusOr<double> TimeKernel(cuda::Driver& d, CUfunction fn, const LaunchSize& size,
                                  std::vector<uint64_t>& params) {
  if (!size.grid.is_constant() || size.grid.constant() <= 0 ||
      size.grid.constant() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("the launch's grid is not a positive constant");
  }
  size_t bytes = 8 * params.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &bytes, CU_LAUNCH_PARAM_END};
  auto launch = [&]() -> absl::Status {
    return d.Check(
        d.cuLaunchKernel(fn, static_cast<unsigned>(size.grid.constant()), 1, 1,
                         static_cast<unsigned>(size.block), 1, 1, 0, nullptr, nullptr, extra),
        "cuLaunchKernel");
  };
  Events events(d);
  ASSIGN_OR_RETURN(double once, events.Time(1, launch));  // also the warm-up
  const int launches = static_cast<int>(std::clamp(0.2 / std::max(once, 1e-4), 1.0, 50.0));
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    ASSIGN_OR_RETURN(double ms, events.Time(launches, launch));
    best = std::min(best, ms / launches);
  }
  return best;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTuner>> CudaTuner::Open(int device) {
  ASSIGN_OR_RETURN(cuda::Driver * d, cuda::GetDriver());
  int count = 0;
  if (d->cuDeviceGetCount(&count) != CUDA_SUCCESS || device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device ", device, " (the driver sees ", count, ")"));
  }
  CUdevice dev;
  RETURN_IF_ERROR(d->Check(d->cuDeviceGet(&dev, device), "cuDeviceGet"));
  int major = 0, minor = 0;
  d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  char name[256] = {};
  d->cuDeviceGetName(name, sizeof(name) - 1, dev);
  return std::unique_ptr<CudaTuner>(
      new CudaTuner(device, absl::StrCat(name, ", sm_", major, minor), major, minor));
}

absl::Status CudaTuner::Warm() {
  ASSIGN_OR_RETURN(cuda::Driver * d, cuda::GetDriver());
  return cuda::PrimaryContext(*d, device_).status();
}

absl::Status CudaTuner::Tune(const CodegenBackend& backend, const std::string& sm_arch,
                             const std::vector<std::string>& symbols,
                             std::vector<loop::Kernel>* kernels,
                             std::vector<std::string>* decisions, int compile_jobs) {
  ASSIGN_OR_RETURN(cuda::SmArch arch, cuda::ParseSmArch(sm_arch));
  if (!cuda::Runs(arch, major_, minor_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot tune ", sm_arch, " code on ", device_name_, ": the device does not run it"));
  }
  // Kernels to time: each once (two kernels alike share a choice).
  struct Job {
    size_t kernel;
    std::vector<size_t> alike;  // later kernels with the same key
    std::string key;
    std::vector<int> candidates;
    std::vector<int64_t> bytes;
  };
  std::vector<Job> jobs;
  std::vector<loop::Kernel> variants;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < kernels->size(); ++i) {
      loop::Kernel& k = (*kernels)[i];
      std::string key = CacheKey(sm_arch, k);
      auto same =
          std::find_if(jobs.begin(), jobs.end(), [&](const Job& j) { return j.key == key; });
      if (same != jobs.end()) {
        same->alike.push_back(i);
        continue;
      }
      if (auto it = chosen_.find(key); it != chosen_.end()) {
        k.block = it->second;
        decisions->push_back(absl::StrCat("tune: ", k.name, ": ",
                                          it->second > 0 ? absl::StrCat("block ", it->second)
                                                         : std::string("the heuristic's block"),
                                          " (tuned before)"));
        continue;
      }
      std::vector<int> candidates = BlockCandidates(k);
      std::optional<std::vector<int64_t>> bytes = BufferBytes(k);
      int64_t total = 0;
      for (int64_t b : bytes.value_or(std::vector<int64_t>{})) total += b;
      const char* why = candidates.size() < 2 ? "one block size fits its layout"
                        : !bytes              ? "its sizes are symbolic, or it gathers or scatters"
                        : total > kMaxTuneBytes ? "its buffers take over 4 GiB"
                        : total < kMinTuneBytes ? "it moves under 32 MiB"
                                                : nullptr;
      if (why != nullptr) {
        decisions->push_back(absl::StrCat("tune: ", k.name, " keeps the heuristic: ", why));
        continue;
      }
      for (int block : candidates) {
        loop::Kernel v = k;
        v.name = absl::StrCat(k.name, "_b", block);
        v.block = block;
        variants.push_back(std::move(v));
      }
      jobs.push_back({i, {}, std::move(key), std::move(candidates), *std::move(bytes)});
    }
  }
  if (jobs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(CompiledModules compiled,
                   CompileModules(backend, variants, symbols, compile_jobs));

  ASSIGN_OR_RETURN(cuda::Driver * d, cuda::GetDriver());
  ASSIGN_OR_RETURN(CUcontext ctx, cuda::PrimaryContext(*d, device_));
  absl::MutexLock device_lock(&device_mu_);
  cuda::ScopedContext scoped(*d, ctx);
  struct Unload {
    cuda::Driver* d;
    std::vector<CUmodule> modules;
    ~Unload() {
      for (CUmodule m : modules) d->cuModuleUnload(m);
    }
  } loaded{d, {}};
  for (const v1::CompiledModule& module : compiled.modules) {
    CUmodule m;
    RETURN_IF_ERROR(d->Check(d->cuModuleLoadData(&m, module.binary().data()), "cuModuleLoadData"));
    loaded.modules.push_back(m);
  }

  std::vector<std::pair<size_t, int>> results;  // (job, block; 0: the heuristic)
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    const loop::Kernel& k = (*kernels)[job.kernel];
    Buffers buffers(*d);
    RETURN_IF_ERROR(buffers.Allocate(job.bytes));
    std::vector<uint64_t> params;
    for (CUdeviceptr p : buffers.ptrs()) params.push_back(static_cast<uint64_t>(p));
    params.resize(params.size() + symbols.size(), 0);  // constant kernels read no symbol
    loop::Kernel heuristic = k;
    heuristic.block = 0;
    const int default_block = ScheduleOf(heuristic).block;
    std::vector<std::string> timings;
    double default_ms = std::numeric_limits<double>::infinity();
    double best_ms = std::numeric_limits<double>::infinity();
    int best = 0;
    for (int block : job.candidates) {
      loop::Kernel v = k;
      v.name = absl::StrCat(k.name, "_b", block);
      v.block = block;
      ASSIGN_OR_RETURN(LaunchSize size, backend.Launch(v));
      CUfunction fn;
      RETURN_IF_ERROR(
          d->Check(d->cuModuleGetFunction(&fn, loaded.modules[compiled.module_of.at(v.name)],
                                          v.name.c_str()),
                   "cuModuleGetFunction"));
      absl::StatusOr<double> ms = TimeKernel(*d, fn, size, params);
      if (!ms.ok()) {
        // Too many registers for this block, say: not a candidate. Anything
        // else may have left the context unusable: stop.
        if (absl::StrContains(ms.status().message(), "too many resources")) {
          timings.push_back(absl::StrCat(block, ": does not launch"));
          continue;
        }
        return ms.status();
      }
      timings.push_back(absl::StrCat(block, ": ", absl::StrFormat("%.4f", *ms), " ms"));
      if (block == default_block) default_ms = *ms;
      if (*ms < best_ms) {
        best_ms = *ms;
        best = block;
      }
    }
    const bool better = best != default_block && best_ms < default_ms * (1 - kMinGain);
    results.emplace_back(j, better ? best : 0);
    decisions->push_back(absl::StrCat("tune: ", k.name, ": ",
                                      better
                                          ? absl::StrCat("block ", best)
                                          : absl::StrCat("the heuristic's block ", default_block),
                                      " (", absl::StrJoin(timings, ", "), ")"));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [j, block] : results) {
    (*kernels)[jobs[j].kernel].block = block;
    for (size_t i : jobs[j].alike) {
      (*kernels)[i].block = block;
      decisions->push_back(absl::StrCat("tune: ", (*kernels)[i].name, ": as ",
                                        (*kernels)[jobs[j].kernel].name, ", the same kernel"));
    }
    chosen_[jobs[j].key] = block;
    ++tuned_;
  }
  return absl::OkStatus();
}

#else  // !KILN_HAVE_CUDA_DRIVER

absl::Status CudaTuner::Warm() {
  return absl::UnavailableError("built without the CUDA toolkit's cuda.h: no autotuning");
}

absl::StatusOr<std::unique_ptr<CudaTuner>> CudaTuner::Open(int) {
  return absl::UnavailableError("built without the CUDA toolkit's cuda.h: no autotuning");
}

absl::Status CudaTuner::Tune(const CodegenBackend&, const std::string&,
                             const std::vector<std::string>&, std::vector<loop::Kernel>*,
                             std::vector<std::string>*, int) {
  return absl::UnavailableError("built without the CUDA toolkit's cuda.h: no autotuning");
}

#endif  // KILN_HAVE_CUDA_DRIVER

int64_t CudaTuner::kernels_tuned() const {
  absl::MutexLock lock(&mu_);
  return tuned_;
}

}  // namespace kiln::codegen
