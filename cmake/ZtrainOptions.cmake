# AUTO/ON/OFF options for the optional backends (STYLE.md "CMake"): AUTO enables what is
# found, ON fails configuration when it is missing, OFF never looks.
function(ztrain_tristate name doc)
  set(${name} AUTO CACHE STRING "${doc} (AUTO, ON or OFF)")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" value)
  if(NOT value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name}=${${name}}: use AUTO, ON or OFF")
  endif()
endfunction()

ztrain_tristate(ZTRAIN_WITH_MPI "Build the MPI communicator")
ztrain_tristate(ZTRAIN_WITH_IO_URING "Build the io_uring file I/O backend")
ztrain_tristate(ZTRAIN_WITH_CUDA "Build the CUDA backend")
ztrain_tristate(ZTRAIN_WITH_NCCL "Build the NCCL communicator")

# Resolves a tristate: sets ${out} TRUE/FALSE from whether the dependency was found.
function(ztrain_resolve name found out)
  string(TOUPPER "${${name}}" value)
  if(value STREQUAL "OFF")
    set(${out} FALSE PARENT_SCOPE)
  elseif(found)
    set(${out} TRUE PARENT_SCOPE)
  elseif(value STREQUAL "ON")
    message(FATAL_ERROR "${name}=ON but it was not found; install it or set ${name}=AUTO/OFF")
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()
