// Starts the real kilnd on loopback, port 0, over a temporary data directory,
// for integration tests and benchmarks. Not thread-safe.
#ifndef KILN_TESTS_INTEGRATION_KILND_PROCESS_H_
#define KILN_TESTS_INTEGRATION_KILND_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace kiln::testing {

// A TCP connection to 127.0.0.1 at the port of `address` ("host:port"): the
// descriptor, or -1.
int ConnectLoopback(const std::string& address);

// Runs `command` through the shell; its standard output, then a line
// "exit N" with the status pclose gave.
std::string RunShell(const std::string& command);

// A temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class KilndProcess {
 public:
  // Starts `kilnd --listen=127.0.0.1:0 --data_dir=DIR extra...` ($KILND when
  // set, else the build's kilnd) and waits for
  // its "kilnd listening on ADDR" line. Aborts the test binary on failure.
  // kilnd is killed when the thread that started it exits (PR_SET_PDEATHSIG),
  // so it never outlives a test that crashed.
  KilndProcess(const std::string& data_dir, std::vector<std::string> extra_flags = {});
  // SIGKILLs the process if it still runs.
  ~KilndProcess();

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // host:port of the Prometheus endpoint, when started with --metrics_listen.
  const std::string& metrics_address() const { return metrics_address_; }
  // SIGTERM, then waits; returns the exit status (0 on a clean drain).
  int Terminate();
  // SIGTERM without waiting; Wait() collects the exit status.
  void SendTerm();
  int Wait();
  // SIGKILL, then waits.
  void Kill();

 private:
  pid_t pid_ = -1;
  std::string address_;
  std::string metrics_address_;
};

}  // namespace kiln::testing

#endif  // KILN_TESTS_INTEGRATION_KILND_PROCESS_H_
