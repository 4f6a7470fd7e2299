#pragma once
// The checks of a VocabSlice argument (kernels/ops.h) that both backends make, so that the CPU
// and CUDA ops refuse the same slices with the same words. Private to the kernels.
#include <cstdint>

#include "core/error.h"
#include "kernels/ops.h"

namespace ztrain::kernels {

// A table of `rows` rows (an embedding's) holds ids [begin, begin + rows) within the
// vocabulary: every row is an id a token may have.
inline void CheckTableSlice(const VocabSlice& slice, int64_t rows, const char* op,
                            const char* table) {
  ZTRAIN_CHECK(slice.begin >= 0 && slice.begin + rows <= slice.vocab, op, ": ", table,
               " holds ids [", slice.begin, ", ", slice.begin + rows,
               "), outside the vocabulary [0, ", slice.vocab, ")");
}

// Logit columns from `begin` of a non-empty vocabulary; columns past it are padding.
inline void CheckColumnSlice(const VocabSlice& slice, const char* op) {
  ZTRAIN_CHECK(slice.begin >= 0 && slice.vocab > 0, op, ": the slice's ids [", slice.begin,
               ", ...) of a vocabulary of ", slice.vocab, " are not a slice of one");
}

}  // namespace ztrain::kernels
