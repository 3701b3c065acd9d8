# Which LibTorch the build can use, checked right after it is found (CMakeLists.txt):
#   trainer_check_torch_abi()       after find_package(Torch): refuses a pre-cxx11-ABI LibTorch,
#                                   naming the download that fits;
#   trainer_keep_system_headers()   after find_package(Protobuf) and spdlog: LibTorch's bundled
#                                   protobuf and fmt headers never shadow the system's (those
#                                   the system's protoc and spdlog match).
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

# The version of a header library in `dir`: protobuf (google/protobuf/stubs/common.h) or fmt
# (fmt/base.h from 11 on, fmt/core.h before), or "".
function(trainer_fmt_header_version dir out)
  set(version "")
  foreach(header base.h core.h)
    if(version STREQUAL "" AND EXISTS "${dir}/fmt/${header}")
      file(STRINGS "${dir}/fmt/${header}" line REGEX "^#[ ]*define FMT_VERSION [0-9]+" LIMIT_COUNT 1)
      if(line MATCHES "([0-9]+)$")
        set(n "${CMAKE_MATCH_1}")
        math(EXPR major "${n} / 10000")
        math(EXPR minor "${n} / 100 % 100")
        math(EXPR patch "${n} % 100")
        set(version "${major}.${minor}.${patch}")
      endif()
    endif()
  endforeach()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# A LibTorch zip or wheel ships header libraries of its own in its include dir (protobuf up to
# some version, fmt in every 2.x wheel), and its include dirs reach every target of ours through
# the torch target. The system's are usually in /usr/include, which CMake never passes as -I and
# the compiler searches last, so LibTorch's would win: the code protoc generates
# (trainer_tfproto, trainer_tbproto) would be compiled against the system's protobuf headers in
# one file and LibTorch's in another, and spdlog (built against the system's fmt) would meet
# LibTorch's newer fmt. Where LibTorch has its own, a directory holding only links to the
# system's (google/protobuf, fmt) goes before every other include dir (BEFORE SYSTEM, for every
# target in this directory and below). LibTorch's libraries keep their own copies inside
# (hidden), so nothing of theirs is linked twice.
function(trainer_keep_system_headers)
  set(shadow "${CMAKE_BINARY_DIR}/system-headers/include")
  set(used FALSE)
  # protobuf: the system's headers are those next to the protoc that CMake found.
  set(candidates ${Protobuf_INCLUDE_DIRS} ${Protobuf_INCLUDE_DIR})
  if(TARGET protobuf::libprotobuf)  # also found through protobuf's own CMake config
    get_target_property(target_dirs protobuf::libprotobuf INTERFACE_INCLUDE_DIRECTORIES)
    if(target_dirs)
      list(APPEND candidates ${target_dirs})
    endif()
  endif()
  trainer_shadow_bundled(protobuf google/protobuf message.h "${candidates}" "${shadow}" linked)
  if(linked)
    set(used TRUE)
  endif()
  # fmt: the system's, which the system's spdlog is built against.
  set(candidates "")
  if(TARGET fmt::fmt)
    get_target_property(target_dirs fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
    if(target_dirs)
      list(APPEND candidates ${target_dirs})
    endif()
  endif()
  list(APPEND candidates /usr/include)
  trainer_shadow_bundled(fmt fmt format.h "${candidates}" "${shadow}" linked)
  if(linked)
    set(used TRUE)
  endif()
  if(used)
    include_directories(BEFORE SYSTEM "${shadow}")
  endif()
endfunction()

# One header library (`name`, in subdirectory `sub` of an include dir, recognised by `probe`):
# where LibTorch's include dirs hold another copy than the first of `candidates`, links
# shadow/sub to the system's and says so; `out` is TRUE then.
function(trainer_shadow_bundled name sub probe candidates shadow out)
  set(${out} FALSE PARENT_SCOPE)
  set(system_dir "")
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/${sub}/${probe}")
      set(system_dir "${dir}")
      break()
    endif()
  endforeach()
  if(system_dir STREQUAL "")
    return()
  endif()
  get_filename_component(system_headers "${system_dir}/${sub}" REALPATH)
  set(bundled "")
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/${sub}")
      get_filename_component(headers "${dir}/${sub}" REALPATH)
      if(NOT headers STREQUAL system_headers)
        set(bundled "${dir}")
        break()
      endif()
    endif()
  endforeach()
  if(bundled STREQUAL "")
    return()  # Debian's LibTorch: one set of headers, the system's
  endif()
  if(name STREQUAL "protobuf")
    trainer_protobuf_header_version("${bundled}" bundled_version)
    trainer_protobuf_header_version("${system_dir}" system_version)
    if(system_version STREQUAL "")
      set(system_version "${Protobuf_VERSION}")
    endif()
    set(matching ", matching ${Protobuf_PROTOC_EXECUTABLE}")
  else()
    trainer_fmt_header_version("${bundled}" bundled_version)
    trainer_fmt_header_version("${system_dir}" system_version)
    set(matching ", which spdlog is built against")
  endif()
  get_filename_component(parent "${shadow}/${sub}" DIRECTORY)
  file(MAKE_DIRECTORY "${parent}")
  file(REMOVE "${shadow}/${sub}")
  file(CREATE_LINK "${system_headers}" "${shadow}/${sub}" SYMBOLIC)
  if(bundled_version STREQUAL system_version)
    set(versions "the same version, ${system_version}")
  else()
    set(versions "${bundled_version} against the system's ${system_version}")
  endif()
  message(STATUS "trainer: LibTorch bundles ${name} headers in ${bundled}/${sub} "
                 "(${versions}); the system's (${system_headers}${matching}) go first, "
                 "through ${shadow}")
  set(${out} TRUE PARENT_SCOPE)
endfunction()

# Every LibTorch library CMake found must be the found LibTorch's own. TorchConfig.cmake looks
# for libtorch.so and libc10.so with its own lib dir only as a hint, after the system's paths:
# a pip wheel's TorchConfig on a machine that also has Debian's libtorch-dev would otherwise
# link Debian's libtorch.so under the wheel's headers (scripts/build.sh --torch pip passes
# CMAKE_LIBRARY_PATH to prevent it). Refuses the mix, naming both.
function(trainer_check_torch_libraries)
  get_filename_component(prefix "${TORCH_INSTALL_PREFIX}" REALPATH)
  foreach(var TORCH_LIBRARY c10_LIBRARY)
    if(DEFINED ${var} AND EXISTS "${${var}}")
      get_filename_component(lib "${${var}}" REALPATH)
      string(FIND "${lib}" "${prefix}/" at)
      if(NOT at EQUAL 0)
        message(FATAL_ERROR
          "LibTorch mix-up: the LibTorch found at ${TORCH_INSTALL_PREFIX} (Torch ${Torch_VERSION}) "
          "but ${var} is ${${var}}, another LibTorch's library. Configure with "
          "-DCMAKE_LIBRARY_PATH=${TORCH_INSTALL_PREFIX}/lib (scripts/build.sh --torch pip does), "
          "or remove the other LibTorch.")
      endif()
    endif()
  endforeach()
endfunction()
