// spin_dsa._core: the nanobind module. Each area binds itself (predict.cpp, serving.cpp,
// trace.cpp, kernels.cpp); this file holds the Status → exception mapping they share.
#include <nanobind/nanobind.h>

#include "common.h"

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

void raise_status(const spin::Status& status) {
  nb::object errors = nb::module_::import_("spin_dsa._errors");
  nb::object cls = errors.attr(error_class(status.code()));
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw nb::python_error();
}

void raise_type(const std::string& message) {
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

void raise_value(const std::string& message) {
  nb::object errors = nb::module_::import_("spin_dsa._errors");
  PyErr_SetString(errors.attr("InvalidArgument").ptr(), message.c_str());
  throw nb::python_error();
}

InArray as_index_array(nb::handle obj, const char* dtype) {
  InArray a;
  if (nb::try_cast(obj, a, /*convert=*/false)) {
    const bool exact = std::string(dtype) == "int32" ? a.dtype() == nb::dtype<int32_t>()
                                                      : a.dtype() == nb::dtype<int64_t>();
    if (exact && a.device_type() == nb::device::cpu::value) return a;
  }
  nb::object np = nb::module_::import_("numpy");
  nb::object arr = np.attr("ascontiguousarray")(obj, nb::arg("dtype") = dtype);
  return nb::cast<InArray>(arr);
}

void bind_predict(nb::module_& m);
void bind_serving(nb::module_& m);
void bind_trace(nb::module_& m);
void bind_kernels(nb::module_& m);

}  // namespace spin_py

NB_MODULE(_core, m) {
  m.doc() = "spin's C++ library (include/spin/*.h) for Python; import spin_dsa, not this module.";
  spin_py::bind_predict(m);
  spin_py::bind_serving(m);
  spin_py::bind_trace(m);
  spin_py::bind_kernels(m);
}
