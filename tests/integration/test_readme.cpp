// The README stays true: its two set-up commands are the ones .ci/run and the scripts use, and
// its field reference is exactly what `trainer train --help` prints.
#include "common/catch.h"

#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("README holds the two set-up commands and the current field reference", "[readme]") {
  const std::string readme = slurp(fs::path(TRAINER_SOURCE_DIR) / "README.md");
  CHECK_THAT(readme, Contains("bash scripts/install-deps.sh && bash scripts/build.sh && bash "
                              "scripts/run-quickstart.sh"));
  CHECK_THAT(
      readme,
      Contains("bash scripts/install-deps.sh && bash scripts/build.sh && bash scripts/test.sh"));
  CHECK_THAT(slurp(fs::path(TRAINER_SOURCE_DIR) / ".ci" / "run"), Contains("README.md"));
  // The PyTorch 2.11 flavour's three commands, as .ci/run runs them.
  for (const char* line :
       {"bash scripts/install-deps.sh --torch pip", "bash scripts/build.sh --torch pip",
        "bash scripts/test.sh --torch pip"}) {
    CHECK_THAT(readme, Contains(line));
    CHECK_THAT(slurp(fs::path(TRAINER_SOURCE_DIR) / ".ci" / "run"), Contains(line));
  }

  TempDir dir("readme");
  const Result help = run_trainer(dir.path(), "train --help");
  REQUIRE(help.code == 0);
  const std::string marker = "model: the network";
  const size_t start = help.out.find(marker);
  REQUIRE(start != std::string::npos);
  std::istringstream lines(help.out.substr(start));
  for (std::string line; std::getline(lines, line);) {
    INFO("README.md lacks this line of `trainer train --help` (regenerate the reference)");
    CHECK_THAT(readme, Contains(line));
  }
}
