// kiln_nvrtc: compiles one CUDA C++ file into a CUBIN with NVRTC.
//
//   kiln_nvrtc --arch=sm_90 -o OUT.cubin IN.cu
//   kiln_nvrtc --serve      (compiles request after request; see Serve)
//   kiln_nvrtc --version
//
// The CUDA backend (codegen.h) runs this as a child process, as it runs g++:
// under a time limit, killed on cancellation, and a crash inside NVRTC
// cannot take kilnd down. NVRTC is loaded with dlopen (libnvrtc.so.13, from
// the loader's path or /usr/local/cuda/lib64; $KILN_NVRTC_LIBRARY names
// another), so that kilnd and this program build and run on machines
// without CUDA, where a CUDA compile fails naming the library. NVRTC needs
// no GPU. Prints NVRTC's log; exits 0 on success, 1 on a compile error, 2
// on a usage or setup error.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

// NVRTC's C API, as nvrtc.h declares it (the result codes are ints).
using nvrtcProgram = struct _nvrtcProgram*;
using VersionFn = int (*)(int*, int*);
using CreateFn = int (*)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                         const char* const*);
using CompileFn = int (*)(nvrtcProgram, int, const char* const*);
using SizeFn = int (*)(nvrtcProgram, size_t*);
using GetFn = int (*)(nvrtcProgram, char*);
using DestroyFn = int (*)(nvrtcProgram*);
using ErrorStringFn = const char* (*)(int);

struct Nvrtc {
  VersionFn version;
  CreateFn create;
  CompileFn compile;
  SizeFn log_size;
  GetFn log;
  SizeFn cubin_size;
  GetFn cubin;
  DestroyFn destroy;
  ErrorStringFn error_string;
};

bool Load(Nvrtc* api, std::string* error) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KILN_NVRTC_LIBRARY"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  }
  candidates.push_back("libnvrtc.so.13");
  candidates.push_back("/usr/local/cuda/lib64/libnvrtc.so.13");
  void* lib = nullptr;
  for (const std::string& c : candidates) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    *error += std::string(dlerror()) + "; ";
  }
  if (lib == nullptr) {
    *error = "cannot load NVRTC (" + *error + "): install CUDA 13 at /usr/local/cuda";
    return false;
  }
  auto sym = [&](const char* name) {
    void* p = dlsym(lib, name);
    if (p == nullptr) *error += std::string("NVRTC lacks ") + name + "; ";
    return p;
  };
  api->version = reinterpret_cast<VersionFn>(sym("nvrtcVersion"));
  api->create = reinterpret_cast<CreateFn>(sym("nvrtcCreateProgram"));
  api->compile = reinterpret_cast<CompileFn>(sym("nvrtcCompileProgram"));
  api->log_size = reinterpret_cast<SizeFn>(sym("nvrtcGetProgramLogSize"));
  api->log = reinterpret_cast<GetFn>(sym("nvrtcGetProgramLog"));
  api->cubin_size = reinterpret_cast<SizeFn>(sym("nvrtcGetCUBINSize"));
  api->cubin = reinterpret_cast<GetFn>(sym("nvrtcGetCUBIN"));
  api->destroy = reinterpret_cast<DestroyFn>(sym("nvrtcDestroyProgram"));
  api->error_string = reinterpret_cast<ErrorStringFn>(sym("nvrtcGetErrorString"));
  return error->empty();
}

bool ValidArch(const std::string& arch) {
  if (arch.size() < 5 || arch.size() > 8 || arch.compare(0, 3, "sm_") != 0) return false;
  for (size_t k = 3; k < arch.size(); ++k) {
    const char c = arch[k];
    if (!(c >= '0' && c <= '9') && !(k + 1 == arch.size() && c == 'a')) return false;
  }
  return true;
}

int Usage() {
  std::cerr << "usage: kiln_nvrtc [--fast-compile=min|mid|max] --arch=sm_NN -o OUT.cubin IN.cu | "
               "kiln_nvrtc [--fast-compile=...] --serve | kiln_nvrtc --version\n";
  return 2;
}

// NVRTC's --Ofast-compile level (shorter compiles, less optimized code), or
// "" for its default.
std::string fast_compile;

