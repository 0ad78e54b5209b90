// spin_dsa._core: the nanobind module. Each area binds itself (predict.cpp, serving.cpp,
// trace.cpp, kernels.cpp); this file holds what they share: the Status → exception mapping, the
// argument layer declared in common.h (index arrays, scalars, paths, sizes, aliasing), and the
// translator that turns a C++ exception escaping a binding into the library's classes.
#include <nanobind/nanobind.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <typeinfo>

#include "common.h"
#include "spin/memory.h"

namespace spin_py {

namespace {

const char* error_class(spin::StatusCode code) {
  switch (code) {
    case spin::StatusCode::kInvalidArgument: return "InvalidArgument";
    case spin::StatusCode::kOutOfRange: return "OutOfRange";
    case spin::StatusCode::kResourceExhausted: return "ResourceExhausted";
    case spin::StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case spin::StatusCode::kDataLoss: return "DataLoss";
    case spin::StatusCode::kIoError: return "IoError";
    case spin::StatusCode::kOk: break;
  }
  return "SpinError";
}

}  // namespace

nb::str py_str(const std::string& text) {
  PyObject* s = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (s == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(s);
}

namespace {

void set_error(const char* cls, const std::string& message) {
  nb::object errors = nb::module_::import_("spin_dsa._errors");
  nb::str text = py_str(message);  // a corrupt file's bytes must not become a UnicodeDecodeError
  PyErr_SetObject(errors.attr(cls).ptr(), text.ptr());
}

[[noreturn]] void raise_as(const char* cls, const std::string& message) {
  set_error(cls, message);
  throw nb::python_error();
}

}  // namespace

void raise_status(const spin::Status& status) { raise_as(error_class(status.code()), status.message()); }
void raise_type(const std::string& message) { raise_as("InvalidType", message); }
void raise_value(const std::string& message) { raise_as("InvalidArgument", message); }
void raise_range(const std::string& message) { raise_as("OutOfRange", message); }
void raise_busy(const std::string& message) { raise_as("FailedPrecondition", message); }

std::string dtype_text(nb::dlpack::dtype d) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: kind = "dtype-code-" + std::to_string(d.code) + "-"; break;
  }
  return kind + std::to_string(d.bits);
}

namespace {

// What an object that is not an array is, for the message ("list", "NoneType", "numpy object array").
std::string kind_of(nb::handle obj) {
  nb::object dtype = nb::getattr(obj, "dtype", nb::none());
  std::string type = nb::cast<std::string>(nb::str(obj.type().attr("__name__")));
  if (!dtype.is_none()) type += " of dtype " + nb::cast<std::string>(nb::str(dtype));
  return type;
}

}  // namespace

InArray in_array(nb::handle obj, const char* name) {
  InArray a;
  if (obj.is_valid() && !obj.is_none() && nb::try_cast(obj, a, /*convert=*/false)) return a;
  raise_type(std::string(name) + ": expected a numpy array or torch CPU tensor, got " + kind_of(obj));
}

OutArray out_array(nb::handle obj, const char* name) {
  OutArray a;
  if (nb::try_cast(obj, a, /*convert=*/false)) return a;
  InArray ro;
  if (nb::try_cast(obj, ro, /*convert=*/false))
    raise_type(std::string(name) + ": the array is read-only; spin writes into it");
  raise_type(std::string(name) + ": expected a writable numpy array or torch CPU tensor, got " + kind_of(obj));
}

