// Shared by the spin_dsa._core sources: the argument layer (every array and scalar a Python caller
// passes is checked here before the library sees it) and Status → Python exception.
//
// Arrays, two kinds:
//  - Big inputs and outputs (scores, logits, keys, queries, `out`) cross without copies: they must
//    already have the dtype, C order and CPU device the library reads — numpy arrays through the
//    buffer protocol, torch CPU tensors through DLPack. Anything else (another dtype, negative or
//    zero strides, a list) is spin_dsa.InvalidType (a TypeError) naming the argument, never a
//    silent conversion: copying a gigabyte of logits per step would hide a real cost.
//  - Small index arrays (slots, seq_lens, accepted, block ids and offsets, visible counts,
//    block_table, ctx_len) are used in place when they are exactly the dtype and C-contiguous, and
//    otherwise COPIED once (lists, tuples, other integer dtypes, any strides): they are a few
//    kilobytes. Either way every value is range-checked against its type and what the library
//    trusts, and floats, bools, strings and objects are refused (no 1000.9 → 1000, no 2**32 → 0).
// Every size is multiplied in checked 64-bit arithmetic and compared with the machine's memory
// budget (spin/memory.h, the message the CLI prints) before anything is allocated.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
// Every source sees the same std::string caster: a TU without it would instantiate nb::cast<std::string>
// as a bound class (throwing bad_cast), and the linker may keep that copy for all of them (ODR).
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "spin/predict.h"
#include "spin/status.h"

