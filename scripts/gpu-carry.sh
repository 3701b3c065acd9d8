#!/usr/bin/env bash
# Packs into .gpu-carry/ (ignored by git) every build dependency of the trainer that the lent GPU
# machines lack, for scripts/gpu-check.sh to unpack there. Those machines have CUDA, cmake, ninja,
# a C++ compiler and Python with PyTorch (whose LibTorch the build uses), glibc and libstdc++
# newer than Debian 12's, and none of our Debian packages; the working tree travels to them with
# at most 64 MiB in all, so the carry is kept small and compressed.
#
# Runs here, on Debian 12 with scripts/install-deps.sh's packages installed; no network. Writes
#   .gpu-carry/carry.tar.xz   one prefix, laid out as /usr is, so Debian's CMake package files
#                             find their files relative to it:
#       include/              yaml-cpp, spdlog, fmt, nlohmann, CLI11, Catch2 (v2), protobuf (with
#                             its .proto files), onnx/, zlib.h/zconf.h, opencv4/ (core, imgproc,
#                             imgcodecs, dnn)
#       lib/x86_64-linux-gnu/ libyaml-cpp, libspdlog, libfmt (shared, with their CMake files);
#                             libprotobuf.so (.so.32: the one protobuf runtime, see step 1) and
#                             libprotoc.so.32 (for protoc); libonnx and libonnx_proto (ONNX export,
#                             with Debian's ONNX CMake files and the onnxifi files they name);
#                             OpenCV's core, imgproc, imgcodecs and dnn (the ONNX tests' reference
#                             runtime) and their real closure (libjpeg, libpng, libtiff, libwebp,
#                             libopenjp2, libtbb, ...), without the C/C++ runtime and zlib/liblzma/
#                             libzstd (every Debian/Ubuntu has them, newer there); a minimal
#                             OpenCVConfig.cmake for those four modules
#       lib/stubs/            stand-ins for what OpenCV links but the trainer never calls (GDAL,
#                             GDCM, OpenEXR, LAPACK, BLAS, GLX: ~200 MB with their closure), made
#                             by scripts/gpu-carry-libs.py; a called stub prints its name and aborts
#       lib/cmake/Catch2, share/cmake/{nlohmann_json,CLI11}: Debian's package files
#       bin/protoc            a wrapper that runs bin/protoc.bin with the carry's libprotoc
#       fallback-include/gloo Debian's Gloo headers, used only if the GPU machine's LibTorch
#                             ships none (scripts/gpu-check.sh says so)
#       share/trainer-carry/  MANIFEST.txt (packages, versions, libraries, stubs) and smoke.cpp
#                             (decodes and encodes JPEG/PNG/BMP/TIFF/WebP/JPEG 2000 through the
#                             carried OpenCV, every stub loaded, and runs an ONNX graph written
#                             with libonnx through OpenCV's DNN: gpu-check.sh's first check)
#   .gpu-carry/MANIFEST.txt   the same manifest, readable without unpacking
# then compiles and runs smoke.cpp against the packed prefix here (every stub in the library
# path, so OpenCV's BIND_NOW must resolve each imported symbol) and prints the carry's size in
# MiB. Not carried: LibTorch (the GPU machine's own), glibc, libstdc++, jemalloc (the GPU build
# uses -DTRAINER_JEMALLOC=OFF).
#   bash scripts/gpu-carry.sh        (about 30 s; idempotent: replaces .gpu-carry/)
# Exit 2 when a package is missing (run scripts/install-deps.sh), 1 on any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=$repo/.gpu-carry
arch=x86_64-linux-gnu
py=/usr/bin/python3
limit_mib=35  # the tree (~5 MiB) and shared/ (~19 MiB) travel too; 64 MiB in all

die() { echo "gpu-carry.sh: $*" >&2; exit 1; }

# Debian packages whose files are carried whole (docs and man pages left out).
pkgs=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      nlohmann-json3-dev libcli11-dev catch2 libprotobuf-dev libprotobuf32 libprotoc32
      protobuf-compiler libonnx-dev libonnx1 libonnxifi)
# ... and those taken in part below.
other_pkgs=(zlib1g-dev libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
            libopencv-dnn-dev libgloo-dev)
