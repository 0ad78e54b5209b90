// Atomic file output: every file spin writes (traces, reports, benchmark records, calibration)
// goes through here, so a crash or a full disk never leaves a half-written file behind.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "spin/files.h"
#include "spin/status.h"

namespace spin {

// A temporary file next to the target (same directory, so rename is atomic). Written through
// write(), made durable and renamed onto the target by commit(); removed if never committed.
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  Status create(const std::string& target);
  Status write(const void* data, size_t size);
  // fsync, close, rename onto `target`, fsync the directory.
  Status commit(const std::string& target);

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace spin
