// safetensors reading and writing (see safetensors.h).
#include "trace/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/errors.h"

namespace spin::st {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; spin reads it in place");

namespace {

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 1},     {Dtype::kU8, "U8", 1},       {Dtype::kI8, "I8", 1},
    {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kF8E5M2, "F8_E5M2", 1}, {Dtype::kU16, "U16", 2},
    {Dtype::kI16, "I16", 2},       {Dtype::kF16, "F16", 2},     {Dtype::kBF16, "BF16", 2},
    {Dtype::kU32, "U32", 4},       {Dtype::kI32, "I32", 4},     {Dtype::kF32, "F32", 4},
    {Dtype::kU64, "U64", 8},       {Dtype::kI64, "I64", 8},     {Dtype::kF64, "F64", 8},
};

const char* json_type(const nlohmann::json& j) { return j.type_name(); }

// A short, non-recursive rendering of a JSON value for error messages (hostile headers may nest
// arbitrarily deep or be arbitrarily long).
std::string brief(const nlohmann::json& j) {
  std::string s;
  if (j.is_primitive()) {
    s = j.dump();
  } else {
    bool flat = j.size() <= 8;
    for (const auto& e : j)
      if (!e.is_primitive()) flat = false;
    s = flat ? j.dump() : fmt::format("a JSON {} of {} elements", j.type_name(), j.size());
  }
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// A JSON value that must be a non-negative integer fitting in int64.
bool as_index(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return *out <= static_cast<uint64_t>(INT64_MAX);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

// A parse callback that records the first key an object names twice (as "\"key\"").
auto duplicate_key_finder(std::string* duplicate) {
  return [duplicate, keys = std::vector<std::set<std::string>>()](
             int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) mutable {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        duplicate->empty()) {
      *duplicate = fmt::format("\"{}\"", parsed.get<std::string>());
    }
    return true;
  };
}

}  // namespace

