// spin/files.h — atomic file output, as every file spin writes is written: a temporary file in
// the target's directory, fsync, rename. A crash or a full disk never leaves half a file.
#pragma once

#include <string>
#include <string_view>

#include "spin/status.h"

namespace spin {

Status write_file_atomic(const std::string& path, std::string_view text);

}  // namespace spin
