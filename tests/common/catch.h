// The one include of Catch2 for every test: Catch2 2 (Debian 12's catch2, one header) or
// Catch2 3 (Debian 13's, a compiled library). It absorbs the two spellings the tests use:
// Contains(string) is a substring matcher (Catch2 3 calls it ContainsSubstring; its Contains is
// the range matcher), and Approx is reachable unqualified. Header-only, no state.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define TRAINER_CATCH_MAJOR 3
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#define TRAINER_CATCH_MAJOR 2
#endif

#include <string>

namespace trainer::test {

#if TRAINER_CATCH_MAJOR == 3
using CaseSensitivity = Catch::CaseSensitive;
#else
using CaseSensitivity = Catch::CaseSensitive::Choice;
#endif

// A matcher: the string contains `s` (case-sensitive unless told).
inline auto Contains(const std::string& s, CaseSensitivity cs = Catch::CaseSensitive::Yes) {
#if TRAINER_CATCH_MAJOR == 3
  return Catch::Matchers::ContainsSubstring(s, cs);
#else
  return Catch::Matchers::Contains(s, cs);
#endif
}

using Catch::Matchers::StartsWith;

}  // namespace trainer::test