namespace {

// A list/tuple (or anything numpy can read) as an array; numpy's own error becomes InvalidType.
InArray index_source(nb::handle obj, const char* name) {
  InArray a;
  if (nb::try_cast(obj, a, /*convert=*/false)) return a;
  if (obj.is_none()) raise_type(std::string(name) + ": expected integers, got None");
  if (nb::isinstance<nb::str>(obj) || nb::isinstance<nb::bytes>(obj))
    raise_type(std::string(name) + ": expected integers, got " + kind_of(obj));
  nb::object arr;
  try {
    arr = nb::module_::import_("numpy").attr("asarray")(obj);
  } catch (nb::python_error& e) {
    raise_type(std::string(name) + ": expected integers (a list, tuple or integer array), got " + kind_of(obj) +
               " (" + e.what() + ")");
  }
  if (!nb::try_cast(arr, a, /*convert=*/false))
    raise_type(std::string(name) + ": expected integers, got " + kind_of(arr));
  return a;
}

// Reads element `i` (in C order) of an integer array of any strides as int64, or false when the
// value does not fit (uint64 above INT64_MAX).
bool read_int(const InArray& a, int64_t i, int64_t* out) {
  int64_t offset = 0;  // in elements
  for (size_t d = a.ndim(); d-- > 0;) {
    const int64_t n = static_cast<int64_t>(a.shape(d));
    offset += (i % n) * a.stride(d);
    i /= n;
  }
  const auto* base = static_cast<const uint8_t*>(a.data());
  const int64_t bytes = a.dtype().bits / 8;
  const uint8_t* p = base + offset * bytes;
  const bool is_signed = a.dtype().code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
  switch (bytes) {
    case 1: *out = is_signed ? int64_t{*reinterpret_cast<const int8_t*>(p)} : int64_t{*p}; return true;
    case 2: {
      int16_t s; uint16_t u;
      std::memcpy(&s, p, 2); std::memcpy(&u, p, 2);
      *out = is_signed ? int64_t{s} : int64_t{u};
      return true;
    }
    case 4: {
      int32_t s; uint32_t u;
      std::memcpy(&s, p, 4); std::memcpy(&u, p, 4);
      *out = is_signed ? int64_t{s} : int64_t{u};
      return true;
    }
    default: {
      int64_t s; uint64_t u;
      std::memcpy(&s, p, 8); std::memcpy(&u, p, 8);
      if (!is_signed && u > static_cast<uint64_t>(INT64_MAX)) return false;
      *out = is_signed ? s : static_cast<int64_t>(u);
      return true;
    }
  }
}

template <typename T>
IndexArray<T> index_array(nb::handle obj, const IndexSpec& spec) {
  const std::string name = spec.name;
  IndexArray<T> r;
  InArray a = index_source(obj, spec.name);
  if (a.device_type() != nb::device::cpu::value)
    raise_type(name + ": expected a CPU array (move it with .cpu())");
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype().code);
  const int bits = a.dtype().bits;
  if ((code != nb::dlpack::dtype_code::Int && code != nb::dlpack::dtype_code::UInt) || a.dtype().lanes != 1 ||
      (bits != 8 && bits != 16 && bits != 32 && bits != 64))
    raise_type(name + ": expected integers, got dtype " + dtype_text(a.dtype()) +
               " (floats, bools and strings are not read as integers)");
  if (a.ndim() != spec.shape.size())
    raise_value(name + ": expected " + std::to_string(spec.shape.size()) + " dimension(s), got " +
                std::to_string(a.ndim()) + " (shape " + shape_text(a) + ")");
  int64_t size = 1;
  for (size_t d = 0; d < a.ndim(); ++d) {
    const int64_t n = static_cast<int64_t>(a.shape(d));
    if (spec.shape[d] >= 0 && n != spec.shape[d]) {
      std::string want = "[";
      for (size_t e = 0; e < spec.shape.size(); ++e)
        want += (e ? ", " : "") + (spec.shape[e] < 0 ? std::string("any") : std::to_string(spec.shape[e]));
      raise_value(name + ": expected shape " + want + "]" + (spec.like ? std::string(" (like ") + spec.like + ")" : "") +
                  ", got " + shape_text(a));
    }
    r.shape.push_back(n);
    size = checked_mul(size, n, spec.name);
  }
  if (size > INT32_MAX)
    raise_value(name + ": " + std::to_string(size) + " elements is above the 2^31 - 1 a length may hold");
  // In place: exactly T, C order, positive strides.
  bool in_place = a.dtype() == nb::dtype<T>();
  int64_t expect = 1;
  for (size_t d = a.ndim(); in_place && d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect) in_place = false;
    expect *= static_cast<int64_t>(a.shape(d));
  }
  if (!in_place) {
    check_fits(static_cast<double>(size) * sizeof(T), name + " (copied)");
    r.copied.resize(static_cast<size_t>(size));
  }
  const int64_t lo = std::max<int64_t>(spec.lo, std::numeric_limits<T>::min());
  const int64_t hi = std::min<int64_t>(spec.hi, std::numeric_limits<T>::max());
  for (int64_t i = 0; i < size; ++i) {
    int64_t v = 0;
    const bool fits = in_place ? (v = static_cast<const T*>(a.data())[i], true) : read_int(a, i, &v);
    if (!fits || v < lo || v > hi) {
      const std::string where = r.shape.size() == 1 ? name + "[" + std::to_string(i) + "]"
                                                    : name + " (flat element " + std::to_string(i) + ")";
      const std::string text = where + " = " + (fits ? std::to_string(v) : std::string("a value above 2^63")) +
                               " is outside " + std::to_string(lo) + ".." + std::to_string(hi);
      if (spec.is_index) raise_range(text);
      raise_value(text);
    }
    if (!in_place) r.copied[static_cast<size_t>(i)] = static_cast<T>(v);
  }
  if (in_place) {
    r.held = a;
    r.data = static_cast<const T*>(a.data());
  } else {
    r.data = r.copied.data();
  }
  return r;
}

}  // namespace

