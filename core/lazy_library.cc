#include "core/lazy_library.h"

#include <dlfcn.h>

#include <utility>

#include "core/error.h"

namespace ztrain {

LazyLibrary::LazyLibrary(std::vector<std::string> files, std::string what)
    : files_(std::move(files)), what_(std::move(what)) {}

void LazyLibrary::Open() {
  std::call_once(once_, [&] {
    for (const std::string& file : files_) {
      handle_ = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_ != nullptr) return;
      const char* why = ::dlerror();
      if (!error_.empty()) error_ += "; ";
      error_ += why != nullptr ? why : file + ": unknown error";
    }
  });
}

bool LazyLibrary::Available() {
  Open();
  return handle_ != nullptr;
}

void* LazyLibrary::Symbol(const char* symbol) {
  Open();
  ZTRAIN_CHECK(handle_ != nullptr, "cannot load ", what_, " (", files_.front(), "): ", error_,
               ". Install it (the CUDA toolkit's libraries, on the loader's path or in "
               "LD_LIBRARY_PATH), or train on the CPU (\"device\": \"cpu\")");
  ::dlerror();
  void* address = ::dlsym(handle_, symbol);
  const char* why = ::dlerror();
  ZTRAIN_CHECK(why == nullptr && address != nullptr, what_, " (", files_.front(), ") has no ",
               symbol, why != nullptr ? std::string(": ") + why : std::string(),
               "; it is older than the headers ztrain was built with: install that version");
  return address;
}

}  // namespace ztrain