namespace spin_py {

namespace nb = nanobind;
using InArray = nb::ndarray<nb::ro>;  // any dtype, shape, device: checked by array_data()
using OutArray = nb::ndarray<>;       // writable

// Argument and result types that only name, for the generated stub (_core.pyi, written at build
// time by nanobind's stubgen), what a caller may pass or gets. They accept any object: the
// bindings check it themselves (in_array, index_i32, config_from, ...) with the messages of this
// layer, where nanobind's own conversion would print a bare "incompatible function arguments".
inline bool any_object(PyObject*) { return true; }
#define SPIN_PY_NAMED_OBJECT(Type, stub_text)                              \
  class Type : public nb::object {                                         \
    NB_OBJECT_DEFAULT(Type, object, stub_text, ::spin_py::any_object)      \
  }
// A small index array (slots, seq_lens, block ids, ...): a list, tuple or integer array (copied
// when it is not exactly the dtype, see the banner).
SPIN_PY_NAMED_OBJECT(IndexArg, "numpy.typing.ArrayLike");
// A big input read in place: exactly the dtype the library reads (numpy array or torch CPU tensor).
SPIN_PY_NAMED_OBJECT(ArrayArg, "numpy.ndarray[writable=False]");
SPIN_PY_NAMED_OBJECT(F32ArrayArg, "numpy.ndarray[dtype=float32, writable=False]");
// An `out` the result is written into, or the result: that `out`, else a new numpy array.
SPIN_PY_NAMED_OBJECT(ArrayOut, "numpy.ndarray[]");
SPIN_PY_NAMED_OBJECT(FloatsArg, "collections.abc.Sequence[float]");  // diagnose's sparsities
// A PredictorConfig (config_from): a dict of fields or a 'key=value ...' string; None: defaults.
SPIN_PY_NAMED_OBJECT(ConfigArg, "collections.abc.Mapping[str, object] | str");

// Raises spin_dsa.<ErrorClass> (python/spin_dsa/_errors.py) with the library's message (invalid
// UTF-8 in a message — bytes from a corrupt file — is replaced, never a UnicodeDecodeError).
[[noreturn]] void raise_status(const spin::Status& status);
inline void check(const spin::Status& status) {
  if (!status.ok()) raise_status(status);
}
[[noreturn]] void raise_type(const std::string& message);    // InvalidType (TypeError too)
[[noreturn]] void raise_value(const std::string& message);   // InvalidArgument (ValueError too)
[[noreturn]] void raise_range(const std::string& message);   // OutOfRange (IndexError too)
[[noreturn]] void raise_busy(const std::string& message);    // FailedPrecondition
// A Python str from library text (paths, metadata, reports) that may hold invalid UTF-8.
nb::str py_str(const std::string& text);

template <typename T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  if constexpr (std::is_same_v<T, int64_t>) return "int64";
  if constexpr (std::is_same_v<T, uint8_t>) return "uint8";
  return "?";
}
std::string dtype_text(nb::dlpack::dtype d);  // "float64", "bool", "int16", ...
template <typename A>
std::string shape_text(const A& a) {  // "[3, 4]"
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

// An array (numpy, torch CPU tensor, anything with the buffer protocol or DLPack) or
// InvalidType naming the argument (a list, None, an object array, a read-only `out`).
InArray in_array(nb::handle obj, const char* name);
OutArray out_array(nb::handle obj, const char* name);

// The data of `a` when it is a C-contiguous CPU array of T with `ndim` dimensions (-1: any).
// Strides are checked for every dimension longer than 1, so negative and zero strides are refused.
template <typename T, typename A>
T* array_data(const A& a, const char* name, int ndim) {
  if (!a.is_valid()) raise_type(std::string(name) + ": expected an array");
  if (a.device_type() != nb::device::cpu::value)
    raise_type(std::string(name) + ": expected a CPU array (move it with .cpu())");
  if (a.dtype() != nb::dtype<std::remove_const_t<T>>())
    raise_type(std::string(name) + ": expected dtype " + dtype_name<std::remove_const_t<T>>() + ", got " +
               dtype_text(a.dtype()) + " (convert with .astype / .to; spin does not copy big arrays silently)");
  if (ndim >= 0 && a.ndim() != static_cast<size_t>(ndim))
    raise_value(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, got " +
                std::to_string(a.ndim()));
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      raise_type(std::string(name) + ": expected a C-contiguous array with positive strides (use "
                 "np.ascontiguousarray / .contiguous())");
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return static_cast<T*>(a.data());
}

// A small integer array of T, read in place or copied (see the banner). `shape` holds the
// expected extent of each dimension, -1 for any (checked before any copy, so a stride-0 array of
// huge apparent size is refused, not copied); every value must lie in [lo, hi].
template <typename T>
struct IndexArray {
  InArray held;           // keeps an in-place array alive
  std::vector<T> copied;  // or the copy
  const T* data = nullptr;
  std::vector<int64_t> shape;
  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(size_t i) const { return shape[i]; }
};

struct IndexSpec {
  const char* name;
  std::vector<int64_t> shape;  // -1: any extent
  int64_t lo;
  int64_t hi;
  const char* like = nullptr;  // "like slots": names what fixed an extent, for the message
  bool is_index = true;        // a value out of range: OutOfRange (an index) or InvalidArgument (a count)
};

IndexArray<int32_t> index_i32(nb::handle obj, const IndexSpec& spec);
IndexArray<int64_t> index_i64(nb::handle obj, const IndexSpec& spec);

// Scalars nanobind took as int64 (so 2**40 reaches us instead of nanobind's signature error),
// range-checked here with the argument's name.
int32_t int_arg(int64_t value, const char* name, int64_t lo, int64_t hi);
// threads: 0 (all) .. the machine's logical CPUs (spin::max_threads()).
int threads_arg(int64_t value);
// A file path: no NUL byte (the OS would silently cut the name there).
std::string path_arg(const std::string& path, const char* name);

// ResourceExhausted, before allocating, when `bytes` would not fit the memory budget: the same
// GiB message as the CLI (spin::check_fits_in_memory).
void check_fits(double bytes, const std::string& what);
// a · b in checked 64-bit arithmetic; InvalidArgument naming `what` on overflow.
int64_t checked_mul(int64_t a, int64_t b, const char* what);

// Whether [a, a + an) and [b, b + bn) share a byte (an output must not alias an input).
bool overlaps(const void* a, size_t an, const void* b, size_t bn);

// One call at a time on an object that is not thread-safe: the second concurrent (or re-entrant,
// from a callback during argument conversion) call raises FailedPrecondition instead of racing.
class CallGuard {
 public:
  CallGuard(std::atomic<bool>& busy, const char* what) : busy_(busy) {
    if (busy_.exchange(true)) {
      raise_busy(std::string(what) + ": another call on this object is in progress (it is not "
                 "thread-safe: one object per thread, calls one at a time)");
    }
  }
  ~CallGuard() { busy_.store(false); }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace spin_py

namespace spin_py {

// A numpy array that owns `values` (moved to the heap, freed with the array).
template <typename T>
nb::ndarray<nb::numpy, T> owned_array(std::vector<T>&& values, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner);
}

// PredictorConfig from None (defaults), a "key=value ..." string or a dict (values through
// str(); True/False as 1/0 are not needed: the config has no flags), validated.
spin::PredictorConfig config_from(nb::handle obj);
// The config as {field: value} with ints, floats and enum names as str.
nb::dict config_dict(const spin::PredictorConfig& config);

}  // namespace spin_py