IndexArray<int32_t> index_i32(nb::handle obj, const IndexSpec& spec) { return index_array<int32_t>(obj, spec); }
IndexArray<int64_t> index_i64(nb::handle obj, const IndexSpec& spec) { return index_array<int64_t>(obj, spec); }

int32_t int_arg(int64_t value, const char* name, int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, INT32_MIN);
  hi = std::min<int64_t>(hi, INT32_MAX);
  if (value < lo || value > hi)
    raise_value(std::string(name) + ": " + std::to_string(value) + " is outside " + std::to_string(lo) + ".." +
                std::to_string(hi));
  return static_cast<int32_t>(value);
}

int threads_arg(int64_t value) {
  const int most = spin::max_threads();
  if (value < 0 || value > most)
    raise_value("threads: " + std::to_string(value) + " is outside 0.." + std::to_string(most) +
                " (0 = all of this machine's " + std::to_string(most) + " logical CPUs)");
  return static_cast<int>(value);
}

std::string path_arg(const std::string& path, const char* name) {
  if (path.find('\0') != std::string::npos)
    raise_value(std::string(name) + ": the path holds a NUL byte at " + std::to_string(path.find('\0')) +
                " (the OS would cut the name there)");
  if (path.empty()) raise_value(std::string(name) + ": the path is empty");
  return path;
}

void check_fits(double bytes, const std::string& what) { check(spin::check_fits_in_memory(bytes, what)); }

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    raise_value(std::string(what) + ": the size " + std::to_string(a) + " × " + std::to_string(b) +
                " does not fit 64 bits");
  return r;
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (a == nullptr || b == nullptr || an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

namespace {

// C++ exceptions that escape a binding (they should not: every size is checked before it is
// allocated) still arrive as the library's classes, never as a bare MemoryError/RuntimeError.
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const std::bad_alloc&) {
    set_error("ResourceExhausted", "out of memory (std::bad_alloc): the call needs more memory than this process can get");
  } catch (const std::length_error& e) {
    set_error("ResourceExhausted", std::string("a size is too large (") + e.what() + ")");
  } catch (const std::bad_cast&) {  // nb::cast_error too
    set_error("InvalidType", "an argument has the wrong type (it could not be converted)");
  }
}

}  // namespace

void bind_predict(nb::module_& m);
void bind_serving(nb::module_& m);
void bind_trace(nb::module_& m);
void bind_kernels(nb::module_& m);

}  // namespace spin_py

NB_MODULE(_core, m) {
  nanobind::register_exception_translator(&spin_py::translate);
  m.doc() = "spin's C++ library (include/spin/*.h) for Python; import spin_dsa, not this module.";
  spin_py::bind_predict(m);
  spin_py::bind_serving(m);
  spin_py::bind_trace(m);
  spin_py::bind_kernels(m);
}
