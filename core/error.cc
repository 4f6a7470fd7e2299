#include "core/error.h"

namespace ztrain::detail {

void ThrowAssert(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(StrCat("internal error: ", cond, " failed at ", file, ":", line,
                             msg.empty() ? "" : ": ", msg));
}

}  // namespace ztrain::detail
