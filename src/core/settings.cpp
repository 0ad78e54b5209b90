// The key=value splitter of spin/settings.h.
#include "spin/settings.h"

#include "core/errors.h"

namespace spin {

Result<Setting> split_setting(std::string_view item) {
  const size_t eq = item.find('=');
  if (eq == std::string_view::npos || eq == 0) return invalid_argument("'{}' is not key=value", item);
  return Setting{std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))};
}

Status for_each_setting(std::string_view text,
                        const std::function<Status(const std::string& key, const std::string& value)>& apply) {
  const auto is_sep = [](char c) { return c == ' ' || c == ',' || c == '\n' || c == '\t'; };
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_sep(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !is_sep(text[j])) ++j;
    if (j > i) {
      auto s = split_setting(text.substr(i, j - i));
      if (!s.ok()) return s.status();
      SPIN_RETURN_IF_ERROR(apply(s->key, s->value));
    }
    i = j;
  }
  return ok_status();
}

}  // namespace spin
