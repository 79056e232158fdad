// SymInt literals for the plan executor's tests.
#ifndef KILN_CLIENT_RUNTIME_PLAN_TEST_UTIL_H_
#define KILN_CLIENT_RUNTIME_PLAN_TEST_UTIL_H_

#include <cstdint>
#include <string>

#include "kiln/v1/artifact.pb.h"

namespace kiln::runtime::plan_test {

inline v1::SymInt Int(int64_t v) {
  v1::SymInt s;
  s.set_int_value(v);
  return s;
}

inline v1::SymInt Sym(const std::string& expr) {
  v1::SymInt s;
  s.set_expr(expr);
  return s;
}

}  // namespace kiln::runtime::plan_test

#endif  // KILN_CLIENT_RUNTIME_PLAN_TEST_UTIL_H_
