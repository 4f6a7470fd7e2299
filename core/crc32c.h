#pragma once
// CRC-32C (Castagnoli), the checksum of checkpoint files: SSE4.2's crc32 instruction where the
// processor has it (several GB/s), a table otherwise. Crc32c(data, n, crc) continues `crc`
// (start from 0), so a file's checksum can be computed piece by piece as it is written.
// Thread safe.
#include <cstddef>
#include <cstdint>

namespace ztrain {

uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace ztrain
