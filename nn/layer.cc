#include "nn/layer.h"

namespace ztrain::nn {

void Layer::Bind(std::vector<Tensor> params, std::vector<Tensor> grads) {
  ZTRAIN_ASSERT(params.size() == Params().size() && grads.size() == params.size(),
                "layer ", Name(), " bound with ", params.size(), " tensors");
  params_ = std::move(params);
  grads_ = std::move(grads);
}

}  // namespace ztrain::nn
