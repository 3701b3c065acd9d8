// The YAML job spec with --set overrides. Input: YAML text; each line that starts with "#set "
// (a comment to YAML) is also passed as one --set override (the rest of the line), so that the
// fuzzer mutates overrides and the document together. A spec that parses is also written back
// to YAML, flattened and fingerprinted, as `trainer train` does for job.yaml.
#include "fuzz_common.h"
#include "trainer/config/job_spec.h"

#include <sstream>

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("#set ", 0) == 0) overrides.push_back(line.substr(5));
  }
  fuzz::expect_clean_errors("job_spec", [&] {
    const config::JobSpec spec = config::parse_job_spec(text, overrides, "input.yaml");
    const std::string yaml = config::to_yaml(spec);
    config::flatten(spec);
    config::fingerprint(spec);
    // What job.yaml holds must read back to the same spec.
    const config::JobSpec again = config::parse_job_spec(yaml, {}, "job.yaml");
    if (config::fingerprint(again) != config::fingerprint(spec)) {
      std::fprintf(stderr, "job_spec: job.yaml does not read back to the same spec:\n%s\n",
                   yaml.c_str());
      std::abort();
    }
  });
  return 0;
}
