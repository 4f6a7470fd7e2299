#pragma once
// ExpectErrorWith<E>(f, parts): a test expectation that f() throws E (or a subclass) whose
// message contains every string in `parts` — what ztrain's "name the problem and the fix"
// errors are checked with.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace ztrain::testing {

template <typename E, typename F>
void ExpectErrorWith(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace ztrain::testing
