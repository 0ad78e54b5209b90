// spin/settings.h — the one parser of "key=value" settings (predictor configs, workload fields,
// `--set` flags). It only splits: each owner's set(key, value) says what a key means.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "spin/status.h"

namespace spin {

struct Setting {
  std::string key, value;
};

// One "key=value" item, split at its first '='. kInvalidArgument "'item' is not key=value" when
// there is no '=' or nothing before it.
Result<Setting> split_setting(std::string_view item);

// Splits `text` into items separated by spaces, commas, tabs or newlines and calls apply(key,
// value) on each in order; stops at the first error (a malformed item or apply's).
Status for_each_setting(std::string_view text,
                        const std::function<Status(const std::string& key, const std::string& value)>& apply);

}  // namespace spin
