// The csv manifest (data.*.format: csv): the whole listing, with labels derived and with
// class_names given, as `trainer train` lists a source. Images are not opened by a listing.
#include "fuzz_common.h"
#include "trainer/data/source.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::fs::path path = fuzz::scratch_dir() / "train.csv";
  fuzz::write_bytes(path, data, size);
  data::SourceOptions source;
  source.format = "csv";
  source.path = {path.string()};
  fuzz::expect_clean_errors("csv", [&] { data::list_source(source, "data.train"); });
  fuzz::expect_clean_errors("csv", [&] {
    data::list_source(source, "data.train", {"cbb", "cbsd", "cgm", "cmd", "healthy"});
  });
  return 0;
}
