# Installs headers, libraries and a CMake package: find_package(ztrain) -> ztrain::ztrain.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS ztrain ztrain_core ztrain_kernels ztrain_nn ztrain_optim ztrain_data
                ztrain_checkpoint ztrain_shape_only ztrain_engine ztrain_estimate ztrain_run
                ztrain_parallel ztrain_tensor ztrain_offload
        EXPORT ztrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ztrain)
install(TARGETS ztrain_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Public headers only: the MPI and NCCL backends' internals include mpi.h, cuda_runtime.h and
# nccl.h and stay private (as do engine/engine_state.h and parallel/tensor/tp_common.h); their
# one public header each (mpi_communicator.h, nccl_communicator.h) does not. The offload I/O
# backends (io/uring, io/posix) are internal.
foreach(dir core kernels nn optim data checkpoint engine estimate run parallel offload)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ztrain/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "comm/mpi" EXCLUDE PATTERN "comm/nccl" EXCLUDE
          PATTERN "io/uring" EXCLUDE PATTERN "io/posix" EXCLUDE PATTERN "engine_state.h" EXCLUDE
          PATTERN "tp_common.h" EXCLUDE)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/parallel/comm/mpi/mpi_communicator.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ztrain/parallel/comm/mpi)
install(FILES ${PROJECT_SOURCE_DIR}/parallel/comm/nccl/nccl_communicator.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ztrain/parallel/comm/nccl)
install(EXPORT ztrainTargets NAMESPACE ztrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ztrain)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ztrainConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ztrainConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ztrain)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ztrainConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ztrainConfig.cmake ${PROJECT_BINARY_DIR}/ztrainConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ztrain)
