// Reading a job's TensorBoard event files back in integration tests, with the project's reader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainer/loop/events.h"

namespace trainer::testing {

// Every file under `dir` (recursively) whose name holds "tfevents", as TensorBoard finds them.
inline std::vector<std::filesystem::path> tfevents_under(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  if (!std::filesystem::exists(dir)) return files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().find("tfevents") != std::string::npos)
      files.push_back(e.path());
  }
  return files;
}

// The steps of `tag` over a run's files in the order TensorBoard reads them.
inline std::vector<int64_t> summary_steps(const std::filesystem::path& run,
                                          const std::string& tag) {
  std::vector<int64_t> steps;
  for (const auto& file : train::event_files(run)) {
    for (const auto& record : train::read_events(file)) {
      for (const auto& value : record.values) {
        if (value.tag == tag) steps.push_back(record.step);
      }
    }
  }
  return steps;
}

// The values of `tag` over a run, in the same order.
inline std::vector<train::SummaryValue> summary_values(const std::filesystem::path& run,
                                                       const std::string& tag) {
  std::vector<train::SummaryValue> values;
  for (const auto& file : train::event_files(run)) {
    for (const auto& record : train::read_events(file)) {
      for (const auto& value : record.values) {
        if (value.tag == tag) values.push_back(value);
      }
    }
  }
  return values;
}

}  // namespace trainer::testing
