#pragma once
// The world communicator shared by the multi-rank tests (created in mpi_test_main.cc, which
// runs every TEST on every rank in the same order).
#include <cstdint>
#include <vector>

#include "parallel/comm/communicator.h"

namespace ztrain::comm::test {

Communicator& World();

inline Tensor F32(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}
inline Tensor I32(std::vector<int32_t>& v) {
  return Tensor(v.data(), DType::kI32, {static_cast<int64_t>(v.size())});
}

}  // namespace ztrain::comm::test
