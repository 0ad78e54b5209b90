// spin/status.h — how every public entry point of the library reports failure.
//
// The library never aborts or throws on bad input: it returns a Status (or a Result<T>) whose
// message says what was wrong and what is supported. Only the command-line tool prints and exits.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace spin {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // a shape, size, pointer or value the call does not support
  kOutOfRange,          // an index (page, block, position) outside what exists
  kResourceExhausted,   // a pool or budget ran out
  kFailedPrecondition,  // the call is valid, but not in the object's current state
  kDataLoss,            // a file is truncated or corrupt
  kIoError,             // the operating system refused a read or write
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>", or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return {}; }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace spin

// Returns early from the enclosing function when `expr` yields a non-ok Status.
#define SPIN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::spin::Status spin_status_tmp_ = (expr);    \
    if (!spin_status_tmp_.ok()) return spin_status_tmp_; \
  } while (0)
