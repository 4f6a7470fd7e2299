#pragma once
// The argument check AddColumns and CopyColumns share on every backend (ops.h): a window of
// columns of a row-major matrix. Private to the backends; device checks are theirs.
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace ztrain::kernels {

// Rows N, window width w and full width W of a checked window.
struct ColumnWindow {
  int64_t rows, width, full_width;
};

// `full` is [N, W] and `window` [N, w] of full's dtype, with 0 <= column and column + w <= W;
// throws ztrain::Error naming `op` and the argument otherwise.
inline ColumnWindow CheckColumnWindow(const Tensor& full, const char* full_name, int64_t column,
                                      const Tensor& window, const char* window_name,
                                      const char* op) {
  ZTRAIN_CHECK(window.dtype() == full.dtype(), op, ": ", window_name, " has dtype ",
               DTypeName(window.dtype()), ", expected ", full_name, "'s dtype ",
               DTypeName(full.dtype()));
  ZTRAIN_CHECK(full.dim() == 2, op, ": ", full_name, " has shape ", ShapeToString(full.shape()),
               ", expected a matrix [N, W]");
  ZTRAIN_CHECK(window.dim() == 2 && window.size(0) == full.size(0), op, ": ", window_name,
               " has shape ", ShapeToString(window.shape()), ", expected [", full.size(0),
               ", w] (the rows of ", full_name, " ", ShapeToString(full.shape()), ")");
  const ColumnWindow w{full.size(0), window.size(1), full.size(1)};
  ZTRAIN_CHECK(w.width <= w.full_width, op, ": ", window_name, " has shape ",
               ShapeToString(window.shape()), ", wider than ", full_name, " ",
               ShapeToString(full.shape()));
  ZTRAIN_CHECK(column >= 0 && column <= w.full_width - w.width, op, ": column = ", column,
               " puts the ", w.width, " columns of ", window_name, " outside ", full_name, " ",
               ShapeToString(full.shape()), "; expected 0 <= column <= ", w.full_width - w.width);
  return w;
}

}  // namespace ztrain::kernels
