// libFuzzer target: kilnd's configuration file (server/config.h), parsed and
// finished (defaults, ranges, ceilings) as kilnd does at start.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = kiln::server::ParseConfig(std::string(reinterpret_cast<const char*>(data), size));
  if (config.ok()) (void)kiln::server::FinishConfig(&*config);
  return 0;
}