missing=()
for p in "${pkgs[@]}" "${other_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "gpu-carry.sh: missing Debian packages: ${missing[*]} (run scripts/install-deps.sh as root)" >&2
  exit 2
fi
for tool in readelf xz c++ cc "$py"; do
  command -v "$tool" >/dev/null || die "needs $tool"
done

stage=$(mktemp -d /tmp/gpu-carry.XXXXXX)
trap 'rm -rf "$stage"' EXIT
P=$stage/prefix
mkdir -p "$P/bin" "$P/include" "$P/lib/$arch" "$P/lib/stubs" "$P/share/trainer-carry" "$P/fallback-include"
manifest=$P/share/trainer-carry/MANIFEST.txt

# copy_usr PATH: /usr/X -> $P/X, a symlink as a symlink (Debian's are relative, within the dir),
# with its time stamps (so a build against an unpacked carry is not redone when it is repacked).
copy_usr() {
  local src=$1 rel
  case $src in
    /usr/*) rel=${src#/usr/} ;;
    *) die "unexpected path outside /usr: $src" ;;
  esac
  mkdir -p "$P/$(dirname "$rel")"
  cp -a "$src" "$P/$rel"
}

# 1. Packages carried whole (libonnxifi only because Debian's ONNXTargets.cmake refuses to load
#    when a file it names is missing), less what the build must not pick up: protobuf's static
#    and lite libraries. The build links protobuf shared, libprotobuf.so.32, as Debian's own build
#    does: libonnx, libonnx_proto and libopencv_dnn link that very library, and a libprotobuf.a in
#    the trainer beside it would be a second protobuf runtime in one process (the executable's
#    copy interposing some of the shared one's symbols and not others: two sets of globals, one
#    descriptor pool or two by accident). One copy loaded is the only sound layout. pip's
#    LibTorch links its own protobuf statically but built with -fvisibility=hidden (PyTorch's
#    cmake/ProtoBuf.cmake), so nothing of it interposes; Debian's LibTorch (the dry run's) links
#    this same libprotobuf.so.32. gpu-check.sh's carry-resolve checks there is one runtime.
for p in "${pkgs[@]}"; do
  while IFS= read -r f; do
    [[ -f $f || -L $f ]] || continue
    case $f in
      /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;;
      */libprotobuf.a|*/libprotobuf-lite.so|*/libprotobuf-lite.a|*/pkgconfig/protobuf-lite.pc) continue ;;
    esac
    copy_usr "$f"
  done < <(dpkg -L "$p")
done
# protoc runs here at build time: the binary beside a wrapper that finds the carry's libprotoc.
mv "$P/bin/protoc" "$P/bin/protoc.bin"
cat >"$P/bin/protoc" <<'SH'
#!/bin/sh
# The carry's protoc (Debian 12's) with the carry's libprotoc/libprotobuf (scripts/gpu-carry.sh).
d=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$d/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/protoc.bin" "$@"
SH
chmod +x "$P/bin/protoc"
touch -r "$P/bin/protoc.bin" "$P/bin/protoc"  # the build's protoc rules depend on it

# 2. zlib: the headers only. The library is the system's libz.so.1 (every Debian/Ubuntu has it);
#    scripts/gpu-check.sh links libz.so in the unpacked prefix to it.
copy_usr /usr/include/zlib.h
copy_usr /usr/include/zconf.h

# 3. OpenCV 4.6: the headers of core, imgproc, imgcodecs and dnn (which the tests run the ONNX
#    export through; it links libprotobuf.so.32, carried in step 1), the four libraries and their
#    real closure, stubs for the rest, and a CMake package file for just these modules.
ocv=/usr/include/opencv4/opencv2
mkdir -p "$P/include/opencv4/opencv2"
cp -a "$ocv/core" "$ocv/imgproc" "$ocv/imgcodecs" "$ocv/dnn" "$P/include/opencv4/opencv2/"
cp -a "$ocv/core.hpp" "$ocv/imgproc.hpp" "$ocv/imgcodecs.hpp" "$ocv/dnn.hpp" \
   "$ocv/opencv_modules.hpp" "$P/include/opencv4/opencv2/"