// Compiles the file `in` for `arch` into the file `out`. Returns 0, 1 on a
// compile error or 2 on a setup error; `log` gets NVRTC's log and what went
// wrong.
int CompileFile(const Nvrtc& api, const std::string& arch, const std::string& in,
                const std::string& out, std::string* log) {
  if (!ValidArch(arch)) {
    *log += "kiln_nvrtc: --arch '" + arch + "' is not an SM arch like sm_90\n";
    return 2;
  }
  std::ifstream src_file(in, std::ios::binary);
  if (!src_file) {
    *log += "kiln_nvrtc: cannot read " + in + "\n";
    return 2;
  }
  const std::string source((std::istreambuf_iterator<char>(src_file)),
                           std::istreambuf_iterator<char>());
  nvrtcProgram prog = nullptr;
  int rc = api.create(&prog, source.c_str(), in.c_str(), 0, nullptr, nullptr);
  if (rc != 0) {
    *log += std::string("kiln_nvrtc: nvrtcCreateProgram: ") + api.error_string(rc) + "\n";
    return 2;
  }
  const std::string arch_option = "--gpu-architecture=" + arch;
  const std::string fast_option = "--Ofast-compile=" + fast_compile;
  // --minimal leaves out what generated kernels never use (textures,
  // surfaces, the device runtime's functions): 6-14 ms less per module of
  // one kernel (70-90 ms), the same CUBIN.
  const char* options[] = {arch_option.c_str(), "--std=c++17", "-default-device", "--minimal",
                           fast_option.c_str()};
  rc = api.compile(prog, fast_compile.empty() ? 4 : 5, options);
  size_t log_size = 0;
  api.log_size(prog, &log_size);
  if (log_size > 1) {
    std::string text(log_size, '\0');
    api.log(prog, text.data());
    text.resize(log_size - 1);
    *log += text;
  }
  if (rc != 0) {
    *log += std::string("kiln_nvrtc: nvrtcCompileProgram: ") + api.error_string(rc) + "\n";
    api.destroy(&prog);
    return 1;
  }
  size_t size = 0;
  api.cubin_size(prog, &size);
  std::string cubin(size, '\0');
  api.cubin(prog, cubin.data());
  api.destroy(&prog);
  std::ofstream o(out, std::ios::binary | std::ios::trunc);
  o.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  o.close();
  if (!o) {
    *log += "kiln_nvrtc: cannot write " + out + "\n";
    return 2;
  }
  return 0;
}

// --serve: compiles request after request, so that NVRTC's start-up (the
// first compile in a process costs several times the next ones) is paid
// once. A request is three lines on stdin: the arch, the input file and the
// output file; the reply on stdout is "RC LOG_BYTES\n" and the log. Exits
// at the end of stdin (when the process that started it closes its end, or
// ends).
int Serve(const Nvrtc& api) {
  std::string arch, in, out;
  while (std::getline(std::cin, arch) && std::getline(std::cin, in) &&
         std::getline(std::cin, out)) {
    std::string log;
    const int rc = CompileFile(api, arch, in, out, &log);
    std::cout << rc << " " << log.size() << "\n" << log << std::flush;
    if (!std::cout) return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string arch = "sm_90", out, in;
  bool version = false, serve = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--arch=", 0) == 0) {
      arch = a.substr(7);
    } else if (a == "-o" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--version") {
      version = true;
    } else if (a == "--serve") {
      serve = true;
    } else if (a.rfind("--fast-compile=", 0) == 0) {
      fast_compile = a.substr(15);
      if (fast_compile != "min" && fast_compile != "mid" && fast_compile != "max") {
        std::cerr << "kiln_nvrtc: --fast-compile takes min, mid or max, not '" << fast_compile
                  << "'\n";
        return Usage();
      }
    } else if (a == "--help") {
      return Usage();
    } else if (!a.empty() && a[0] != '-' && in.empty()) {
      in = a;
    } else {
      std::cerr << "kiln_nvrtc: unknown argument '" << a << "'\n";
      return Usage();
    }
  }
  Nvrtc api{};
  std::string error;
  if (!Load(&api, &error)) {
    std::cerr << "kiln_nvrtc: " << error << "\n";
    return 2;
  }
  if (version) {
    int major = 0, minor = 0;
    api.version(&major, &minor);
    std::cout << major << "." << minor << "\n";
    return 0;
  }
  if (serve) return Serve(api);
  if (in.empty() || out.empty()) return Usage();
  std::string log;
  const int rc = CompileFile(api, arch, in, out, &log);
  std::cout << log;
  return rc;
}
