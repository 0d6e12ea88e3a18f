# libcuops must use the process's shared libstdc++. torch.ops.load_library opens it RTLD_LOCAL, so a
# private static copy binds first: its locale facets are never initialised and the first number
# formatted into a message crashes. Seen on the GPU machine's image (a build there came out with no
# NEEDED libstdc++.so.6); stripping -static-libstdc++ from CMake's linker flags fixed it, and
# tests/python/test_ops.py::test_library_uses_the_shared_libstdcxx keeps it fixed.
foreach(_flags CMAKE_SHARED_LINKER_FLAGS CMAKE_EXE_LINKER_FLAGS CMAKE_MODULE_LINKER_FLAGS)
  string(REPLACE "-static-libstdc++" "" ${_flags} "${${_flags}}")
endforeach()

set(CUOPS_LIBSTDCXX_LINK "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND UNIX AND NOT APPLE)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _cuops_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_cuops_libstdcxx}")
    # No development link: name the runtime library itself, ahead of g++'s implicit -lstdc++, so no
    # archive member is ever pulled in.
    message(STATUS "cuops: ${CMAKE_CXX_COMPILER} has no libstdc++.so link; linking libstdc++.so.6 explicitly")
    set(CUOPS_LIBSTDCXX_LINK "-Wl,--push-state,--no-as-needed" "-l:libstdc++.so.6" "-Wl,--pop-state")
  endif()
endif()

function(cuops_link_shared_libstdcxx target)
  if(CUOPS_LIBSTDCXX_LINK)
    target_link_options(${target} PRIVATE ${CUOPS_LIBSTDCXX_LINK})
  endif()
endfunction()
