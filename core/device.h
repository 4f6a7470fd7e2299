#pragma once
// Where memory lives and kernels run. A plain value type.
#include <string>

namespace ztrain {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int i) { return {DeviceType::kCuda, i}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool operator==(const Device&) const = default;
  std::string ToString() const {
    return type == DeviceType::kCpu ? "cpu" : "cuda:" + std::to_string(index);
  }
};

}  // namespace ztrain
