// libFuzzer target: kilnd's tokens file (server/auth.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)kiln::server::Authorizer::FromText(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