const char* dtype_name(Dtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

size_t dtype_size(Dtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.size;
  return 1;
}

bool dtype_from_name(std::string_view name, Dtype* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the reader checked that this cannot overflow
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reading

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  int fd = -1;  // kept open for a file mapping, to fstat its size; -1 for a copy
  ~Mapping() {
    if (addr != nullptr) munmap(addr, size);
    if (fd >= 0) ::close(fd);
  }
};

namespace {

// Reads the whole file into fresh anonymous pages (page-aligned, as a mapping would be).
Result<void*> copy_file(int fd, size_t size, const std::string& path) {
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) return resource_exhausted("cannot allocate {} bytes to read {}: {}", size, path, std::strerror(errno));
  madvise(addr, size, MADV_HUGEPAGE);  // 2 MiB pages where the kernel allows: far fewer faults
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<uint8_t*>(addr) + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      munmap(addr, size);
      if (err == 0) return data_loss("{}: the file shrank to {} bytes while it was read ({} at open)", path, done, size);
      return io_error("cannot read {}: {}", path, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  mprotect(addr, size, PROT_READ);  // read-only, as the mapping it stands for
  return addr;
}

}  // namespace

bool SafetensorsFile::mapped() const { return mapping_ != nullptr && mapping_->fd >= 0; }

Status SafetensorsFile::check_unchanged() const {
  if (!mapped()) return ok_status();
  struct stat sb {};
  if (fstat(mapping_->fd, &sb) != 0) return io_error("cannot stat {}: {}", label_, std::strerror(errno));
  if (static_cast<size_t>(sb.st_size) < size_) {
    return data_loss("{}: the file shrank from {} to {} bytes while it was open (truncated under the reader); "
                     "reopen it",
                     label_, size_, static_cast<size_t>(sb.st_size));
  }
  return ok_status();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path, uint64_t copy_below_bytes) {
  if (path.find('\0') != std::string::npos)  // the OS would open the name cut at the NUL
    return invalid_argument("path holds a NUL byte at {} (the OS would cut the name there)", path.find('\0'));
  // O_NONBLOCK: opening a named pipe must not wait for a writer; fstat below then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_error("cannot open {}: {}", path, std::strerror(errno));
  struct stat sb {};
  if (fstat(fd, &sb) != 0) {
    const int err = errno;
    ::close(fd);
    return io_error("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    return invalid_argument("{} is not a regular file (a trace is read from a file on disk)", path);
  }
  SafetensorsFile file;
  file.label_ = path;
  file.size_ = static_cast<size_t>(sb.st_size);
  if (file.size_ > 0 && file.size_ <= copy_below_bytes) {
    auto copy = copy_file(fd, file.size_, path);
    ::close(fd);
    if (!copy.ok()) return copy.status();
    file.mapping_ = std::make_unique<Mapping>();
    file.mapping_->addr = copy.value();
    file.mapping_->size = file.size_;
    file.bytes_ = static_cast<const uint8_t*>(copy.value());
  } else if (file.size_ > 0) {
    void* addr = mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return io_error("cannot memory-map {} ({} bytes): {}", path, file.size_, std::strerror(err));
    }
    file.mapping_ = std::make_unique<Mapping>();
    file.mapping_->addr = addr;
    file.mapping_->size = file.size_;
    file.mapping_->fd = fd;  // kept: check_unchanged() fstats it
    file.bytes_ = static_cast<const uint8_t*>(addr);
  } else {
    ::close(fd);
  }
  SPIN_RETURN_IF_ERROR(file.parse());
  return file;
}

Result<SafetensorsFile> SafetensorsFile::from_memory(const void* data, size_t size,
                                                     std::string label) {
  SafetensorsFile file;
  file.label_ = std::move(label);
  file.bytes_ = static_cast<const uint8_t*>(data);
  file.size_ = data == nullptr ? 0 : size;
  SPIN_RETURN_IF_ERROR(file.parse());
  return file;
}

// Validation order: length field, header bounds, JSON syntax, top-level object, metadata, then
// each tensor entry (dtype, shape, offsets, size) in the header's order, then overlaps between
// tensors: the order the error messages promise, one stage per function below.
Status SafetensorsFile::parse() {
  nlohmann::json header;
  size_t data_size = 0;
  SPIN_RETURN_IF_ERROR(parse_header(&header, &data_size));
  try {
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        SPIN_RETURN_IF_ERROR(parse_metadata(value));
      } else {
        SPIN_RETURN_IF_ERROR(parse_entry(name, value, data_size));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    // Defensive: every access is type-checked first, so this should be unreachable.
    return data_loss("{}: malformed header ({})", label_, e.what());
  }
  return check_contiguous(data_size);
}

// The length field, the header's bounds, its bytes and JSON syntax, and that it is one object.
Status SafetensorsFile::parse_header(nlohmann::json* header, size_t* data_size) {
  const std::string& f = label_;
  if (size_ < 8) {
    return data_loss("{}: file is {} bytes; a safetensors file starts with an 8-byte "
                     "little-endian header length (truncated or not a safetensors file)",
                     f, size_);
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes_, 8);
  if (header_len > size_ - 8) {
    return data_loss("{}: header length field says {} bytes but only {} bytes follow it "
                     "(file truncated or not a safetensors file)",
                     f, header_len, size_ - 8);
  }
  const auto* header_begin = reinterpret_cast<const char*>(bytes_ + 8);
  data_ = bytes_ + 8 + header_len;
  *data_size = size_ - 8 - static_cast<size_t>(header_len);

  // As the reference reader (serde_json), a NUL byte anywhere in the header is an error; JSON
  // itself allows none outside strings and only escaped inside.
  if (const void* nul = std::memchr(header_begin, 0, static_cast<size_t>(header_len)); nul != nullptr) {
    return data_loss("{}: header holds a NUL byte at offset {} (a safetensors header is JSON text, "
                     "padded with spaces only)",
                     f, 8 + (static_cast<const char*>(nul) - header_begin));
  }
  std::string duplicate;
  try {
    *header = nlohmann::json::parse(header_begin, header_begin + header_len, duplicate_key_finder(&duplicate));
  } catch (const nlohmann::json::exception& e) {
    return data_loss("{}: header is not valid JSON ({})", f, e.what());
  }
  // Stricter than the reference reader, which keeps the last of two equal keys: a file that
  // names a tensor or a metadata key twice is ambiguous, so it is refused.
  if (!duplicate.empty()) return data_loss("{}: header names {} twice", f, duplicate);
  if (!header->is_object()) {
    return data_loss("{}: header is a JSON {}, expected an object of tensors", f,
                     json_type(*header));
  }
  return ok_status();
}

// __metadata__: an object of strings.
Status SafetensorsFile::parse_metadata(const nlohmann::json& value) {
  const std::string& f = label_;
  if (!value.is_object()) {
    return data_loss("{}: __metadata__ is a JSON {}, expected an object of strings", f,
                     json_type(value));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return data_loss("{}: __metadata__[\"{}\"] is a JSON {}, expected a string", f, key,
                       json_type(v));
    }
    metadata_[key] = v.get<std::string>();
  }
  return ok_status();
}

