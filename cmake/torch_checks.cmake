# Which LibTorch the build can use, checked right after it is found (CMakeLists.txt):
#   trainer_check_torch_abi()       after find_package(Torch): refuses a pre-cxx11-ABI LibTorch,
#                                   naming the download that fits;
#   trainer_keep_system_protobuf()  after find_package(Protobuf): LibTorch's bundled protobuf
#                                   headers never shadow the ones the system's protoc matches.
# tests/torch_checks.sh configures the project against stand-in LibTorches to test both.

# The cxx11-ABI LibTorch zip on pytorch.org for `version` (2.1.2) and `variant` (cu121, cpu):
# up to 2.5 it is the libtorch-cxx11-abi-shared-with-deps zip (the plain one is pre-cxx11); from
# 2.7 on (and 2.6 for CUDA 12.6, PyTorch 2.6's release notes) the plain libtorch-shared-with-deps
# zip is built with the cxx11 ABI.
function(trainer_libtorch_url version variant out)
  if(version VERSION_LESS 2.6 OR (version VERSION_LESS 2.7 AND NOT variant STREQUAL "cu126"))
    set(name libtorch-cxx11-abi-shared-with-deps-${version}%2B${variant}.zip)
  else()
    set(name libtorch-shared-with-deps-${version}%2B${variant}.zip)
  endif()
  set(${out} https://download.pytorch.org/libtorch/${variant}/${name} PARENT_SCOPE)
endfunction()

# A LibTorch built with -D_GLIBCXX_USE_CXX11_ABI=0 (pytorch.org's plain zips up to 2.5, pip
# wheels built with the old ABI) cannot link with Debian's yaml-cpp, OpenCV, spdlog and protobuf,
# which use the cxx11 ABI: refuse it here instead of with a wall of undefined std::string symbols.
# Debian's LibTorch and the cxx11 zips set -D_GLIBCXX_USE_CXX11_ABI=1 (or nothing).
function(trainer_check_torch_abi)
  if(NOT TORCH_CXX_FLAGS MATCHES "-D_GLIBCXX_USE_CXX11_ABI=0")
    return()
  endif()
  # The zip records its version and variant in build-version ("2.1.2+cu121").
  set(version "${Torch_VERSION}")
  set(variant "")
  if(EXISTS "${TORCH_INSTALL_PREFIX}/build-version")
    file(STRINGS "${TORCH_INSTALL_PREFIX}/build-version" build_version LIMIT_COUNT 1)
    if(build_version MATCHES "^([0-9]+\\.[0-9]+\\.[0-9]+)[^+]*(\\+([a-z0-9]+))?")
      set(version "${CMAKE_MATCH_1}")
      set(variant "${CMAKE_MATCH_3}")
    endif()
  endif()
  if(variant STREQUAL "")
    if(TARGET torch_cuda OR TARGET c10_cuda)
      set(variant "cu<xyz>")
    else()
      set(variant cpu)
    endif()
  endif()
  if(NOT version MATCHES "^[0-9]+\\.[0-9]+")
    set(version "(version unknown)")
    set(url "https://download.pytorch.org/libtorch/${variant}/libtorch-cxx11-abi-shared-with-deps-<ver>%2B${variant}.zip")
  else()
    trainer_libtorch_url("${version}" "${variant}" url)
  endif()
  message(FATAL_ERROR
    "LibTorch ${version} at ${TORCH_INSTALL_PREFIX} is built with the pre-cxx11 ABI "
    "(TORCH_CXX_FLAGS: ${TORCH_CXX_FLAGS}); the trainer links Debian's yaml-cpp, OpenCV, spdlog "
    "and protobuf, which use the cxx11 ABI, so it would not link.\n"
    "Use the cxx11-ABI LibTorch instead: for this one\n"
    "  ${url}\n"
    "(LibTorch 2.x up to 2.5: libtorch-cxx11-abi-shared-with-deps-<ver>%2Bcu<xyz>.zip; from 2.7 "
    "on, and 2.6 for cu126, the plain libtorch-shared-with-deps-<ver>%2Bcu<xyz>.zip is cxx11 ABI; "
    "cu<xyz> = the CUDA version, or cpu), unzip it and configure with "
    "-DCMAKE_PREFIX_PATH=/path/to/libtorch. "
    "Debian's LibTorch (libtorch-dev) needs no option.")
endfunction()

# The protobuf version of the headers in `dir` (google/protobuf/stubs/common.h), or "".
function(trainer_protobuf_header_version dir out)
  set(version "")
  if(EXISTS "${dir}/google/protobuf/stubs/common.h")
    file(STRINGS "${dir}/google/protobuf/stubs/common.h" line
         REGEX "^#define GOOGLE_PROTOBUF_VERSION [0-9]+" LIMIT_COUNT 1)
    if(line MATCHES "([0-9]+)$")
      set(n "${CMAKE_MATCH_1}")
      math(EXPR major "${n} / 1000000")
      math(EXPR minor "${n} / 1000 % 1000")
      math(EXPR patch "${n} % 1000")
      set(version "${major}.${minor}.${patch}")
    endif()
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# A LibTorch zip ships protobuf headers in include/google/protobuf (older versions at least), and
# its include dirs reach every target of ours through the torch target. The system's are usually
# in /usr/include, which CMake never passes as -I and the compiler searches last, so LibTorch's
# would win, and the code protoc generates (trainer_tfproto, trainer_tbproto) would be compiled
# against the system's headers in one file and LibTorch's in another. Where LibTorch has its own,
# a directory holding only google/protobuf -> the system's goes before every other include dir
# (BEFORE SYSTEM, for every target in this directory and below).
function(trainer_keep_system_protobuf)
  set(candidates ${Protobuf_INCLUDE_DIRS} ${Protobuf_INCLUDE_DIR})
  if(TARGET protobuf::libprotobuf)  # also found through protobuf's own CMake config
    get_target_property(target_dirs protobuf::libprotobuf INTERFACE_INCLUDE_DIRECTORIES)
    if(target_dirs)
      list(APPEND candidates ${target_dirs})
    endif()
  endif()
  set(system_dir "")
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/google/protobuf/message.h")
      set(system_dir "${dir}")
      break()
    endif()
  endforeach()
  if(system_dir STREQUAL "")
    return()
  endif()
  get_filename_component(system_headers "${system_dir}/google/protobuf" REALPATH)
  set(bundled "")
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/google/protobuf")
      get_filename_component(headers "${dir}/google/protobuf" REALPATH)
      if(NOT headers STREQUAL system_headers)
        set(bundled "${dir}")
        break()
      endif()
    endif()
  endforeach()
  if(bundled STREQUAL "")
    return()  # Debian's LibTorch: one set of protobuf headers, the system's
  endif()
  trainer_protobuf_header_version("${bundled}" bundled_version)
  trainer_protobuf_header_version("${system_dir}" system_version)
  if(system_version STREQUAL "")
    set(system_version "${Protobuf_VERSION}")
  endif()
  set(shadow "${CMAKE_BINARY_DIR}/system-protobuf/include")
  file(MAKE_DIRECTORY "${shadow}/google")
  file(REMOVE "${shadow}/google/protobuf")
  file(CREATE_LINK "${system_headers}" "${shadow}/google/protobuf" SYMBOLIC)
  include_directories(BEFORE SYSTEM "${shadow}")
  if(bundled_version STREQUAL system_version)
    set(versions "the same version, ${system_version}")
  else()
    set(versions "${bundled_version} against the system's ${system_version}")
  endif()
  message(STATUS "trainer: LibTorch bundles protobuf headers in ${bundled}/google/protobuf "
                 "(${versions}); the system's (${system_headers}, matching "
                 "${Protobuf_PROTOC_EXECUTABLE}) go first, through ${shadow}")
endfunction()
