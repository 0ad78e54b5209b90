// Internal helpers that build a Status with a formatted message.
#pragma once

#include <fmt/format.h>

#include "spin/status.h"

namespace spin {

template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status out_of_range(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status resource_exhausted(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status failed_precondition(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status data_loss(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status io_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kIoError, fmt::format(f, std::forward<Args>(args)...)};
}

}  // namespace spin
