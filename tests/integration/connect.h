// A kiln::Client of the kilnd a test started. Header-only: the tests that
// include it link kiln_client; kiln_test_support does not.
#ifndef KILN_TESTS_INTEGRATION_CONNECT_H_
#define KILN_TESTS_INTEGRATION_CONNECT_H_

#include <gtest/gtest.h>

#include <memory>

#include "absl/time/time.h"
#include "client/client.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {

// A failed connection fails the test (and dereferences nothing after).
inline std::unique_ptr<Client> ConnectTo(const KilndProcess& kilnd,
                                         absl::Duration deadline = absl::Seconds(60)) {
  ClientOptions o;
  o.address = kilnd.address();
  o.deadline = deadline;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_INTEGRATION_CONNECT_H_
