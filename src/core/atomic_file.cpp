// Atomic file output (see atomic_file.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/errors.h"

namespace spin {
namespace {

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

Status AtomicFile::create(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string p = fmt::format("{}.tmp-{}-{}", target, static_cast<long>(::getpid()), counter.fetch_add(1));
    // 0666 filtered by the umask: the same permissions a plain open() would give the file.
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      fd_ = fd;
      path_ = std::move(p);
      return ok_status();
    }
    if (errno != EEXIST) {
      return io_error("cannot create temporary file {} next to {}: {}", p, target, std::strerror(errno));
    }
  }
  return io_error("cannot create a unique temporary file next to {}", target);
}

Status AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0) return failed_precondition("AtomicFile::write before create");
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot write {}: {}", path_, std::strerror(errno));
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
  return ok_status();
}

Status AtomicFile::commit(const std::string& target) {
  if (fd_ < 0) return failed_precondition("AtomicFile::commit before create");
  if (::fsync(fd_) != 0) return io_error("cannot fsync {}: {}", path_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return io_error("cannot close {}: {}", path_, std::strerror(errno));
  if (::rename(path_.c_str(), target.c_str()) != 0) {
    return io_error("cannot rename {} to {}: {}", path_, target, std::strerror(errno));
  }
  path_.clear();  // renamed: nothing left to remove
  // Make the rename itself durable; a failure here does not undo a complete, renamed file.
  const int dfd = ::open(parent_dir(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return ok_status();
}

Status write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile file;
  SPIN_RETURN_IF_ERROR(file.create(path));
  SPIN_RETURN_IF_ERROR(file.write(text.data(), text.size()));
  return file.commit(path);
}

}  // namespace spin
