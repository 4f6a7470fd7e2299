// LazyLibrary (Note [Lazy GPU libraries]): a library opens on first use and gives its
// functions; a missing library or function fails the call that needed it, naming the file,
// the symbol and the fix, and never at construction.
#include "core/lazy_library.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"

namespace ztrain {
namespace {

std::string ErrorOf(LazyLibrary& lib, const char* symbol) {
  try {
    lib.Symbol(symbol);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LazyLibraryTest, OpensOnFirstUseAndGivesTheFunction) {
  LazyLibrary libm({"libm.so.6"}, "the C math library");
  ASSERT_TRUE(libm.Available());
  const double x = 0.25;
  const auto cosine = LazyFunction<double>(libm, "cos", x);  // double (*)(double)
  EXPECT_EQ(cosine(x), std::cos(x));
}

TEST(LazyLibraryTest, TriesEachFileInOrder) {
  LazyLibrary lib({"libztrain_no_such_library.so.1", "libm.so.6"}, "the C math library");
  EXPECT_TRUE(lib.Available());
  EXPECT_NE(lib.Symbol("sqrt"), nullptr);
}

TEST(LazyLibraryTest, AMissingLibraryFailsTheCallNamingItAndTheFix) {
  LazyLibrary lib({"libztrain_no_such_library.so.1"}, "the test library");  // nothing opened yet
  EXPECT_FALSE(lib.Available());
  const std::string what = ErrorOf(lib, "anything");
  EXPECT_NE(what.find("cannot load the test library (libztrain_no_such_library.so.1)"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("LD_LIBRARY_PATH"), std::string::npos) << what;
  EXPECT_NE(what.find("\"device\": \"cpu\""), std::string::npos) << what;
}

TEST(LazyLibraryTest, AMissingFunctionIsNamed) {
  LazyLibrary libm({"libm.so.6"}, "the C math library");
  const std::string what = ErrorOf(libm, "ztrain_no_such_function");
  EXPECT_NE(what.find("has no ztrain_no_such_function"), std::string::npos) << what;
}

}  // namespace
}  // namespace ztrain
