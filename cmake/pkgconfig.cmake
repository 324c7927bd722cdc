# Writes parallel.pc (from cmake/parallel.pc.in) so that projects built without CMake can use the
# installed library: `pkg-config --cflags --libs parallel` (add --static for a static libparallel).
# The flags mirror parallel::parallel's usage requirements: C++20 and the MPI headers because public
# headers include <mpi.h> and use C++20; fmt and spdlog through their own .pc files (Requires), since
# spdlog's compile definitions must match how Debian built it. The private dependencies (yaml-cpp,
# OpenMP, oneDNN; cuBLASLt and NCCL with CUDA) are needed only to link a static libparallel.

# pkg-config wants -L/-l flags; CMake's find modules give full paths to library files.
function(parallel_pc_link_flags out)
  set(dirs "")
  set(libs "")
  foreach(lib IN LISTS ARGN)
    if(lib MATCHES "^-")  # already a flag (-pthread, -fopenmp)
      list(APPEND libs "${lib}")
    elseif(lib MATCHES "^(.*)/lib([^/]+)\\.(so|a)(\\.[0-9.]+)?$")
      list(APPEND dirs "-L${CMAKE_MATCH_1}")
      list(APPEND libs "-l${CMAKE_MATCH_2}")
    elseif(lib MATCHES "/")  # some other file: hand it to the linker as it is
      list(APPEND libs "${lib}")
    elseif(lib)
      list(APPEND libs "-l${lib}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  list(JOIN dirs " " dirs)
  list(JOIN libs " " libs)
  string(STRIP "${dirs} ${libs}" flags)
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

# Compile flags: MPI's include dirs, options and definitions as FindMPI found them (any MPI), and the
# same definitions parallel::parallel exports.
set(_pc_cflags "")
foreach(dir IN LISTS MPI_C_INCLUDE_DIRS)
  list(APPEND _pc_cflags "-I${dir}")
endforeach()
list(APPEND _pc_cflags ${MPI_C_COMPILE_OPTIONS})
foreach(def IN LISTS MPI_C_COMPILE_DEFINITIONS)
  list(APPEND _pc_cflags "-D${def}")
endforeach()
get_target_property(_pc_defs parallel INTERFACE_COMPILE_DEFINITIONS)
foreach(def IN LISTS _pc_defs)
  list(APPEND _pc_cflags "-D${def}")
endforeach()
list(REMOVE_DUPLICATES _pc_cflags)
list(JOIN _pc_cflags " " PARALLEL_PC_CFLAGS)

# Public link dependencies: MPI (public headers call it), the CUDA runtime when built with CUDA.
set(_pc_public ${MPI_C_LIBRARIES})
if(PARALLEL_HAVE_CUDA)
  list(APPEND _pc_public "${CUDAToolkit_LIBRARY_DIR}/libcudart.so")
endif()
parallel_pc_link_flags(_pc_libs ${_pc_public})
string(STRIP "${_pc_libs} ${MPI_C_LINK_FLAGS}" PARALLEL_PC_LIBS)

# Private ones, for `pkg-config --static`.
get_target_property(_pc_dnnl DNNL::dnnl LOCATION)
set(_pc_private ${_pc_dnnl} ${OpenMP_CXX_LIBRARIES})
if(PARALLEL_HAVE_CUDA)
  list(APPEND _pc_private "${CUDAToolkit_LIBRARY_DIR}/libcublasLt.so" ${NCCL_LIBRARY})
endif()
parallel_pc_link_flags(PARALLEL_PC_LIBS_PRIVATE ${_pc_private})
set(PARALLEL_PC_REQUIRES_PRIVATE "yaml-cpp")

# prefix as seen from <libdir>/pkgconfig (normally "../.."), so the file is relocatable; absolute
# install dirs (-DCMAKE_INSTALL_LIBDIR=/usr/lib64) are written as they are.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(PARALLEL_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(PARALLEL_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH _pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" _pc_up "${_pc_up}")
  set(PARALLEL_PC_PREFIX "\${pcfiledir}/${_pc_up}")
  set(PARALLEL_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(PARALLEL_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(PARALLEL_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

configure_file(cmake/parallel.pc.in ${CMAKE_CURRENT_BINARY_DIR}/parallel.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/parallel.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