// One tensor entry: dtype, shape, data_offsets, and that its bytes match dtype × shape.
Status SafetensorsFile::parse_entry(const std::string& name, const nlohmann::json& value, size_t data_size) {
  const std::string& f = label_;
  if (!value.is_object()) {
    return data_loss("{}: tensor \"{}\" header entry is a JSON {}, expected an object with "
                     "dtype, shape and data_offsets",
                     f, name, json_type(value));
  }
  Entry e{};
  // dtype
  const auto dt = value.find("dtype");
  if (dt == value.end()) return data_loss("{}: tensor \"{}\" has no dtype", f, name);
  if (!dt->is_string()) {
    return data_loss("{}: tensor \"{}\" dtype is a JSON {}, expected a string such as "
                     "\"F32\"",
                     f, name, json_type(*dt));
  }
  const std::string dtype_str = dt->get<std::string>();
  if (!dtype_from_name(dtype_str, &e.dtype)) {
    return data_loss("{}: tensor \"{}\" has unknown dtype \"{}\" (supported: BOOL, U8, I8, "
                     "F8_E4M3, F8_E5M2, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64)",
                     f, name, dtype_str);
  }
  // shape
  const auto sh = value.find("shape");
  if (sh == value.end()) return data_loss("{}: tensor \"{}\" has no shape", f, name);
  if (!sh->is_array()) {
    return data_loss("{}: tensor \"{}\" shape is a JSON {}, expected an array of "
                     "non-negative integers",
                     f, name, json_type(*sh));
  }
  uint64_t nbytes = dtype_size(e.dtype);
  bool overflow = false;
  for (const auto& d : *sh) {
    uint64_t dim = 0;
    if (!as_index(d, &dim)) {
      return data_loss("{}: tensor \"{}\" shape holds {}, expected non-negative integers", f,
                       name, brief(d));
    }
    e.shape.push_back(static_cast<int64_t>(dim));
    if (!overflow && __builtin_mul_overflow(nbytes, dim, &nbytes)) overflow = true;
  }
  // A zero dimension makes the size 0 whatever the others are.
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
    nbytes = 0;
    overflow = false;
  }
  if (overflow || nbytes > static_cast<uint64_t>(INT64_MAX)) {
    return data_loss("{}: tensor \"{}\" shape {} overflows 64-bit byte counts", f, name,
                     brief(*sh));
  }
  // data_offsets
  const auto off = value.find("data_offsets");
  if (off == value.end()) return data_loss("{}: tensor \"{}\" has no data_offsets", f, name);
  uint64_t begin = 0, end = 0;
  if (!off->is_array() || off->size() != 2 || !as_index((*off)[0], &begin) ||
      !as_index((*off)[1], &end)) {
    return data_loss("{}: tensor \"{}\" data_offsets is {}, expected [begin, end] with "
                     "non-negative integers",
                     f, name, brief(*off));
  }
  if (end < begin) {
    return data_loss("{}: tensor \"{}\" data_offsets [{}, {}] end before begin", f, name,
                     begin, end);
  }
  if (end > data_size) {
    return data_loss("{}: tensor \"{}\" data_offsets [{}, {}] run past the {} data bytes "
                     "of the file (truncated?)",
                     f, name, begin, end, data_size);
  }
  if (end - begin != nbytes) {
    return data_loss("{}: tensor \"{}\" holds {} bytes but dtype {} and shape {} need {}", f,
                     name, end - begin, dtype_str, brief(*sh), nbytes);
  }
  e.begin = static_cast<size_t>(begin);
  e.end = static_cast<size_t>(end);
  entries_.emplace(name, std::move(e));
  return ok_status();
}

