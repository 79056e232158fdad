// The CUDA backend's kernels with reductions: rows swept by a block (kept in
// registers across passes where they fit) or 32 rows per block in the
// column layout, each pass's accumulators combined by warp shuffles and
// shared memory, and the statements after each sweep.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/cuda_codegen_internal.h"
#include "compiler/codegen/cuda_schedule.h"

namespace kiln::codegen::cuda_internal {

std::string CudaKernelEmitter::Identity(int j) const {
  const CType t = type_[j];
  switch (k_.stmts[j].reduce) {
    case ReduceOp::kMax:
      return IsFloat(t) ? absl::StrCat("-", Limit(t, "infinity", kCudaDialect))
                        : Limit(t, "lowest", kCudaDialect);
    case ReduceOp::kMin:
      return IsFloat(t) ? Limit(t, "infinity", kCudaDialect) : Limit(t, "max", kCudaDialect);
    default:
      return absl::StrCat(CName(t), "(0)");
  }
}

const char* CudaKernelEmitter::Combiner(ReduceOp op) {
  return op == ReduceOp::kMax ? "kiln_max()" : op == ReduceOp::kMin ? "kiln_min()" : "kiln_add()";
}

bool CudaKernelEmitter::Costly(loop::ScalarOp op) {
  using loop::ScalarOp;
  return IsTranscendental(op) || op == ScalarOp::kSqrt || op == ScalarOp::kRsqrt ||
         op == ScalarOp::kReciprocal || op == ScalarOp::kDiv || op == ScalarOp::kPow;
}

bool CudaKernelEmitter::SameLoad(int a, int b) const {
  return SameElement(k_.stmts[a], k_.stmts[b]) && type_[a] == type_[b];
}

std::vector<int> CudaKernelEmitter::CacheOf() const {
  const int n = static_cast<int>(k_.stmts.size());
  // The first statement of the sweeps that computes the value j does.
  std::vector<int> same(n);
  for (int j = 0; j < n; ++j) {
    same[j] = j;
    const Stmt& s = k_.stmts[j];
    if (!s.inner || s.kind == StmtKind::kReduce || s.kind == StmtKind::kStore ||
        s.kind == StmtKind::kAccumulate) {
      continue;
    }
    if (s.kind == StmtKind::kOp && s.op == loop::ScalarOp::kCast && type_[s.args[0]] == type_[j]) {
      same[j] = same[s.args[0]];  // a copy of a value is that value
      continue;
    }
    for (int q = 0; q < j; ++q) {
      const Stmt& t = k_.stmts[q];
      if (same[q] != q || !t.inner || t.kind != s.kind || type_[q] != type_[j]) continue;
      bool equal = false;
      if (s.kind == StmtKind::kLoad) {
        equal = SameLoad(q, j);
      } else if (s.kind == StmtKind::kGather || s.kind == StmtKind::kIndex ||
                 s.kind == StmtKind::kScatterAdd) {
        // Not the same value unless the same statement (its buffer and
        // positions are not compared here).
        equal = false;
      } else if (s.kind == StmtKind::kConstant) {
        equal = t.constant == s.constant;
      } else {
        equal = t.op == s.op && t.dtype == s.dtype && t.args.size() == s.args.size();
        for (size_t a = 0; equal && a < s.args.size(); ++a) {
          equal = same[t.args[a]] == same[s.args[a]];
        }
      }
      if (equal) {
        same[j] = q;
        break;
      }
    }
  }
  // A statement of a later pass that an earlier pass computed.
  auto repeated = [&](int j) { return same[j] != j && k_.stmts[same[j]].pass < k_.stmts[j].pass; };

  // Which values to keep is a minimum vertex cut: between what the later
  // passes use of the earlier passes' values (the first repeated value
  // along each argument of a new statement) and what cannot be computed
  // again, loads (the row is in registers so as not to be read twice) and
  // costly ops. A value kept costs its registers; one not kept is computed
  // again from kept ones. A sum of four tensors that a layer norm
  // normalizes is one value kept rather than four loads; softmax keeps its
  // input and its exp. Vertex v is nodes 2v (in) and 2v + 1 (out), of
  // capacity 1; the source and sink follow.
  const int source = 2 * n, sink = 2 * n + 1;
  constexpr int kAll = 1 << 20;
  std::vector<std::vector<int>> next(2 * n + 2);  // arcs, as indices into `to`
  std::vector<int> to, capacity;
  auto arc = [&](int from, int at, int cap) {
    next[from].push_back(static_cast<int>(to.size()));
    to.push_back(at);
    capacity.push_back(cap);
    next[at].push_back(static_cast<int>(to.size()));
    to.push_back(from);
    capacity.push_back(0);
  };
  std::vector<bool> in_network(n, false);
  std::vector<int> pending;
  auto add = [&](int q) {
    if (in_network[q]) return;
    in_network[q] = true;
    pending.push_back(q);
  };
  for (int u = 0; u < n; ++u) {
    const Stmt& s = k_.stmts[u];
    if (!s.inner || repeated(u)) continue;
    for (int a : s.args) {
      if (!repeated(a)) continue;
      add(same[a]);
      arc(source, 2 * same[a], kAll);
    }
  }
  while (!pending.empty()) {
    const int q = pending.back();
    pending.pop_back();
    const Stmt& s = k_.stmts[q];
    arc(2 * q, 2 * q + 1, 1);
    if (s.kind == StmtKind::kLoad || (s.kind == StmtKind::kOp && Costly(s.op))) {
      arc(2 * q + 1, sink, kAll);
      continue;
    }
    for (int a : s.args) {
      // The pass's own values, and earlier sweeps' reductions, are there
      // anyway.
      if (!k_.stmts[a].inner || k_.stmts[a].kind == StmtKind::kReduce) continue;
      add(same[a]);
      arc(2 * q + 1, 2 * same[a], kAll);
    }
  }
  // Augmenting paths (as many as values kept, a handful), then the nodes
  // the source still reaches: a vertex whose in-node it reaches and whose
  // out-node it does not is kept (the cut nearest the uses).
  std::vector<int> via(2 * n + 2);
  auto reach = [&]() {
    std::fill(via.begin(), via.end(), -1);
    via[source] = -2;
    std::vector<int> queue = {source};
    for (size_t head = 0; head < queue.size(); ++head) {
      for (int e : next[queue[head]]) {
        if (capacity[e] > 0 && via[to[e]] == -1) {
          via[to[e]] = e;
          queue.push_back(to[e]);
        }
      }
    }
    return via[sink] != -1;
  };
  while (reach()) {
    for (int v = sink; v != source; v = to[via[v] ^ 1]) {
      --capacity[via[v]];
      ++capacity[via[v] ^ 1];
    }
  }
  std::vector<bool> kept(n, false);
  for (int q = 0; q < n; ++q) kept[q] = in_network[q] && via[2 * q] != -1 && via[2 * q + 1] == -1;

  // Each later pass reads its kept values from registers and computes the
  // others it needs again; what it repeats and does not need, it skips.
  std::vector<int> cache_of(n, kNotCached);
  std::vector<bool> needed(n, false);
  for (int j = n - 1; j >= 0; --j) {
    const Stmt& s = k_.stmts[j];
    if (!s.inner) continue;
    if (repeated(j)) {
      if (!needed[j]) {
        cache_of[j] = kSkipped;
        continue;
      }
      if (kept[same[j]]) {
        cache_of[j] = same[j];
        continue;
      }
    }
    for (int a : s.args) needed[a] = true;
  }
  return cache_of;
}

absl::Status CudaKernelEmitter::EmitReduction(const Schedule& sched, std::string* out) {
  RETURN_IF_ERROR(Sizes(out));
  const bool column = sched.layout == Layout::kColumn;
  const bool cached = sched.per_thread > 0;
  const std::vector<int> prefetched = PrefetchedLoads(k_, sched);
  // kColumn in groups: each lane takes one row of each of `groups` groups
  // of 32 rows, its accumulators arrays indexed by the group g (`at`);
  // packed, `groups` adjacent rows, read as vectors.
  const int groups = column ? sched.column_groups : 1;
  const bool packed = groups > 1 && sched.column_packed;
  // The lanes along the rows (32, or fewer for narrow rows: the warp's
  // other lanes take later steps of the sweep) and the rows of a tile.
  const int row_lanes = column ? sched.column_lanes : 1;
  const bool narrow = column && row_lanes < kColumnRows;
  // Shared memory for the combination of one value per warp (kRow) or
  // 32 x 32 values (kColumn, padded), three for Welford; for the wide
  // column layout in groups, every group's values at once
  // (kiln_column_reduce_groups), where they fit in 48 KB.
  int64_t smem_doubles = column ? 3 * 32 * 33 : 96;
  const bool reduce_groups = column && !narrow && groups > 1 && sched.block == 32 * kColumnRows;
  if (reduce_groups) {
    for (size_t j = 0; j < k_.stmts.size(); ++j) {
      if (k_.stmts[j].kind != StmtKind::kReduce || IsWelford(k_.stmts[j])) continue;
      const int64_t bytes = int64_t{groups} * 32 * 34 * CBytes(type_[j]);
      smem_doubles = std::max(smem_doubles, (bytes + 7) / 8);
    }
  }
  const bool grouped_reduce = reduce_groups && smem_doubles * 8 <= 48 * 1024;
  if (!grouped_reduce) smem_doubles = column ? 3 * 32 * 33 : 96;
  absl::StrAppend(out, "  __shared__ double kiln_smem[", smem_doubles, "];\n");
  if (sched.vector > 1) {
    RETURN_IF_ERROR(DeclareVectors(sched.vector, sched.vector_dim, sched.vector_checks, out));
  }
  std::string live;
  const std::string at = groups > 1 ? "[g]" : "";
  // Whether a row exists: a constant where the rows, constant in number,
  // fill whole tiles.
  int64_t rows = 1;
  for (const ir::SymInt& d : k_.outer) {
    const bool fits = d.is_constant() && d.constant() >= 0 && d.constant() < (int64_t{1} << 31) &&
                      rows < (int64_t{1} << 31);
    rows = fits ? rows * d.constant() : 0;
  }
  const std::string live_row = rows > 0 && rows % (row_lanes * groups) == 0
                                   ? "constexpr bool live = true;\n"
                                   : "const bool live = o < outer_n;\n";
  // The first row of the lane's chunk (packed), or the row of group g,
  // and whether it exists, at `depth`.
  auto group_row = [&](int depth, bool chunk = false) -> absl::Status {
    const std::string row =
        packed ? absl::StrCat("(threadIdx.x & ", row_lanes - 1, ") * ", groups, chunk ? "" : " + g")
               : "g * 32 + (threadIdx.x & 31)";
    absl::StrAppend(out, Pad(depth), "const ", idx_, " o = tile * ", row_lanes * groups, " + ", row,
                    ";\n", Pad(depth), live_row);
    return Decompose(k_.outer, "o", "o", depth, out);
  };
  if (packed) {
    RETURN_IF_ERROR(DeclareVectors(groups, static_cast<int>(k_.outer.size()) - 1, {}, out));
  }
  // The loop over the block's tiles of rows (or rows), from the last to
  // the first where the kernel is reversed (loop::Kernel::reversed).
  auto tiles = [&](int rows) {
    if (!k_.reversed) {
      return absl::StrCat("  for (", idx_, " tile = blockIdx.x; tile * ", rows,
                          " < outer_n; tile += gridDim.x) {\n");
    }
    return absl::StrCat("  const ", idx_, " tiles = (outer_n + ", rows - 1, ") / ", rows,
                        ";\n  for (", idx_, " r = blockIdx.x; r < tiles; r += gridDim.x) {\n",
                        "    const ", idx_, " tile = tiles - 1 - r;\n");
  };
  if (groups > 1) {
    absl::StrAppend(out, "  const int lane = threadIdx.x ", narrow ? "/ " : ">> ",
                    narrow ? row_lanes : 5, ";  // along the rows\n", tiles(row_lanes * groups));
  } else if (column) {
    absl::StrAppend(out, "  const int lane = threadIdx.x >> 5;  // along the rows\n", tiles(32),
                    "    const ", idx_, " o = tile * 32 + (threadIdx.x & 31);\n", "    ", live_row);
    live = "live";
  } else {
    absl::StrAppend(out, "  const int lane = threadIdx.x;\n");
    RETURN_IF_ERROR(DeclareRowSums(sched, out));
    if (k_.reversed) {
      absl::StrAppend(out, "  for (", idx_, " r = blockIdx.x; r < outer_n; r += gridDim.x) {\n",
                      "    const ", idx_, " o = outer_n - 1 - r;\n");
    } else {
      RETURN_IF_ERROR(LoadRowAhead(sched, prefetched, "blockIdx.x", 1, out));
      absl::StrAppend(out, "  for (", idx_, " o = blockIdx.x; o < outer_n; o += gridDim.x) {\n");
    }
  }
  if (groups == 1) RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", 2, out));
  if (!column && !prefetched.empty()) {
    // This row's vectors came with the last; the next row's are loaded now.
    for (int j : prefetched) {
      absl::StrAppend(out, "    alignas(16) ", StorageName(k_.buffers[k_.stmts[j].buffer].dtype),
                      " kiln_row", j, "[", sched.per_thread / sched.vector, "][", sched.vector,
                      "];\n#pragma unroll\n    for (int ec = 0; ec < ",
                      sched.per_thread / sched.vector,
                      "; ++ec) {\n#pragma unroll\n      for (int v = 0; v < ", sched.vector,
                      "; ++v) kiln_row", j, "[ec][v] = kiln_ahead", j, "[ec][v];\n    }\n");
    }
    RETURN_IF_ERROR(LoadRowAhead(sched, prefetched, "o + gridDim.x", 2, out));
  }
  const std::string store_guard = column ? "lane == 0" : "threadIdx.x == 0";
  const int lanes = sched.block / row_lanes;  // threads along the sweep
  const int n = static_cast<int>(k_.stmts.size());
  // A statement of a later pass -> the earlier pass's statement whose
  // registers it reads (CacheOf).
  const std::vector<int> cache_of = cached ? CacheOf() : std::vector<int>(n, kNotCached);
  for (int p = 0; p < k_.passes; ++p) {
    std::vector<int> before, inner, after;
    for (int j = 0; j < n; ++j) {
      const Stmt& s = k_.stmts[j];
      if (s.pass != p) continue;
      (s.inner ? inner : after_[j] ? after : before).push_back(j);
    }
    absl::StrAppend(out, "    // pass ", p, "\n");
    for (int j : before) {
      ASSIGN_OR_RETURN(std::string line, Statement(j, store_guard, live));
      absl::StrAppend(out, "    ", line, "\n");
    }
    if (inner.empty()) {
      for (int j : after) {
        ASSIGN_OR_RETURN(std::string line, Statement(j, store_guard, live));
        absl::StrAppend(out, "    ", line, "\n");
      }
      continue;
    }
    // What a later pass reads again is kept: registers c<j>[e].
    std::vector<int> keep;
    if (cached) {
      for (int j : inner) {
        if (cache_of[j] != kNotCached) continue;
        if (std::find(cache_of.begin(), cache_of.end(), j) != cache_of.end()) keep.push_back(j);
      }
      for (int j : keep) {
        absl::StrAppend(out, "    ", CName(type_[j]), " c", j, "[", sched.per_thread, "];\n");
        cached_values_ += sched.per_thread;
      }
    }
    for (int j : inner) {
      const Stmt& s = k_.stmts[j];
      if (s.kind != StmtKind::kReduce) continue;
      const char* T = CName(type_[j]);
      if (groups > 1) {
        const std::string each = absl::StrCat(
            "[", groups, "] = {",
            absl::StrJoin(
                std::vector<std::string>(groups, IsWelford(s) ? std::string("0") : Identity(j)),
                ", "),
            "}");
        if (!IsWelford(s)) {
          absl::StrAppend(out, "    ", T, " acc", j, each, ";\n");
        } else if (WelfordId(j) == j) {
          absl::StrAppend(out, "    ", T, " wm", j, each, ", wq", j, each, ", wn", j, each,
                          ";  // mean, M2, count\n");
        }
      } else if (IsWelford(s)) {
        if (WelfordId(j) == j) {
          absl::StrAppend(out, "    ", T, " wm", j, " = 0, wq", j, " = 0, wn", j,
                          " = 0;  // mean, M2, count\n");
        }
      } else {
        absl::StrAppend(out, "    ", T, " acc", j, " = ", Identity(j), ";\n");
      }
    }
    const int vector = sched.vector;
    std::vector<int> fresh;  // the sweep's statements that are not read from registers
    for (int j : inner) {
      if (cache_of[j] == kNotCached) fresh.push_back(j);
    }
    // The sweep's distinct vectorized loads: one of each set of loads of
    // the same element.
    auto distinct_vector_loads = [&]() {
      std::vector<int> loads;
      for (int j : fresh) {
        if (k_.stmts[j].kind != StmtKind::kLoad || vectorized_.count(j) == 0) continue;
        if (std::none_of(loads.begin(), loads.end(), [&](int q) { return SameLoad(q, j); })) {
          loads.push_back(j);
        }
      }
      return loads;
    };
    int depth = 4;
    int grouped = 1;  // chunks per group of loads (the sweep by vectors)
    // In a sweep by vectors, Welford's inputs of a chunk are gathered
    // (wx<j>[v]) and the chunk's mean and M2 merged into the thread's once
    // per chunk: one division per chunk rather than per element.
    std::vector<int> welford;
    for (int j : inner) {
      if (IsWelford(k_.stmts[j]) && WelfordId(j) == j) welford.push_back(j);
    }
    // In a sweep by groups of chunks over a constant row of whole groups,
    // each group is gathered and merged as one chunk, its chunks unguarded:
    // a quarter of the merges (each a division), and the mean and M2 of 32
    // elements of bfloat16 rather than 8. Welford over [64, 2^20]
    // bfloat16 on an H200: 36.7 us merged by chunk, 34.7 us by group with
    // the fast division, 34.2 us for the sum alone. Guarded, the group's
    // gathered chunks took 75 registers (47 unguarded): three blocks of
    // 256 threads an SM rather than four, and 43.2 us.
    int gather_group = 1;
    auto gather_welford = [&](int depth) {
      for (int j : welford) {
        absl::StrAppend(out, Pad(depth), CName(type_[j]), " wx", j, "[", gather_group * vector,
                        "];\n");
      }
    };
    if (cached && vector > 1) {
      absl::StrAppend(out, "#pragma unroll\n    for (int ec = 0; ec < ", sched.per_thread / vector,
                      "; ++ec) {\n      const ", idx_, " i = (lane + ec * ", lanes, ") * ", vector,
                      ";\n      if (i < inner_n) {\n");
      RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
      // The first pass's loads of a row loaded ahead read its registers.
      std::vector<int> loaded;
      for (int j : fresh) {
        const auto ahead = std::find_if(prefetched.begin(), prefetched.end(), [&](int q) {
          return p == 0 && SameElement(k_.stmts[q], k_.stmts[j]);
        });
        if (ahead == prefetched.end() || k_.stmts[j].kind != StmtKind::kLoad) {
          loaded.push_back(j);
          continue;
        }
        absl::StrAppend(out, Pad(4), "const auto& v", j, " = kiln_row", *ahead, "[ec];\n");
      }
      RETURN_IF_ERROR(VectorAccesses(loaded, StmtKind::kLoad, vector, 4, out));
      DeclareStoreChunks(fresh, vector, 4, out);
      gather_welford(4);
      absl::StrAppend(out, "#pragma unroll\n        for (int v = 0; v < ", vector,
                      "; ++v) {\n          const int e = ec * ", vector, " + v;\n");
      depth = 5;
    } else if (cached) {
      absl::StrAppend(out, "#pragma unroll\n    for (int e = 0; e < ", sched.per_thread,
                      "; ++e) {\n      const ", idx_, " i = lane + e * ", lanes, ";\n",
                      "      if (i < inner_n) {\n");
      RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
    } else if (vector > 1) {
      const std::vector<int> streams = distinct_vector_loads();
      // About four vectors in flight per thread: the chunks of a group
      // are all loaded before any is used. Unrolled with each chunk's use
      // after its load, ptxas kept one or two loads in flight, waiting on
      // each before the next (an H100's batch norm statistics over
      // [128, 32, 64, 64] float32, 2 TB/s).
      grouped = std::clamp(4 / std::max<int>(1, streams.size()), 1, 4);
      bool constant = false;
      const int64_t row = ConstantProduct(k_.inner, &constant);
      if (grouped > 1 && !welford.empty() && constant &&
          row % (int64_t{vector} * grouped * lanes) == 0) {
        gather_group = grouped;
      }
      // Where groups are whole, every chunk is live.
      const std::string live_chunk =
          gather_group > 1 ? "" : absl::StrCat("if (ch < inner_n / ", vector, ") ");
      if (grouped > 1) {
        absl::StrAppend(out, "    for (", idx_, " ch0 = lane; ch0 < inner_n / ", vector,
                        "; ch0 += ", grouped * lanes, ") {\n");
        for (int j : streams) {
          absl::StrAppend(out, "      alignas(16) ",
                          StorageName(k_.buffers[k_.stmts[j].buffer].dtype), " g", j, "[", grouped,
                          "][", vector, "];\n");
        }
        absl::StrAppend(out, "#pragma unroll\n      for (int u = 0; u < ", grouped,
                        "; ++u) {\n        const ", idx_, " ch = ch0 + u * ", lanes, ";\n        ",
                        live_chunk, "{\n          const ", idx_, " i = ch * ", vector, ";\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 5, out));
        for (int j : streams) {
          ASSIGN_OR_RETURN(std::string addr, Access(j));
          absl::StrAppend(out, Pad(5), "kiln_vload<", vector, ">(g", j, "[u], &", addr,
                          ", aligned);\n");
        }
        absl::StrAppend(out, "        }\n      }\n");
        if (gather_group > 1) gather_welford(3);
        absl::StrAppend(out, "#pragma unroll\n      for (int u = 0; u < ", grouped,
                        "; ++u) {\n      const ", idx_, " ch = ch0 + u * ", lanes,
                        ";\n      const ", idx_, " i = ch * ", vector, ";\n      ", live_chunk,
                        "{\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
        for (int j : fresh) {
          if (k_.stmts[j].kind != StmtKind::kLoad || vectorized_.count(j) == 0) continue;
          const int q =
              *std::find_if(streams.begin(), streams.end(), [&](int c) { return SameLoad(c, j); });
          absl::StrAppend(out, Pad(4), "const auto& v", j, " = g", q, "[u];\n");
        }
      } else {
        absl::StrAppend(out, "#pragma unroll 4\n    for (", idx_, " ch = lane; ch < inner_n / ",
                        vector, "; ch += ", lanes, ") {\n      const ", idx_, " i = ch * ", vector,
                        ";\n      {\n");
        RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
        RETURN_IF_ERROR(VectorAccesses(fresh, StmtKind::kLoad, vector, 4, out));
      }
      DeclareStoreChunks(fresh, vector, 4, out);
      if (gather_group == 1) gather_welford(4);
      absl::StrAppend(out, "#pragma unroll\n        for (int v = 0; v < ", vector, "; ++v) {\n");
      depth = 5;
    } else if (groups > 1) {
      // Every group's element of the step's row: 512 adjacent bytes.
      // Packed, steps unrolled to about four vector loads per lane in
      // flight (64 bytes, as four unrolled steps of scalars were): a sum
      // over one buffer unrolls 4 steps, a kernel reading two buffers 2,
      // one reading three or more (an RMS norm's weight gradient beside
      // its dx) none: its body, copied for 8 groups and 2 steps, took
      // NVRTC 0.3 s more per module than for 8 groups and 1. Loads of
      // per-row parameters do not count: the conv net's mean over pixels
      // after two batch norms reads two streams and eight parameters, and
      // took 31.0 us unrolled once, 28.7 us twice, on an H100.
      // The sweep's distinct loads moving along the rows, read as vectors
      // when packed.
      const std::vector<int> chunked = packed ? distinct_vector_loads() : std::vector<int>();
      // Per-row parameters, which stay put along the sweep, are not streams.
      const int streams =
          static_cast<int>(std::count_if(chunked.begin(), chunked.end(), [&](int j) {
            const std::vector<ir::SymInt>& strides = k_.stmts[j].index.inner_strides;
            return !std::all_of(strides.begin(), strides.end(), IsZero);
          }));
      // A body of 16-bit loads and library functions (a GELU's backward:
      // erf and exp, or tanh) is not unrolled: its 8 groups, copied for 2
      // steps, took NVRTC twice as long (0.20 s against 0.10 s for MLP's
      // [8192, 4096] GELU gradient with its bias gradient), and its math
      // hides the loads' latency about as a second step would (H100: 89.7
      // us unrolled twice, 92.8 us once; GPT-2's tanh GELU over
      // [8192, 3072]: 65.7 us and 62.7 us).
      const int library_calls =
          static_cast<int>(std::count_if(inner.begin(), inner.end(), [&](int j) {
            return k_.stmts[j].kind == StmtKind::kOp && IsTranscendental(k_.stmts[j].op);
          }));
      const bool sixteen_bit =
          !chunked.empty() && std::all_of(chunked.begin(), chunked.end(), [&](int j) {
            const v1::DType t = k_.buffers[k_.stmts[j].buffer].dtype;
            return t == v1::BFLOAT16 || t == v1::FLOAT16;
          });
      const bool heavy = sixteen_bit && library_calls > 0;
      const int unroll = !packed ? 4 : heavy ? 1 : std::clamp(4 / std::max(1, streams), 1, 4);
      absl::StrAppend(out, "#pragma unroll ", unroll, "\n    for (", idx_,
                      " i = lane; i < inner_n; i += ", lanes, ") {\n      {\n");
      RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
      if (packed) {
        // The lane's chunk of each load moving along the rows, as one
        // vector; a chunk is wholly live or not (rows divide into them).
        // The stores moving along them gather each chunk and write it
        // after the groups.
        RETURN_IF_ERROR(group_row(4, true));
        for (int j : fresh) {
          const Stmt& s = k_.stmts[j];
          if (vectorized_.count(j) == 0) continue;
          if (s.kind == StmtKind::kLoad) {
            const int q = *std::find_if(chunked.begin(), chunked.end(),
                                        [&](int c) { return SameLoad(c, j); });
            if (q != j) {
              absl::StrAppend(out, Pad(4), "const auto& v", j, " = v", q, ";\n");
              continue;
            }
          }
          absl::StrAppend(out, Pad(4), "alignas(16) ", StorageName(k_.buffers[s.buffer].dtype),
                          " v", j, "[", groups, "];\n");
          if (s.kind != StmtKind::kLoad) continue;
          ASSIGN_OR_RETURN(std::string addr, Access(j));
          // A stream that nothing reads after this kernel is read past
          // the caches' keeping (KernelBuffer::streamed).
          const std::vector<ir::SymInt>& strides = s.index.inner_strides;
          const bool once =
              k_.buffers[s.buffer].streamed && !std::all_of(strides.begin(), strides.end(), IsZero);
          absl::StrAppend(out, Pad(4), "if (live) kiln_vload", once ? "_once<" : "<", groups, ">(v",
                          j, ", &", addr, ", aligned);\n");
        }
      }
      absl::StrAppend(out, "#pragma unroll\n        for (int g = 0; g < ", groups, "; ++g) {\n");
      if (packed) {
        absl::StrAppend(out, "          const int v = g;  // the element of each chunk\n");
      }
      RETURN_IF_ERROR(group_row(5));
      live = "live";
      depth = 5;
    } else {
      // Unrolled: several rows' loads in flight per thread (a column
      // sweep reads one element per row).
      absl::StrAppend(out, "#pragma unroll 4\n    for (", idx_, " i = lane; ",
                      column ? "live && " : "", "i < inner_n; i += ", lanes, ") {\n      {\n");
      RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
    }
    // The sweep's statements for one element (at `depth`).
    auto body = [&](int depth, bool chunk) -> absl::Status {
      const std::string pad = Pad(depth);
      for (int j : inner) {
        const Stmt& s = k_.stmts[j];
        if (s.kind == StmtKind::kAccumulate) {
          absl::StrAppend(out, pad, "r", j, "[e] += ", CastValue(type_, s.args[0], type_[j]),
                          ";\n");
          continue;
        }
        if (cache_of[j] == kSkipped) continue;
        if (s.kind != StmtKind::kReduce) {
          if (cache_of[j] >= 0) {
            absl::StrAppend(out, pad, "const ", CName(type_[j]), " t", j, " = c", cache_of[j],
                            "[e];\n");
            continue;
          }
          ASSIGN_OR_RETURN(std::string line, Statement(j, "", live));
          absl::StrAppend(out, pad, line, "\n");
          if (std::find(keep.begin(), keep.end(), j) != keep.end()) {
            absl::StrAppend(out, pad, "c", j, "[e] = t", j, ";\n");
          }
          continue;
        }
        const std::string v = CastValue(type_, s.args[0], type_[j]);
        if (IsWelford(s)) {
          if (WelfordId(j) != j) continue;
          const char* T = CName(type_[j]);
          if (chunk) {
            absl::StrAppend(out, pad, "wx", j, gather_group > 1 ? "[u * " : "[",
                            gather_group > 1 ? absl::StrCat(vector, " + v]") : "v]", " = ", v,
                            ";\n");
            continue;
          }
          absl::StrAppend(out, pad, "{ wn", j, at, " += ", T, "(1); const ", T, " d = ", v, " - wm",
                          j, at, "; wm", j, at, " += d / wn", j, at, "; wq", j, at, " += d * (", v,
                          " - wm", j, at, "); }\n");
        } else {
          absl::StrAppend(out, pad, "acc", j, at, " = ", Combiner(s.reduce), "(acc", j, at, ", ", v,
                          ");\n");
        }
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(body(depth, vector > 1));
    if (vector > 1 || groups > 1) absl::StrAppend(out, "        }\n");
    if (packed) {
      for (int j : fresh) {
        const Stmt& s = k_.stmts[j];
        if (s.kind != StmtKind::kStore || vectorized_.count(j) == 0) continue;
        ASSIGN_OR_RETURN(std::string addr, Access(j));
        absl::StrAppend(out, Pad(4), "if (live) kiln_vstore<", groups, ">(&", addr, ", v", j,
                        ", aligned);\n");
      }
    }
    // The merge of the n gathered elements wx<j>[0 .. n) as one chunk.
    auto merge_welford = [&](int depth, int n) {
      for (int j : welford) {
        const char* T = CName(type_[j]);
        const std::string x = absl::StrCat("wx", j, "[v]");
        absl::StrAppend(out, Pad(depth), "{\n", Pad(depth + 1), T, " s = 0, q = 0;\n",
                        "#pragma unroll\n", Pad(depth + 1), "for (int v = 0; v < ", n,
                        "; ++v) s += ", x, ";\n", Pad(depth + 1), "const ", T, " m = s / ", T, "(",
                        n, ");\n", "#pragma unroll\n", Pad(depth + 1), "for (int v = 0; v < ", n,
                        "; ++v) q += (", x, " - m) * (", x, " - m);\n", Pad(depth + 1),
                        "kiln_welford_chunk(wm", j, ", wq", j, ", wn", j, ", m, q, ", T, "(", n,
                        "));\n", Pad(depth), "}\n");
      }
    };
    if (vector > 1 && gather_group == 1) merge_welford(4, vector);
    if (vector > 1) RETURN_IF_ERROR(VectorAccesses(fresh, StmtKind::kStore, vector, 4, out));
    absl::StrAppend(out, "      }\n    }\n");
    if (gather_group > 1) merge_welford(3, gather_group * vector);
    if (grouped > 1) absl::StrAppend(out, "    }\n");
    if (sched.vector_tail) {
      // A row of symbolic length: its last inner_n % vector elements one
      // by one.
      const std::set<int> chunked = vectorized_;
      const int width = vector_;
      vectorized_.clear();
      vector_ = 1;
      absl::StrAppend(out, "    for (", idx_, " i = inner_n / ", vector, " * ", vector,
                      " + lane; i < inner_n; i += ", lanes, ") {\n      {\n");
      RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 4, out));
      RETURN_IF_ERROR(body(4, false));
      absl::StrAppend(out, "      }\n    }\n");
      vectorized_ = chunked;
      vector_ = width;
    }
    // The combination and the epilogue, for each group in turn.
    std::string pad = "    ";
    if (narrow) {
      // Every group's accumulators at once: one exchange between warps.
      for (int j : inner) {
        if (k_.stmts[j].kind != StmtKind::kReduce) continue;
        absl::StrAppend(out, pad, "kiln_narrow_column_reduce<", row_lanes, ">(acc", j, ", ",
                        Combiner(k_.stmts[j].reduce), ", kiln_smem);\n");
      }
    } else if (grouped_reduce) {
      // Every group's accumulators at once: three barriers where one
      // group at a time takes four each, at the end of the tile, when no
      // load is left to wait for.
      for (int j : inner) {
        const Stmt& s = k_.stmts[j];
        if (s.kind != StmtKind::kReduce || IsWelford(s)) continue;
        absl::StrAppend(out, pad, "kiln_column_reduce_groups(acc", j, ", ", Combiner(s.reduce),
                        ", kiln_smem);\n");
      }
    }
    if (groups > 1) {
      absl::StrAppend(out, "#pragma unroll\n    for (int g = 0; g < ", groups, "; ++g) {\n");
      RETURN_IF_ERROR(group_row(3));
      pad = "      ";
    }
    for (int j : inner) {
      const Stmt& s = k_.stmts[j];
      if (s.kind != StmtKind::kReduce) continue;
      const char* T = CName(type_[j]);
      if (IsWelford(s)) {
        const int w = WelfordId(j);
        if (w == j) {
          absl::StrAppend(out, pad, column ? "kiln_column_welford" : "kiln_block_welford", "(wm", j,
                          at, ", wq", j, at, ", wn", j, at, ", kiln_smem);\n");
        }
        absl::StrAppend(out, pad, "const ", T, " t", j, " = ",
                        s.reduce == ReduceOp::kWelfordMean ? "wm" : "wq", w, at, ";\n");
      } else if (narrow || grouped_reduce) {
        absl::StrAppend(out, pad, "const ", T, " t", j, " = acc", j, at, ";\n");
      } else if (column) {
        absl::StrAppend(out, pad, "const ", T, " t", j, " = kiln_column_reduce(acc", j, at, ", ",
                        Combiner(s.reduce), ", kiln_smem);\n");
      } else {
        absl::StrAppend(out, pad, "const ", T, " t", j, " = kiln_block_reduce(acc", j, ", ",
                        Combiner(s.reduce), ", ", T, "(", Identity(j), "), kiln_smem);\n");
      }
    }
    for (int j : after) {
      ASSIGN_OR_RETURN(std::string line, Statement(j, store_guard, live));
      absl::StrAppend(out, pad, line, "\n");
    }
    if (groups > 1) absl::StrAppend(out, "    }\n");
  }
  absl::StrAppend(out, "  }\n");
  return StoreRowSums(sched, out);
}

absl::Status CudaKernelEmitter::LoadRowAhead(const Schedule& sched, const std::vector<int>& loads,
                                             const char* row, int depth, std::string* out) {
  if (loads.empty()) return absl::OkStatus();
  const int chunks = sched.per_thread / sched.vector;
  const int vector = sched.vector;
  if (depth == 1) {
    for (int j : loads) {
      absl::StrAppend(out, "  alignas(16) ", StorageName(k_.buffers[k_.stmts[j].buffer].dtype),
                      " kiln_ahead", j, "[", chunks, "][", vector, "];\n");
    }
  }
  absl::StrAppend(out, Pad(depth), "if (", row, " < outer_n) {\n", Pad(depth + 1), "const ", idx_,
                  " kiln_next = ", row, ";\n", Pad(depth + 1), "{\n", Pad(depth + 2), "const ",
                  idx_, " o = kiln_next;\n");
  RETURN_IF_ERROR(Decompose(k_.outer, "o", "o", depth + 2, out));
  absl::StrAppend(out, "#pragma unroll\n", Pad(depth + 2), "for (int ec = 0; ec < ", chunks,
                  "; ++ec) {\n", Pad(depth + 3), "const ", idx_, " i = (lane + ec * ", sched.block,
                  ") * ", vector, ";\n", Pad(depth + 3), "if (i < inner_n) {\n");
  RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", depth + 4, out));
  for (int j : loads) {
    ASSIGN_OR_RETURN(std::string addr, Access(j));
    absl::StrAppend(out, Pad(depth + 4), "kiln_vload<", vector, ">(kiln_ahead", j, "[ec], &", addr,
                    ", aligned);\n");
  }
  absl::StrAppend(out, Pad(depth + 3), "}\n", Pad(depth + 2), "}\n", Pad(depth + 1), "}\n",
                  Pad(depth), "}\n");
  return absl::OkStatus();
}

absl::Status CudaKernelEmitter::DeclareRowSums(const Schedule& sched, std::string* out) {
  if (k_.row_groups == 0) return absl::OkStatus();
  if (sched.layout != Layout::kRow || sched.per_thread == 0) {
    return KernelError(k_, "sums across rows need a row kept in registers");
  }
  absl::StrAppend(out, "  // This block's rows' sums, at each element of the thread's share.\n");
  for (size_t j = 0; j < k_.stmts.size(); ++j) {
    if (k_.stmts[j].kind != StmtKind::kAccumulate) continue;
    absl::StrAppend(out, "  ", CName(type_[j]), " r", j, "[", sched.per_thread, "] = {};\n");
    cached_values_ += sched.per_thread;
  }
  return absl::OkStatus();
}

absl::Status CudaKernelEmitter::StoreRowSums(const Schedule& sched, std::string* out) {
  if (k_.row_groups == 0) return absl::OkStatus();
  const int vector = sched.vector;
  absl::StrAppend(out, "  // The group's partial sums: block g took rows g, g + ", k_.row_groups,
                  ", ...\n  const ", idx_, " o0 = blockIdx.x;\n", "#pragma unroll\n",
                  "  for (int e = 0; e < ", sched.per_thread, "; ++e) {\n    const ", idx_, " i = ",
                  vector > 1 ? absl::StrCat("(lane + e / ", vector, " * ", sched.block, ") * ",
                                            vector, " + e % ", vector)
                             : absl::StrCat("lane + e * ", sched.block),
                  ";\n    if (i < inner_n) {\n");
  RETURN_IF_ERROR(Decompose(k_.inner, "i", "i", 3, out));
  for (size_t j = 0; j < k_.stmts.size(); ++j) {
    const Stmt& s = k_.stmts[j];
    if (s.kind != StmtKind::kAccumulate) continue;
    ASSIGN_OR_RETURN(std::string addr, Access(static_cast<int>(j)));
    absl::StrAppend(out, "      ", addr, " = ",
                    ToStorage(k_.buffers[s.buffer].dtype, type_[j], absl::StrCat("r", j, "[e]")),
                    ";\n");
  }
  absl::StrAppend(out, "    }\n  }\n");
  return absl::OkStatus();
}

}  // namespace kiln::codegen::cuda_internal
