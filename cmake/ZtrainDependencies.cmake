# Required: spdlog, nlohmann-json, CLI11, OpenBLAS, OpenMP (all from Debian).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.9 REQUIRED)
find_package(CLI11 QUIET CONFIG)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
endif()

# OpenBLAS: prefer the OpenMP build so BLAS threads and ztrain's OpenMP loops share one
# thread pool instead of fighting over cores (libopenblas-openmp-dev); fall back to the
# default (pthreads) build with a warning.
find_path(ZTRAIN_CBLAS_INCLUDE_DIR cblas.h
          PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/openblas
          PATH_SUFFIXES openblas)
find_library(ZTRAIN_OPENBLAS_LIBRARY NAMES openblas
             PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
set(ZTRAIN_OPENBLAS_VARIANT "openmp")
if(NOT ZTRAIN_OPENBLAS_LIBRARY)
  find_library(ZTRAIN_OPENBLAS_LIBRARY NAMES openblas REQUIRED)
  set(ZTRAIN_OPENBLAS_VARIANT "default (install libopenblas-openmp-dev for the OpenMP build)")
  message(WARNING "OpenBLAS OpenMP build not found; BLAS and OpenMP threads may contend")
endif()
if(NOT ZTRAIN_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "cblas.h not found: apt-get install libopenblas-openmp-dev")
endif()
add_library(ztrain_openblas INTERFACE)
target_include_directories(ztrain_openblas INTERFACE $<BUILD_INTERFACE:${ZTRAIN_CBLAS_INCLUDE_DIR}>)
target_link_libraries(ztrain_openblas INTERFACE $<BUILD_INTERFACE:${ZTRAIN_OPENBLAS_LIBRARY}>)
install(TARGETS ztrain_openblas EXPORT ztrainTargets)

# oneDNN (optional, libdnnl-dev): the CPU backend's bf16 GEMMs (Note [bf16 GEMMs] in
# kernels/cpu/gemm_mixed.cc). Without it they run as SGEMM on widened copies. Linked by its
# full path, so an installed static ztrain_kernels carries it to the program.
ztrain_tristate(ZTRAIN_WITH_ONEDNN "Run bf16 GEMMs on the CPU through oneDNN")
string(TOUPPER "${ZTRAIN_WITH_ONEDNN}" _onednn)
if(NOT _onednn STREQUAL "OFF")
  find_path(ZTRAIN_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(ZTRAIN_DNNL_LIBRARY NAMES dnnl)
endif()
if(ZTRAIN_DNNL_INCLUDE_DIR AND ZTRAIN_DNNL_LIBRARY)
  set(_onednn_found TRUE)
else()
  set(_onednn_found FALSE)
endif()
ztrain_resolve(ZTRAIN_WITH_ONEDNN "${_onednn_found}" ZTRAIN_HAVE_ONEDNN)
if(ZTRAIN_HAVE_ONEDNN)
  file(STRINGS "${ZTRAIN_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _dnnl_version
       REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3"
         ZTRAIN_DNNL_VERSION "${_dnnl_version}")
  add_library(ztrain_onednn INTERFACE)
  target_include_directories(ztrain_onednn INTERFACE $<BUILD_INTERFACE:${ZTRAIN_DNNL_INCLUDE_DIR}>)
  target_link_libraries(ztrain_onednn INTERFACE "${ZTRAIN_DNNL_LIBRARY}")
  install(TARGETS ztrain_onednn EXPORT ztrainTargets)
  message(STATUS "oneDNN ${ZTRAIN_DNNL_VERSION}: ${ZTRAIN_DNNL_LIBRARY} (bf16 GEMMs on the CPU)")
else()
  message(STATUS "oneDNN: no (ZTRAIN_WITH_ONEDNN=${ZTRAIN_WITH_ONEDNN}); bf16 GEMMs on the CPU "
                 "run as SGEMM (apt-get install libdnnl-dev)")
endif()

# Optional backends: found now, used by later parts (communicators, offload, CUDA kernels).
string(TOUPPER "${ZTRAIN_WITH_MPI}" _mpi)
if(NOT _mpi STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS CXX)
endif()
ztrain_resolve(ZTRAIN_WITH_MPI "${MPI_CXX_FOUND}" ZTRAIN_HAVE_MPI)

string(TOUPPER "${ZTRAIN_WITH_IO_URING}" _uring)
if(NOT _uring STREQUAL "OFF")
  find_path(LIBURING_INCLUDE_DIR liburing.h)
  find_library(LIBURING_LIBRARY uring)
endif()
if(LIBURING_INCLUDE_DIR AND LIBURING_LIBRARY)
  set(_uring_found TRUE)
else()
  set(_uring_found FALSE)
endif()
ztrain_resolve(ZTRAIN_WITH_IO_URING "${_uring_found}" ZTRAIN_HAVE_IO_URING)

string(TOUPPER "${ZTRAIN_WITH_CUDA}" _cuda)
if(NOT _cuda STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
endif()
if(CUDAToolkit_FOUND AND NOT EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
  set(CUDAToolkit_FOUND FALSE)  # the runtime without a compiler: no CUDA kernels to build
endif()
ztrain_resolve(ZTRAIN_WITH_CUDA "${CUDAToolkit_FOUND}" ZTRAIN_HAVE_CUDA)
if(ZTRAIN_HAVE_CUDA)
  # The CUDA kernels (kernels/cuda) are compiled for A100 (sm_80) and H100/H200 (sm_90) by
  # default; -DZTRAIN_CUDA_ARCHITECTURES="86;89" (or "native") overrides.
  set(ZTRAIN_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures of the kernels")
  set(CMAKE_CUDA_ARCHITECTURES "${ZTRAIN_CUDA_ARCHITECTURES}")
  set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  enable_language(CUDA)
  # CMake 3.25 knows nvcc's dialect flags only up to C++17; nvcc 12+ takes -std=c++20, which
  # the core headers need.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
endif()

string(TOUPPER "${ZTRAIN_WITH_NCCL}" _nccl)
if(NOT _nccl STREQUAL "OFF" AND CUDAToolkit_FOUND)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
endif()
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  set(_nccl_found TRUE)
else()
  set(_nccl_found FALSE)
endif()
ztrain_resolve(ZTRAIN_WITH_NCCL "${_nccl_found}" ZTRAIN_HAVE_NCCL)
