// safetensors reading and writing: the container format of spin trace files (schema: spin/trace.h).
//
// Format (https://github.com/huggingface/safetensors, the same bytes the Python package writes):
//   [u64 little-endian N][N bytes of UTF-8 JSON header][data bytes]
//   header = {"__metadata__": {str: str},  (optional)
//             "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...}
//   offsets are relative to the first data byte; tensors are C-order, little-endian.
//
// This file owns the container only: the reader memory-maps (or borrows) the bytes and validates
// every header field once, with one clear message per fault; the writer writes atomically. What
// the tensors *mean* is trace_schema.cpp's business. Internal to src/trace: tools see spin/trace.h only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "spin/status.h"

namespace spin::st {

// The dtypes of the safetensors format. Itemsizes are whole bytes (sub-byte types unsupported).
enum class Dtype : uint8_t {
  kBool, kU8, kI8, kF8E4M3, kF8E5M2, kU16, kI16, kF16, kBF16, kU32, kI32, kF32, kU64, kI64, kF64,
};

const char* dtype_name(Dtype dtype);       // "F32", ... (the header spelling)
size_t dtype_size(Dtype dtype);            // bytes per element
bool dtype_from_name(std::string_view name, Dtype* out);  // false for an unknown spelling

// A tensor inside a mapped file: a view, valid while its SafetensorsFile lives.
struct TensorView {
  std::string_view name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // may be unaligned for the dtype (see TensorView::aligned)
  size_t nbytes = 0;

  int64_t numel() const;
  bool aligned() const {
    return reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0;
  }
};

// A validated, read-only safetensors file. Move-only; unmaps on destruction.
class SafetensorsFile {
 public:
  // Reads `path` and validates the header. A file up to kCopyBelowBytes is copied into private
  // memory at open, so that truncating or rewriting it afterwards cannot fault a reader (SIGBUS);
  // a larger one is memory-mapped read-only, and check_unchanged() tells whether it shrank since.
  // Measured (README "Python"): copying costs about what reading the file once does; a mapping
  // reads only what is touched. 256 MiB keeps every generated test trace and a real-model trace
  // of a few thousand tokens copied, and the copy's RAM small next to the memory budget.
  static constexpr size_t kCopyBelowBytes = size_t{256} << 20;
  static Result<SafetensorsFile> open(const std::string& path, uint64_t copy_below_bytes = kCopyBelowBytes);
  // Validates `size` bytes at `data`, which the caller keeps alive and unchanged for the lifetime
  // of the returned object (nothing is copied). `label` names the source in error messages.
  static Result<SafetensorsFile> from_memory(const void* data, size_t size,
                                             std::string label = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  // The tensor `name`, or kInvalidArgument naming the missing tensor.
  Result<TensorView> tensor(std::string_view name) const;
  size_t file_size() const { return size_; }
  const std::string& label() const { return label_; }
  // Whether the bytes are a live mapping of the file (else a private copy or borrowed memory).
  bool mapped() const;
  // kDataLoss when a mapped file is now shorter than at open (reading the lost tail would raise
  // SIGBUS); ok for a copy, borrowed memory, or a file replaced by rename (the mapping keeps the
  // old one).
  Status check_unchanged() const;

 private:
  struct Entry {
    Dtype dtype;
    std::vector<int64_t> shape;
    size_t begin, end;  // relative to data_
  };
  struct Mapping;  // RAII mmap (of the file, or anonymous holding its copy)
  SafetensorsFile() = default;
  Status parse();
  Status parse_header(nlohmann::json* header, size_t* data_size);
  Status parse_metadata(const nlohmann::json& value);
  Status parse_entry(const std::string& name, const nlohmann::json& value, size_t data_size);
  Status check_contiguous(size_t data_size) const;

  std::unique_ptr<Mapping> mapping_;  // null when borrowing memory
  const uint8_t* bytes_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // first byte after the header
  std::string label_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// One tensor to write: `nbytes` bytes at `data` (C order, little-endian), which must equal
// product(shape) · dtype_size(dtype).
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a safetensors file atomically: a temporary file in the same directory is written,
// fsync'ed and renamed over `path`. On any failure the temporary file is removed and an existing
// file at `path` is left untouched. Tensors are laid out by decreasing itemsize, then name (as
// the Python package does), so every tensor is aligned to its itemsize once mapped; the header is
// padded with spaces to a multiple of 8 bytes.
Status write_safetensors(const std::string& path, std::span<const TensorSpec> tensors,
                         const std::map<std::string, std::string>& metadata);

}  // namespace spin::st
