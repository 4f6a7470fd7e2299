// For blas_kernel_cli_test.sh only (LD_PRELOAD): an OpenBLAS that does not know this CPU.
// While OPENBLAS_CORETYPE is unset, openblas_get_corename says "Prescott", as Debian's 0.3.21
// does on an Intel Xeon it has no model entry for; once the variable is set, the real
// library's answer. The GEMMs themselves are the real library's throughout.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

char* openblas_get_corename(void) {
  static char prescott[] = "Prescott";
  if (getenv("OPENBLAS_CORETYPE") == NULL) return prescott;
  char* (*real)(void) = (char* (*)(void))dlsym(RTLD_NEXT, "openblas_get_corename");
  return real ? real() : prescott;
}
