// Tokens, namespaces and TLS against the real kilnd.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/integration/graphs.h"
#include "tests/integration/kilnd_process.h"

namespace kiln::testing {
namespace {

constexpr char kReader[] = "reader-token-0123456789";
constexpr char kCompiler[] = "compiler-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789abc";

std::unique_ptr<Client> As(const std::string& address, const std::string& token,
                           const std::string& root_certs = "") {
  ClientOptions o;
  o.address = address;
  o.deadline = absl::Seconds(20);
  o.max_attempts = 2;
  o.token = token;
  o.tls_root_certs = root_certs;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

v1::CompileRequest In(const std::string& ns, int salt = 0) {
  v1::CompileRequest r;
  *r.mutable_graph() = ChainGraph(4, 8, salt);
  r.mutable_options()->set_backend("eager");
  r.set_namespace_(ns);
  return r;
}

std::string TokensFile(const TempDir& dir) {
  const std::string path = dir.path() + "/tokens";
  std::ofstream f(path);
  f << "# token role namespaces name\n"
    << kReader << " reader a serving\n"
    << kCompiler << " compiler a,b trainer\n"
    << kAdmin << " admin * ops\n";
  return path;
}

void ExpectDenied(const absl::Status& s, absl::StatusCode code, const std::string& says) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), says)) << s;
}

TEST(AuthTest, TokensGrantRolesInTheirNamespaces) {
  TempDir dir;
  KilndProcess kilnd(dir.path() + "/data", {"--tokens_file=" + TokensFile(dir)});
  auto anonymous = As(kilnd.address(), "");
  auto reader = As(kilnd.address(), kReader);
  auto compiler = As(kilnd.address(), kCompiler);
  auto admin = As(kilnd.address(), kAdmin);

  ExpectDenied(anonymous->Compile(In("a")).status(), absl::StatusCode::kUnauthenticated,
               "no bearer token");
  ExpectDenied(As(kilnd.address(), "not-a-known-token-at-all")->Compile(In("a")).status(),
               absl::StatusCode::kUnauthenticated, "unknown token");
  ExpectDenied(reader->Compile(In("a")).status(), absl::StatusCode::kPermissionDenied,
               "token 'serving' is a reader; this call needs compiler");

  auto compiled = compiler->Compile(In("a"));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ExpectDenied(compiler->Compile(In("c")).status(), absl::StatusCode::kPermissionDenied,
               "token 'trainer' may not use namespace 'c'");
  ASSERT_TRUE(compiler->Compile(In("b", 1)).ok());

  // Reads: a reader of `a` sees `a` only.
  v1::LookupRequest lookup;
  *lookup.mutable_graph() = In("a").graph();
  lookup.set_namespace_("a");
  auto hit = reader->Lookup(lookup);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->outcome(), v1::HIT);
  lookup.set_namespace_("b");
  ExpectDenied(reader->Lookup(lookup).status(), absl::StatusCode::kPermissionDenied,
               "may not use namespace 'b'");
  EXPECT_TRUE(reader->GetArtifact(compiled->digest(), "a").ok());
  ExpectDenied(reader->GetArtifact(compiled->digest(), "b").status(),
               absl::StatusCode::kPermissionDenied, "may not use namespace 'b'");
  // The artifact of `a` is not reachable through `b`, which names none.
  EXPECT_EQ(compiler->GetArtifact(compiled->digest(), "b").status().code(),
            absl::StatusCode::kNotFound);
  ExpectDenied(reader->ListEntries("*").status(), absl::StatusCode::kPermissionDenied,
               "may not use namespace '*'");
  EXPECT_TRUE(reader->ListEntries("a").ok());

  // Admin calls.
  ExpectDenied(compiler->Freeze().status(), absl::StatusCode::kPermissionDenied,
               "this call needs admin");
  EXPECT_TRUE(admin->Freeze().ok());
  EXPECT_TRUE(admin->Thaw().ok());
  auto all = admin->ListEntries("*");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->entries_size(), 2);
  EXPECT_TRUE(admin->GetArtifact(compiled->digest(), "").ok());
  EXPECT_EQ(kilnd.Terminate(), 0);
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(AuthTest, AdminCallsAreAuditedAndRequestsLogged) {
  TempDir dir;
  const std::string audit = dir.path() + "/audit.log", requests = dir.path() + "/requests.log";
  KilndProcess kilnd(dir.path() + "/data", {"--tokens_file=" + TokensFile(dir),
                                            "--audit_log=" + audit, "--request_log=" + requests});
  ASSERT_TRUE(As(kilnd.address(), kCompiler)->Compile(In("a")).ok());
  EXPECT_FALSE(As(kilnd.address(), kReader)->Freeze().ok());
  EXPECT_TRUE(As(kilnd.address(), kAdmin)->Freeze().ok());
  EXPECT_EQ(kilnd.Terminate(), 0);
  const std::string audited = ReadAll(audit), logged = ReadAll(requests);
  EXPECT_TRUE(absl::StrContains(
      audited, R"("rpc":"Freeze","ns":"*","caller":"serving","code":"PERMISSION_DENIED")"))
      << audited;
  EXPECT_TRUE(absl::StrContains(audited, R"("rpc":"Freeze","ns":"*","caller":"ops","code":"OK")"))
      << audited;
  EXPECT_TRUE(
      absl::StrContains(logged, R"("rpc":"Compile","ns":"a","caller":"trainer","code":"OK")"))
      << logged;
  EXPECT_TRUE(absl::StrContains(logged, R"({"ts":")")) << logged;
  EXPECT_TRUE(absl::StrContains(logged, R"("rid":")")) << logged;
}

TEST(AuthTest, RefusesToListenBeyondLoopbackWithoutTlsAndTokens) {
  TempDir dir;
  const std::string out =
      RunShell(absl::StrCat(KILND_PATH, " --listen=0.0.0.0:0 --data_dir=", dir.path(), " 2>&1"));
  EXPECT_TRUE(absl::StrContains(out, "is beyond loopback")) << out;
  EXPECT_FALSE(absl::StrContains(out, "\nexit 0")) << out;
}

TEST(AuthTest, TlsWithTokens) {
  TempDir dir;
  const std::string key = dir.path() + "/key.pem", cert = dir.path() + "/cert.pem";
  const std::string made = RunShell(
      absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 ",
                   "-nodes -days 1 -subj /CN=localhost -addext subjectAltName=DNS:localhost,",
                   "IP:127.0.0.1 -keyout ", key, " -out ", cert, " 2>&1"));
  ASSERT_TRUE(absl::StrContains(made, "\nexit 0")) << made;
  std::ifstream f(cert);
  const std::string pem((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  KilndProcess kilnd(dir.path() + "/data", {"--tokens_file=" + TokensFile(dir),
                                            "--tls_cert_file=" + cert, "--tls_key_file=" + key});
  auto tls = As(kilnd.address(), kCompiler, pem);
  auto compiled = tls->Compile(In("a"));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  // Plaintext to a TLS port: no call gets through.
  auto plain = As(kilnd.address(), kCompiler);
  EXPECT_EQ(plain->Compile(In("a")).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(kilnd.Terminate(), 0);
}

}  // namespace
}  // namespace kiln::testing
