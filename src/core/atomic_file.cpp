// Atomic file output and output-path rules (see atomic_file.h and spin/files.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
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

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// An existing target that is not a regular file is refused, never replaced.
Status check_replaceable(const std::string& shown, const std::string& resolved) {
  struct stat sb {};
  if (::lstat(resolved.c_str(), &sb) != 0) {
    if (errno == ENOENT) return ok_status();
    return io_error("cannot inspect output {}: {}", shown, std::strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) {
    return invalid_argument("output {} is {}: refusing to replace it (give a regular file)", shown,
                            file_kind(sb.st_mode));
  }
  return ok_status();
}

Status check_writable_dir(const std::string& dir, const std::string& shown) {
  struct stat sb {};
  if (::stat(dir.c_str(), &sb) != 0) {
    return io_error("cannot write {}: directory {} does not exist", shown, dir);
  }
  if (!S_ISDIR(sb.st_mode)) return io_error("cannot write {}: {} is not a directory", shown, dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return io_error("cannot write {}: directory {} is not writable ({})", shown, dir, std::strerror(errno));
  }
  return ok_status();
}

// ---- temporary files removed on a signal --------------------------------------------------------
// A fixed table, so the handler touches no heap and calls only async-signal-safe functions.
// state: 0 free, 1 being filled or emptied (the handler skips it), 2 live.
constexpr int kTempSlots = 64;
struct TempSlot {
  std::atomic<int> state{0};
  char path[PATH_MAX];
};
TempSlot g_temp_slots[kTempSlots];

int register_temp(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (g_temp_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_temp_slots[i].path, path.c_str(), path.size() + 1);
      g_temp_slots[i].state.store(2);
      return i;
    }
  }
  return -1;  // table full: the file is still removed by ~AtomicFile, just not on a signal
}

void release_temp(int slot) {
  if (slot < 0) return;
  g_temp_slots[slot].state.store(1);
  g_temp_slots[slot].state.store(0);
}

extern "C" void remove_temps_and_reraise(int sig) {
  for (TempSlot& s : g_temp_slots) {
    if (s.state.load() == 2) ::unlink(s.path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

Result<std::string> resolve_output_path(const std::string& path) {
  // The OS reads a path up to its first NUL: "a.st\0.bak" would write a.st.
  if (path.find('\0') != std::string::npos)
    return invalid_argument("output path holds a NUL byte at {} (the OS would cut the name there)", path.find('\0'));
  std::string p = path;
  for (int hop = 0; hop < 40; ++hop) {
    struct stat sb {};
    if (::lstat(p.c_str(), &sb) != 0 || !S_ISLNK(sb.st_mode)) return p;
    char buf[PATH_MAX];
    const ssize_t n = ::readlink(p.c_str(), buf, sizeof(buf) - 1);
    if (n < 0) return io_error("cannot read the link {}: {}", p, std::strerror(errno));
    const std::string link(buf, static_cast<size_t>(n));
    p = (link.front() == '/' || p.find('/') == std::string::npos) ? link : parent_dir(p) + "/" + link;
  }
  return io_error("output {}: too many levels of symbolic links", path);
}

Status check_output_path(const std::string& path, std::span<const std::string> inputs) {
  if (path.empty()) return invalid_argument("output path is empty");
  auto resolved = resolve_output_path(path);
  if (!resolved.ok()) return resolved.status();
  SPIN_RETURN_IF_ERROR(check_replaceable(path, resolved.value()));
  SPIN_RETURN_IF_ERROR(check_writable_dir(parent_dir(resolved.value()), path));
  struct stat out {};
  if (::stat(resolved->c_str(), &out) != 0) return ok_status();  // a new file: no input can be it
  for (const std::string& input : inputs) {
    struct stat in {};
    if (::stat(input.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      return invalid_argument("output {} is the input {}: refusing to overwrite an input", path, input);
    }
  }
  return ok_status();
}

Status check_output_dir(const std::string& dir) {
  if (dir.empty()) return invalid_argument("output directory is empty");
  struct stat sb {};
  if (::stat(dir.c_str(), &sb) == 0) {
    if (!S_ISDIR(sb.st_mode)) {
      return invalid_argument("output directory {} exists and is {}", dir,
                              S_ISREG(sb.st_mode) ? "a regular file" : file_kind(sb.st_mode));
    }
    return check_writable_dir(dir, dir + "/");
  }
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  return check_writable_dir(parent_dir(trimmed), dir);
}

void remove_temp_files_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = remove_temps_and_reraise;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &sa, nullptr);
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
  release_temp(slot_);
  slot_ = -1;
}

Status AtomicFile::create(const std::string& target) {
  discard();
  auto resolved = resolve_output_path(target);
  if (!resolved.ok()) return resolved.status();
  SPIN_RETURN_IF_ERROR(check_replaceable(target, resolved.value()));
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string p = fmt::format("{}.tmp-{}-{}", resolved.value(), static_cast<long>(::getpid()), counter.fetch_add(1));
    // Registered before it exists, so a signal between open() and here cannot leave it behind
    // (under qemu-user that window is wide enough for the CLI test's SIGTERM to land in it).
    const int slot = register_temp(p);
    // 0666 filtered by the umask: the same permissions a plain open() would give the file.
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) release_temp(slot);
    if (fd >= 0) {
      fd_ = fd;
      slot_ = slot;
      path_ = std::move(p);
      target_ = std::move(resolved).value();
      return ok_status();
    }
    if (errno != EEXIST) {
      return io_error("cannot create a temporary file next to {}: {}", target, std::strerror(errno));
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
      return io_error("cannot write {}: {}", target_, std::strerror(errno));
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
  return ok_status();
}

Status AtomicFile::commit() {
  if (fd_ < 0) return failed_precondition("AtomicFile::commit before create");
  if (::fsync(fd_) != 0) return io_error("cannot fsync {}: {}", path_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return io_error("cannot close {}: {}", path_, std::strerror(errno));
  if (::rename(path_.c_str(), target_.c_str()) != 0) {
    return io_error("cannot rename {} to {}: {}", path_, target_, std::strerror(errno));
  }
  path_.clear();  // renamed: nothing left to remove
  release_temp(slot_);
  slot_ = -1;
  // Make the rename itself durable; a failure here does not undo a complete, renamed file.
  const int dfd = ::open(parent_dir(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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
  return file.commit();
}

}  // namespace spin
