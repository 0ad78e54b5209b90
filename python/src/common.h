// Shared by the spin_dsa._core sources: Status → Python exception, and array checks.
//
// Arrays cross the boundary without copies: big inputs (scores, logits, keys, queries) must already
// have the dtype, C order and CPU device the library reads — numpy arrays through the buffer
// protocol, torch CPU tensors through DLPack — and a mismatch is a TypeError naming the argument,
// never a silent conversion. Small index arrays (slots, seq_lens, accepted) may also be lists.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "spin/predict.h"
#include "spin/status.h"

namespace spin_py {

namespace nb = nanobind;
using InArray = nb::ndarray<nb::ro>;  // any dtype, shape, device: checked by in_array()
using OutArray = nb::ndarray<>;       // writable

// Raises spin_dsa.<ErrorClass> (python/spin_dsa/_errors.py) with the library's message.
[[noreturn]] void raise_status(const spin::Status& status);
inline void check(const spin::Status& status) {
  if (!status.ok()) raise_status(status);
}
[[noreturn]] void raise_type(const std::string& message);
[[noreturn]] void raise_value(const std::string& message);

template <typename T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  if constexpr (std::is_same_v<T, int64_t>) return "int64";
  if constexpr (std::is_same_v<T, uint8_t>) return "uint8";
  return "?";
}

// The data of `a` when it is a C-contiguous CPU array of T with `ndim` dimensions (-1: any).
template <typename T, typename A>
T* array_data(const A& a, const char* name, int ndim) {
  if (!a.is_valid()) raise_type(std::string(name) + ": expected an array");
  if (a.device_type() != nb::device::cpu::value)
    raise_type(std::string(name) + ": expected a CPU array (move it with .cpu())");
  if (a.dtype() != nb::dtype<std::remove_const_t<T>>())
    raise_type(std::string(name) + ": expected dtype " + dtype_name<std::remove_const_t<T>>() +
               " (convert with .astype / .to; spin does not copy arrays silently)");
  if (ndim >= 0 && a.ndim() != static_cast<size_t>(ndim))
    raise_value(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, got " +
                std::to_string(a.ndim()));
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      raise_type(std::string(name) + ": expected a C-contiguous array (use np.ascontiguousarray / .contiguous())");
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return static_cast<T*>(a.data());
}

// Small integer arrays: an array of exactly T is used in place; anything else (a list, another
// integer dtype) goes through numpy.ascontiguousarray(x, dtype) once.
InArray as_index_array(nb::handle obj, const char* dtype);

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
