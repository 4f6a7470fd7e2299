// cuBLAS and cuBLASLt, opened when the CUDA backend first calls them (Note [Lazy GPU
// libraries] in core/lazy_library.h): the functions CudaOps uses, defined here with the
// headers' declarations, each forwarding to the library's own.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>

#include "core/lazy_library.h"

namespace {

ztrain::LazyLibrary& Cublas() {
  static ztrain::LazyLibrary library(
      {"libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublas.so"},
      "cuBLAS (the CUDA backend's GEMMs)");
  return library;
}

ztrain::LazyLibrary& CublasLt() {
  static ztrain::LazyLibrary library(
      {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublasLt.so"},
      "cuBLASLt (the CUDA backend's linear layers)");
  return library;
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  ZTRAIN_LAZY_FORWARD(Cublas(), cublasCreate_v2, handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  ZTRAIN_LAZY_FORWARD(Cublas(), cublasDestroy_v2, handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  ZTRAIN_LAZY_FORWARD(Cublas(), cublasSetStream_v2, handle, streamId);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb,
                                         const void* beta, void* C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  ZTRAIN_LAZY_FORWARD(Cublas(), cublasGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
                 Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  ZTRAIN_LAZY_FORWARD(Cublas(), cublasGetStatusName, status);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  ZTRAIN_LAZY_FORWARD(Cublas(), cublasGetStatusString, status);
}

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtCreate, lightHandle);
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtDestroy, lightHandle);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulDescCreate, matmulDesc, computeType, scaleType);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulDescDestroy, matmulDesc);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t sizeInBytes) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulDescSetAttribute, matmulDesc, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatrixLayoutCreate, matLayout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatrixLayoutDestroy, matLayout);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulPreferenceDestroy, pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    size_t sizeInBytes) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
    cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmulAlgoGetHeuristic, lightHandle, operationDesc, Adesc,
                 Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount, heuristicResultsArray,
                 returnAlgoCount);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle,
                                           cublasLtMatmulDesc_t computeDesc, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc,
                                           const void* beta, const void* C,
                                           cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspaceSizeInBytes, cudaStream_t stream) {
  ZTRAIN_LAZY_FORWARD(CublasLt(), cublasLtMatmul, lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc,
                 beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceSizeInBytes, stream);
}

}  // extern "C"