// As the reference reader: sorted by offsets, each tensor begins where the previous one ended
// (no overlap, no gap), the first at 0, and the last ends at the end of the file.
Status SafetensorsFile::check_contiguous(size_t data_size) const {
  std::vector<std::pair<const std::string*, const Entry*>> order;
  for (const auto& [name, e] : entries_) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  size_t expected = 0;
  const std::pair<const std::string*, const Entry*>* previous = nullptr;
  for (const auto& item : order) {
    const auto& [name, e] = item;
    if (e->begin < expected) {
      return data_loss("{}: tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap", label_, *previous->first,
                       previous->second->begin, previous->second->end, *name, e->begin, e->end);
    }
    if (e->begin > expected) {
      return data_loss("{}: {} unused data bytes before tensor \"{}\" [{}, {}) (tensors must be "
                       "packed, as the safetensors format requires)",
                       label_, e->begin - expected, *name, e->begin, e->end);
    }
    expected = e->end;
    previous = &item;
  }
  if (expected != data_size) {
    return data_loss("{}: {} trailing bytes after the last tensor (the data section must end "
                     "with the last tensor; truncated header or appended data?)",
                     label_, data_size - expected);
  }
  return ok_status();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

Result<TensorView> SafetensorsFile::tensor(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    return invalid_argument("{}: no tensor named \"{}\"", label_, name);
  }
  TensorView v;
  v.name = it->first;
  v.dtype = it->second.dtype;
  v.shape = it->second.shape;
  v.data = data_ + it->second.begin;
  v.nbytes = it->second.end - it->second.begin;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Writing

Status write_safetensors(const std::string& path, std::span<const TensorSpec> tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Validate everything before touching the file system.
  std::set<std::string_view> seen;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") {
      return invalid_argument("tensor name \"__metadata__\" is reserved by safetensors");
    }
    if (!seen.insert(t.name).second) {
      return invalid_argument("tensor \"{}\" appears twice", t.name);
    }
    uint64_t nbytes = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) return invalid_argument("tensor \"{}\" has negative dimension {}", t.name, d);
      if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes)) {
        return invalid_argument("tensor \"{}\" shape overflows 64-bit byte counts", t.name);
      }
    }
    if (nbytes != t.nbytes) {
      return invalid_argument("tensor \"{}\" has {} bytes but dtype {} and its shape need {}",
                              t.name, t.nbytes, dtype_name(t.dtype), nbytes);
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      return invalid_argument("tensor \"{}\" has {} bytes but a null data pointer", t.name,
                              t.nbytes);
    }
  }

  // Data order: larger itemsize first, then name, so every tensor stays aligned (the header
  // is padded to 8 bytes and 8 is a multiple of every itemsize).
  std::vector<const TensorSpec*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const TensorSpec* a, const TensorSpec* b) {
    const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    if (sa != sb) return sa > sb;
    return a->name < b->name;
  });

  std::string header;
  try {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata) m[k] = v;
      j["__metadata__"] = std::move(m);
    }
    uint64_t offset = 0;
    for (const TensorSpec* t : order) {
      nlohmann::ordered_json e = nlohmann::ordered_json::object();
      e["dtype"] = dtype_name(t->dtype);
      e["shape"] = t->shape;
      e["data_offsets"] = {offset, offset + t->nbytes};
      offset += t->nbytes;
      j[t->name] = std::move(e);
    }
    header = j.dump();
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("cannot encode the safetensors header (tensor names and metadata "
                            "must be valid UTF-8): {}",
                            e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t header_len = header.size();

  AtomicFile tmp;
  SPIN_RETURN_IF_ERROR(tmp.create(path));
  uint8_t len_bytes[8];
  std::memcpy(len_bytes, &header_len, 8);
  SPIN_RETURN_IF_ERROR(tmp.write(len_bytes, 8));
  SPIN_RETURN_IF_ERROR(tmp.write(header.data(), header.size()));
  for (const TensorSpec* t : order) {
    SPIN_RETURN_IF_ERROR(tmp.write(t->data, t->nbytes));
  }
  return tmp.commit();
}

}  // namespace spin::st
