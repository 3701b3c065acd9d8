// The message of what `f` throws ("(no error)" when it returns): for tests that check what an
// error says rather than only that there is one.
#pragma once

#include <exception>
#include <string>

namespace trainer::test_support {

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace trainer::test_support
