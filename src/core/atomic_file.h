// Atomic file output: every file spin writes (traces, reports, benchmark records, calibration)
// goes through here, so a crash, a full disk or a signal never leaves a half-written file behind,
// and the rules of spin/files.h (links written through, devices and inputs never replaced) hold
// for every writer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "spin/files.h"
#include "spin/status.h"

namespace spin {

// A temporary file next to the target (same directory, so rename is atomic). Written through
// write(), made durable and renamed onto the target by commit(); removed if never committed, and
// by the handlers of remove_temp_files_on_signal() if the process is interrupted.
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Resolves links in `target`, refuses a target that exists and is not a regular file.
  Status create(const std::string& target);
  Status write(const void* data, size_t size);
  // fsync, close, rename onto the target given to create(), fsync the directory.
  Status commit();

 private:
  void discard();

  int fd_ = -1;
  int slot_ = -1;      // entry in the signal handler's list of live temporary files
  std::string path_;   // the temporary file
  std::string target_; // where commit() renames it (links resolved)
};

}  // namespace spin
