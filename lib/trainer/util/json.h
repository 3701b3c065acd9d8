// Integers read from JSON files of outside origin (model.json, a checkpoint's state.json).
// nlohmann's get<int64_t>() converts a float such as 1e300 by a cast, which is undefined
// behaviour (found by fuzzing), and does not check ranges: these accept only JSON integers within
// [lo, hi]. Header-only; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer/util/error.h"

namespace trainer::util {

// j[key] as an integer in [lo, hi]; a missing key, another type, a float or a value out of
// range is a DataError "<where>: <key>: expected an integer in [lo, hi], got <value>".
inline int64_t json_int(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi,
                        const std::string& where) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  const bool found = j.is_object() && it != j.end();
  if (found) {
    if (it->is_number_integer() && !it->is_number_unsigned()) {
      const int64_t v = it->get<int64_t>();
      if (v >= lo && v <= hi) return v;
    } else if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      if (lo <= 0 && v <= static_cast<uint64_t>(hi)) return static_cast<int64_t>(v);
      if (lo > 0 && v >= static_cast<uint64_t>(lo) && v <= static_cast<uint64_t>(hi)) {
        return static_cast<int64_t>(v);
      }
    }
  }
  throw DataError(where + ": " + key + ": expected an integer in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "], got " + (found ? it->dump() : std::string("nothing")));
}

// The same, with `fallback` when the key is absent.
inline int64_t json_int_or(const nlohmann::json& j, const std::string& key, int64_t fallback,
                           int64_t lo, int64_t hi, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  return json_int(j, key, lo, hi, where);
}

}  // namespace trainer::util
