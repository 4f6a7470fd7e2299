#pragma once
// The memory estimate's layers (Note [Shape-only engine], estimate/shape_only.h): what a layer
// allocates in Forward and Backward is the layer's own code, so the estimate runs that code
// once per input shape on a shape-only device and has the shape-only engine replay it. A new
// layer or model family needs no estimate code. Private to engine/.
#include <memory>

#include "core/dtype.h"
#include "nn/layer.h"

namespace ztrain::detail {

// `layer` for a shape-only engine: its Forward and Backward allocate through their
// LayerContext what `layer`'s own would at that input shape, in the same order, and free
// what those free, computing nothing; everything else is `layer`'s. The first use of an input
// shape measures `layer`: its own Forward and Backward run on the context's ops (ShapeOps),
// parameters bound as the engine binds them (the context's dtype; gradients in
// `grad_dtype`), every allocation recorded. Sizes are affine in the micro-batch (B x T x
// width, or independent of B, such as a weight's widened copy), so a micro-batch B > 2 is
// measured at 1 and 2 and extended to B: the probe touches at most two rows' worth of
// memory (the tensor-parallel layers' host loops do write theirs), whatever B. Should the two
// measurements differ in anything but sizes, the layer is measured at B itself.
std::unique_ptr<nn::Layer> Measured(std::unique_ptr<nn::Layer> layer, DType grad_dtype);

}  // namespace ztrain::detail
