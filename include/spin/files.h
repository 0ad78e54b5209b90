// spin/files.h — how spin writes files: never onto an input, never half, never over a device.
//
// Every output (traces, top-k dumps, reports, benchmark records, calibration) is written as a
// temporary file in the target's directory, fsync'ed, then renamed onto the target, so a crash, a
// full disk or Ctrl-C never leaves half a file. Rules an output path must pass, checked by
// check_output_path() before any work starts and again when the file is written:
//   - a symbolic link is written *through*: the file it names is replaced, the link stays;
//   - an existing target must be a regular file (a directory, device, pipe or socket is refused,
//     never replaced); an existing regular file is replaced, as a compiler replaces its output;
//   - the target's directory must exist and be writable;
//   - the target must not be one of the command's inputs (same file by device and inode, through
//     any link), so `spin replay X --dump-topk X` cannot destroy the trace it reads.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "spin/status.h"

namespace spin {

// `path` with symbolic links followed (up to 40) to the name they finally point at. A path that
// is not a link is returned as it is. Fails on a link loop or an unreadable link.
Result<std::string> resolve_output_path(const std::string& path);

// Checks the rules above for an output file, before any work is done.
Status check_output_path(const std::string& path, std::span<const std::string> inputs = {});

// Checks an output directory: an existing directory that is writable, or a name whose parent
// directory exists and is writable (the directory is created when the output is written).
Status check_output_dir(const std::string& dir);

// Writes `text` to `path` atomically, following the rules above.
Status write_file_atomic(const std::string& path, std::string_view text);

// Installs SIGINT, SIGTERM, SIGHUP and SIGPIPE handlers that remove the temporary files of
// writes in flight, then end the process as the signal would have (the exit status still says
// which signal). For programs (the `spin` command); a library user with handlers of its own
// keeps them by not calling this.
void remove_temp_files_on_signal();

}  // namespace spin
