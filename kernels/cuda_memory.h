#pragma once
// Memory for the CUDA backend, behind core's Allocator interface (no CUDA header needed to
// use it; built in kernels/cuda, stubs without CUDA).
//
// MakeCudaAllocator: device memory from CUDA's stream-ordered allocator (cudaMallocAsync on
// the device's default memory pool, whose release threshold is raised so that freed blocks
// stay in the pool and are handed out again without a cudaMalloc: the caching allocator the
// engine's steps need, with the pool doing the bookkeeping). Allocate and Free are ordered on
// the given stream (null: the legacy default stream). Every byte is counted by the
// MemoryTracker under its category; an exhausted device is an OutOfMemoryError naming the
// size, the category and the device.
//
// MakeCudaPinnedAllocator: page-locked host memory from cudaHostAlloc, which the GPU reads and
// writes by DMA (the staging buffers of offload and host<->device copies), counted by the
// tracker.
//
// Both throw ztrain::Error from the factory in a build without CUDA or for a device that
// does not exist. Thread safe as CUDA's runtime is.
#include <memory>

#include "core/allocator.h"

namespace ztrain::kernels {

std::unique_ptr<Allocator> MakeCudaAllocator(int device, MemoryTracker* tracker,
                                             void* stream = nullptr);
std::unique_ptr<Allocator> MakeCudaPinnedAllocator(MemoryTracker* tracker);

}  // namespace ztrain::kernels
