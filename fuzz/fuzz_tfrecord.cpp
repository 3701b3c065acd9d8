// TFRecord reader, plain and gzip. Input: byte 0 picks the compression setting (none, gzip or
// auto, as data.*.compression) and the read block size; the rest is the file. Reads every record
// (going on after a recoverable data-CRC error, as the trainer's reader does), then skips
// through it and counts its records from the headers.
#include "fuzz_common.h"
#include "trainer/data/tfrecord.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const char* kSettings[] = {"none", "gzip", "auto"};
  const char* setting = kSettings[data[0] % 3];
  const size_t block = size_t{64} << ((data[0] >> 2) % 12);  // 64 B .. 128 KiB
  const fuzz::fs::path path = fuzz::scratch_dir() / "input.tfrecord";
  fuzz::write_bytes(path, data + 1, size - 1);
  fuzz::expect_clean_errors("tfrecord", [&] {
    const data::Compression c = data::compression_for(setting, path.string());
    {
      data::RecordReader reader(path.string(), c, block);
      std::string record;
      for (;;) {
        try {
          if (!reader.read(&record)) break;
        } catch (const data::RecordError& e) {
          if (!e.recoverable) throw;
        }
      }
    }
    try {
      data::RecordReader reader(path.string(), c, block);
      while (reader.skip()) {
      }
    } catch (const data::RecordError&) {
    }
    data::count_records(path.string(), c);
  });
  return 0;
}
