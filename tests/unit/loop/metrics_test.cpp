// MetricsLog: one JSON object per line; resuming drops the records after the resume step; a
// non-finite value is null; a line cut short by a crash is dropped.
#include "common/catch.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "train_test_util.h"
#include "trainer/loop/metrics.h"

using trainer::train::MetricsLog;
using namespace trainer::train::testing;

namespace {

std::vector<nlohmann::json> read_records(const fs::path& path) {
  std::vector<nlohmann::json> records;
  for (const std::string& line : read_lines(path)) {
    INFO("line: " << line);
    REQUIRE_NOTHROW(records.push_back(nlohmann::json::parse(line)));
    REQUIRE(records.back().is_object());
  }
  return records;
}

std::vector<int64_t> steps_of(const std::vector<nlohmann::json>& records) {
  std::vector<int64_t> steps;
  for (const auto& r : records) steps.push_back(r.at("step").get<int64_t>());
  return steps;
}

// Steps 1..n of epoch 1 with a loss of step / 10.
void write_steps(const fs::path& path, int64_t resume_step, int64_t first, int64_t last) {
  MetricsLog log(path, resume_step);
  for (int64_t step = first; step <= last; ++step) {
    log.write(step, 1, {{"loss", static_cast<double>(step) / 10}});
  }
}

}  // namespace

TEST_CASE("MetricsLog writes one JSON object per line with step, epoch and values", "[metrics]") {
  TempDir tmp;
  const fs::path path = tmp / "metrics.jsonl";
  {
    MetricsLog log(path, -1);
    log.write(1, 1, {{"loss", 2.5}, {"accuracy", 0.25}, {"learning_rate", 1e-4}});
    log.write(2, 1, {{"loss", 2.0}});
    // Flushed per record: readable before the log is closed.
    CHECK(read_lines(path).size() == 2);
    log.write(2, 1, {{"val_accuracy", 0.5}, {"epoch_time_s", 12.0}});
  }
  const auto records = read_records(path);
  REQUIRE(records.size() == 3);
  CHECK(records[0] ==
        nlohmann::json{
            {"step", 1}, {"epoch", 1}, {"loss", 2.5}, {"accuracy", 0.25}, {"learning_rate", 1e-4}});
  CHECK(records[1] == nlohmann::json{{"step", 2}, {"epoch", 1}, {"loss", 2.0}});
  CHECK(records[2] ==
        nlohmann::json{{"step", 2}, {"epoch", 1}, {"val_accuracy", 0.5}, {"epoch_time_s", 12.0}});
  // Doubles round-trip exactly.
  CHECK(records[0].at("learning_rate").get<double>() == 1e-4);
}

TEST_CASE("MetricsLog with resume_step drops later records and keeps the rest", "[metrics]") {
  TempDir tmp;
  const fs::path path = tmp / "metrics.jsonl";
  write_steps(path, -1, 1, 6);
  const std::vector<std::string> before = read_lines(path);
  REQUIRE(before.size() == 6);

  write_steps(path, /*resume_step=*/3, 4, 5);  // the resumed run records 4 and 5 again
  const std::vector<std::string> after = read_lines(path);
  CHECK(steps_of(read_records(path)) == std::vector<int64_t>{1, 2, 3, 4, 5});
  // The kept records are the original lines, byte for byte.
  REQUIRE(after.size() == 5);
  for (size_t i = 0; i < 3; ++i) CHECK(after[i] == before[i]);

  SECTION("resume_step 0 keeps nothing recorded") {
    write_steps(path, 0, 1, 1);
    CHECK(steps_of(read_records(path)) == std::vector<int64_t>{1});
  }
  SECTION("resume_step -1 keeps everything and appends") {
    write_steps(path, -1, 6, 6);
    CHECK(steps_of(read_records(path)) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  }
  SECTION("resume_step beyond the last record keeps everything") {
    write_steps(path, 100, 101, 101);
    CHECK(steps_of(read_records(path)) == std::vector<int64_t>{1, 2, 3, 4, 5, 101});
  }
}

TEST_CASE("MetricsLog with resume_step and no file yet creates it", "[metrics]") {
  TempDir tmp;
  const fs::path path = tmp / "metrics.jsonl";
  write_steps(path, 7, 8, 9);
  CHECK(steps_of(read_records(path)) == std::vector<int64_t>{8, 9});
}

TEST_CASE("MetricsLog writes a non-finite value as null", "[metrics]") {
  TempDir tmp;
  const fs::path path = tmp / "metrics.jsonl";
  {
    MetricsLog log(path, -1);
    log.write(1, 1,
              {{"nan", std::nan("")},
               {"inf", std::numeric_limits<double>::infinity()},
               {"neg_inf", -std::numeric_limits<double>::infinity()},
               {"finite", 1.5}});
  }
  const auto records = read_records(path);
  REQUIRE(records.size() == 1);
  CHECK(records[0].at("nan").is_null());
  CHECK(records[0].at("inf").is_null());
  CHECK(records[0].at("neg_inf").is_null());
  CHECK(records[0].at("finite") == 1.5);
}

TEST_CASE("MetricsLog drops a last line cut short by a crash", "[metrics]") {
  TempDir tmp;
  const fs::path path = tmp / "metrics.jsonl";
  write_steps(path, -1, 1, 2);
  const std::string whole = read_bytes(path);
  write_bytes(path, whole + "{\"step\":3,\"epoch\":1,\"lo");

  SECTION("when resuming") { write_steps(path, 10, 3, 3); }
  SECTION("when appending without a resume step") { write_steps(path, -1, 3, 3); }
  CHECK(steps_of(read_records(path)) == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("a default MetricsLog drops records", "[metrics]") {
  MetricsLog log;
  CHECK_NOTHROW(log.write(1, 1, {{"loss", 1.0}}));
}
