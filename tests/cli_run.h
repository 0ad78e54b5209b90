// Runs the `spin` binary under test (SPIN_BINARY, through SPIN_EMULATOR in the cross build) and
// captures its exit code and its output (stdout and stderr together): the tools_* tests' one way
// to drive the command line.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

struct CliRun {
  int code = -1;
  std::string out;
};

inline CliRun run_spin(const std::string& args) {
  CliRun r;
#ifdef SPIN_EMULATOR  // the cross build: the binary runs through qemu-user
  const std::string cmd = std::string(SPIN_EMULATOR) + " " + SPIN_BINARY + " " + args + " 2>&1";
#else
  const std::string cmd = std::string(SPIN_BINARY) + " " + args + " 2>&1";
#endif
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}