cp -a "/usr/include/$arch/opencv4/opencv2/cvconfig.h" "$P/include/opencv4/opencv2/"
stubbed=(libgdal.so.32 libgdcmMSFF.so.3.0 libgdcmDSED.so.3.0 liblapack.so.3
         libblas.so.3 libGLX.so.0)
echo "gpu-carry.sh: OpenCV's library closure and stubs for ${stubbed[*]}"
"$py" scripts/gpu-carry-libs.py --cc cc --stubs-out "$P/lib/stubs" --list "$stage/libs.txt" \
  --stub "${stubbed[@]}" --roots libopencv_core.so.406 libopencv_imgproc.so.406 \
  libopencv_imgcodecs.so.406 libopencv_dnn.so.406 | tee "$stage/stubs.txt"
while IFS=$'\t' read -r soname path; do
  cp -a "$path" "$P/lib/$arch/"
  [[ $(basename "$path") == "$soname" ]] || ln -sf "$(basename "$path")" "$P/lib/$arch/$soname"
done <"$stage/libs.txt"
for m in core imgproc imgcodecs dnn; do
  ln -sf "libopencv_$m.so.406" "$P/lib/$arch/libopencv_$m.so"
done
mkdir -p "$P/lib/$arch/cmake/opencv4"
cat >"$P/lib/$arch/cmake/opencv4/OpenCVConfig.cmake" <<'CMAKE'
# OpenCV 4.6.0 as carried by scripts/gpu-carry.sh: Debian's libraries and headers of core,
# imgproc, imgcodecs and dnn only (imported targets opencv_core, opencv_imgproc,
# opencv_imgcodecs, opencv_dnn; OpenCV_LIBS, OpenCV_INCLUDE_DIRS, OpenCV_VERSION as OpenCV's own
# package file sets them).
set(OpenCV_VERSION 4.6.0)
set(OpenCV_VERSION_MAJOR 4)
set(OpenCV_VERSION_MINOR 6)
set(OpenCV_VERSION_PATCH 0)
set(OpenCV_SHARED ON)
get_filename_component(OpenCV_INSTALL_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
set(OpenCV_INCLUDE_DIRS "${OpenCV_INSTALL_PATH}/include/opencv4")
set(OpenCV_LIB_COMPONENTS opencv_core opencv_imgproc opencv_imgcodecs opencv_dnn)
set(_carry_deps_core "")
set(_carry_deps_imgproc opencv_core)
set(_carry_deps_imgcodecs "opencv_imgproc;opencv_core")
set(_carry_deps_dnn "opencv_imgproc;opencv_core")
foreach(_m core imgproc imgcodecs dnn)
  if(NOT TARGET opencv_${_m})
    add_library(opencv_${_m} SHARED IMPORTED)
    set_target_properties(opencv_${_m} PROPERTIES
      IMPORTED_LOCATION "${OpenCV_INSTALL_PATH}/lib/x86_64-linux-gnu/libopencv_${_m}.so.4.6.0"
      IMPORTED_SONAME "libopencv_${_m}.so.406"
      INTERFACE_INCLUDE_DIRECTORIES "${OpenCV_INCLUDE_DIRS}"
      INTERFACE_LINK_LIBRARIES "${_carry_deps_${_m}}")
  endif()
endforeach()
set(OpenCV_LIBS ${OpenCV_LIB_COMPONENTS})
set(OpenCV_FOUND TRUE)
foreach(_c ${OpenCV_FIND_COMPONENTS})
  string(REGEX REPLACE "^opencv_" "" _c "${_c}")
  if(NOT _c MATCHES "^(core|imgproc|imgcodecs|dnn)$")
    set(OpenCV_FOUND FALSE)
    set(OpenCV_NOT_FOUND_MESSAGE "the GPU carry (scripts/gpu-carry.sh) has OpenCV core, imgproc, imgcodecs and dnn only, not ${_c}")
  endif()
endforeach()
CMAKE
cat >"$P/lib/$arch/cmake/opencv4/OpenCVConfig-version.cmake" <<'CMAKE'
set(PACKAGE_VERSION 4.6.0)
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

touch -r "$ocv/core.hpp" "$P/lib/$arch/cmake/opencv4"/*.cmake

# 4. Gloo's headers, a fallback for a LibTorch that ships none (gpu-check.sh decides).
cp -a /usr/include/gloo "$P/fallback-include/"

# 5. The smoke test: every carried codec through the carried OpenCV, with every stub loaded, and
#    an ONNX graph from libonnx through OpenCV's DNN on the one protobuf runtime.
#    Built with: -DONNX_NAMESPACE=onnx -DONNX_ML=1 (as Debian's ONNX targets say) and
#    -lopencv_dnn -lopencv_imgcodecs -lopencv_imgproc -lopencv_core -lonnx -lonnx_proto -lprotobuf
cat >"$P/share/trainer-carry/smoke.cpp" <<'CPP'
// The GPU carry's smoke test (scripts/gpu-carry.sh): OpenCV from the carry loads (BIND_NOW: every
// imported symbol resolves, stubs included), each carried codec encodes and decodes, and a graph
// written with libonnx's types and checker runs through OpenCV's DNN, with libonnx_proto,
// libopencv_dnn and this program on one protobuf runtime (one descriptor pool).
#include <cstdio>
#include <exception>
#include <google/protobuf/descriptor.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <opencv2/core.hpp>
#include <opencv2/dnn.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <stdexcept>
#include <string>
#include <vector>

// A Relu over [1,1,2,2] as ONNX (opset 13, the trainer's lowest), checked, serialised, read back
// by cv::dnn and run; 0 when the output is max(x, 0).
static int onnx_through_dnn() {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  if (pool->FindMessageTypeByName("onnx.ModelProto") != onnx::ModelProto::descriptor()) {
    std::printf("carry smoke: onnx FAILED: libonnx_proto's types are not in this program's "
                "protobuf descriptor pool (two protobuf runtimes?)\n");
    return 1;
  }
  onnx::ModelProto model;
  model.set_ir_version(onnx::IR_VERSION);
  model.add_opset_import()->set_version(13);
  auto* graph = model.mutable_graph();
  graph->set_name("carry_smoke");
  auto* relu = graph->add_node();
  relu->set_op_type("Relu");
  relu->add_input("x");
  relu->add_output("y");
  const auto describe = [](onnx::ValueInfoProto* value, const char* name) {
    value->set_name(name);
    auto* tensor = value->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(onnx::TensorProto::FLOAT);
    for (int d : {1, 1, 2, 2}) tensor->mutable_shape()->add_dim()->set_dim_value(d);
  };
  describe(graph->add_input(), "x");
  describe(graph->add_output(), "y");
  float in[4] = {-1.5f, 0.f, 2.f, -3.f};
  const float want[4] = {0.f, 0.f, 2.f, 0.f};
  try {
    onnx::checker::check_model(model);
    std::string bytes;
    if (!model.SerializeToString(&bytes)) throw std::runtime_error("SerializeToString failed");
    cv::dnn::Net net = cv::dnn::readNetFromONNX(bytes.data(), bytes.size());
    const int shape[4] = {1, 1, 2, 2};
    net.setInput(cv::Mat(4, shape, CV_32F, in));
    const cv::Mat out = net.forward().reshape(1, 1);
    bool ok = out.total() == 4 && out.type() == CV_32F;
    for (int i = 0; ok && i < 4; ++i) ok = out.at<float>(i) == want[i];
    std::printf("carry smoke: onnx  %s (Relu, %zu bytes, checked by onnx::checker, run by "
                "cv::dnn)\n", ok ? "ok" : "FAILED", bytes.size());
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("carry smoke: onnx FAILED: %s\n", e.what());
    return 1;
  }
}

int main() {
  cv::Mat img(120, 160, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(255));
  cv::GaussianBlur(img, img, cv::Size(5, 5), 1.5);
  int failed = 0;
  for (const char* ext : {".jpg", ".png", ".bmp", ".tiff", ".webp", ".jp2"}) {
    std::vector<uchar> buf;
    bool ok = false;
    try {
      ok = cv::imencode(ext, img, buf);
      cv::Mat back = cv::imdecode(buf, cv::IMREAD_COLOR);
      ok = ok && back.rows == img.rows && back.cols == img.cols && back.type() == CV_8UC3;
      if (ok) {
        cv::Mat small, rgb;
        cv::resize(back, small, cv::Size(64, 48), 0, 0, cv::INTER_AREA);
        cv::cvtColor(small, rgb, cv::COLOR_BGR2RGB);
        ok = rgb.cols == 64 && rgb.rows == 48;
      }
    } catch (const cv::Exception& e) {
      std::printf("%s: %s\n", ext, e.what());
    }
    std::printf("carry smoke: %-5s %s (%zu bytes)\n", ext, ok ? "ok" : "FAILED", buf.size());
    failed += !ok;
  }
  {  // the trainer's reduced-size JPEG decode (data.reduced_decode)
    std::vector<uchar> buf;
    cv::imencode(".jpg", img, buf);
    cv::Mat half = cv::imdecode(buf, cv::IMREAD_REDUCED_COLOR_2);
    const bool ok = half.cols == img.cols / 2 && half.rows == img.rows / 2;
    std::printf("carry smoke: .jpg at 1/2 %s (%dx%d)\n", ok ? "ok" : "FAILED", half.cols, half.rows);
    failed += !ok;
  }
  failed += onnx_through_dnn();
  std::printf("carry smoke: OpenCV %s, protobuf %s, %s\n", CV_VERSION,
              google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION).c_str(),
              failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
CPP

# 6. The manifest.
{
  echo "GPU carry written by scripts/gpu-carry.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo
  echo "Debian packages (whole, or the parts named in the script):"
  for p in "${pkgs[@]}" "${other_pkgs[@]}"; do
    dpkg-query -W -f='  ${Package} ${Version}\n' "$p"
  done
  echo
  echo "OpenCV's carried closure (soname, file):"
  sed 's/^/  /' "$stage/libs.txt"
  echo
  echo "Stubs in lib/stubs (what the trainer never calls; a called stub aborts naming itself):"
  sed 's/^/  /' "$stage/stubs.txt"
  echo
  echo "Files:"
  (cd "$P" && find . -type f -o -type l | sort | awk -F/ '{print $2"/"$3}' | sort | uniq -c | sed 's/^/  /')
} >"$manifest"

# 7. Self-check here: the smoke test against the staged prefix, every stub in the path.
echo "gpu-carry.sh: smoke test against the staged carry"
c++ -std=c++17 -O1 -o "$stage/smoke" "$P/share/trainer-carry/smoke.cpp" -I"$P/include" \
  -I"$P/include/opencv4" -DONNX_NAMESPACE=onnx -DONNX_ML=1 -L"$P/lib/$arch" -lopencv_dnn \
  -lopencv_imgcodecs -lopencv_imgproc -lopencv_core -lonnx -lonnx_proto -lprotobuf \
  -Wl,-rpath-link,"$P/lib/$arch":"$P/lib/stubs"
LD_LIBRARY_PATH=$P/lib/$arch:$P/lib/stubs "$stage/smoke" || die "the carry's smoke test failed"
resolved=$(LD_LIBRARY_PATH=$P/lib/$arch:$P/lib/stubs ldd "$stage/smoke")
for s in libopencv_core.so.406 libopencv_dnn.so.406 libonnx.so.1 libonnx_proto.so.1 \
         libprotobuf.so.32 libjpeg.so.62 libOpenEXR-3_1.so.30 libgdal.so.32 liblapack.so.3; do
  grep -q "$s => $P/" <<<"$resolved" || die "the smoke test did not load $s from the carry: $(grep "$s" <<<"$resolved")"
done
"$P/bin/protoc" --version >/dev/null || die "the carry's protoc does not run"

# 8. Pack.
rm -rf "$out"
mkdir -p "$out"
raw_kib=$(du -sk "$P" | cut -f1)
tar -C "$stage" --owner=0 --group=0 --numeric-owner -cf - prefix | xz -T2 -6 >"$out/carry.tar.xz"
cp "$manifest" "$out/MANIFEST.txt"
bytes=$(du -cb "$out"/* | tail -1 | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
echo "gpu-carry.sh: wrote $out: $mib MiB ($(awk -v k="$raw_kib" 'BEGIN {printf "%.1f", k / 1024}') MiB unpacked)"
if awk -v m="$mib" -v l="$limit_mib" 'BEGIN {exit !(m > l)}'; then
  die "the carry is $mib MiB, over the $limit_mib MiB it may take of the 64 MiB sent to the GPU machine"
fi
