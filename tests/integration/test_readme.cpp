// The README stays true: its two set-up commands are the ones .ci/run and the scripts use, and
// the field reference it points to (docs/reference.md, scripts/gen-reference.sh) is exactly
// what `trainer train --help` prints.
#include "common/catch.h"

#include "harness.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("README holds the two set-up commands and points to the current field reference",
          "[readme]") {
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
  const size_t end = help.out.find("\nExit codes:", start);  // the help's last line, not a field
  REQUIRE(end != std::string::npos);
  std::string fields = help.out.substr(start, end + 1 - start);
  while (fields.size() > 1 && fields.back() == '\n' && fields[fields.size() - 2] == '\n') {
    fields.pop_back();  // the blank line before "Exit codes:" is no field
  }
  // docs/reference.md's one code block is the field list, line for line.
  CHECK_THAT(readme, Contains("(docs/reference.md)"));
  const std::string reference = slurp(fs::path(TRAINER_SOURCE_DIR) / "docs" / "reference.md");
  const size_t open = reference.find("\n```\n");
  REQUIRE(open != std::string::npos);
  const size_t close = reference.find("\n```", open + 5);
  REQUIRE(close != std::string::npos);
  INFO("docs/reference.md differs from `trainer train --help`: run bash scripts/gen-reference.sh");
  CHECK(reference.substr(open + 5, close + 1 - (open + 5)) == fields);
  // The README stays short: the reference lives in docs/, the user's data comes early.
  const auto count = [](const std::string& text, size_t upto) {
    return std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(upto), '\n');
  };
  CHECK(count(readme, readme.size()) <= 400);
  CHECK(count(readme, readme.find("## Your data")) <= count(readme, readme.size()) * 2 / 5);
}

namespace {

// The words of a shell command line: whitespace-separated, '...' and "..." quoting kept together
// (quotes removed), a word starting with # ends the line.
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (const char c : line) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
      continue;
    }
    if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
      continue;
    }
    if (c == '#' && !in_word) break;
    word += c;
    in_word = true;
  }
  if (in_word) words.push_back(word);
  return words;
}

// The command lines of the README's code blocks (fenced, or indented by four spaces),
// continuation lines joined.
std::vector<std::string> code_lines(const std::string& readme) {
  std::vector<std::string> out;
  std::istringstream in(readme);
  bool in_block = false;
  std::string pending;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (!in_block && line.rfind("    ", 0) != 0) continue;
    if (!line.empty() && line.back() == '\\') {
      pending += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    out.push_back(pending + line);
    pending.clear();
  }
  return out;
}

bool is_trainer_binary(const std::string& word) {
  return word == "trainer" ||
         (word.size() > 8 && word.compare(word.size() - 8, 8, "/trainer") == 0);
}

}  // namespace

TEST_CASE("every trainer command in the README names subcommands, flags and fields that exist",
          "[readme]") {
  const std::string readme = slurp(fs::path(TRAINER_SOURCE_DIR) / "README.md");
  TempDir dir("readme_commands");
  std::map<std::string, std::string> help;  // subcommand -> its --help
  const auto help_of = [&](const std::string& sub) -> const std::string& {
    if (!help.count(sub)) {
      const Result r = run_trainer(dir.path(), sub + " --help");
      INFO(sub << " --help: " << r.err);
      REQUIRE(r.code == 0);
      help[sub] = r.out;
    }
    return help[sub];
  };
  const std::set<std::string> subcommands = {"train",    "make-dataset", "predict",
                                             "evaluate", "inspect",      "launch",
                                             "convert",  "export",       "preview"};
  const std::string fields = help_of("train");
  int commands = 0;
  for (const std::string& line : code_lines(readme)) {
    const std::vector<std::string> words = shell_words(line);
    for (size_t i = 0; i < words.size(); ++i) {
      if (!is_trainer_binary(words[i])) continue;
      ++commands;
      std::string sub = "train";
      size_t at = i + 1;
      if (at < words.size() && subcommands.count(words[at])) sub = words[at++];
      INFO("README line: " << line);
      for (; at < words.size(); ++at) {
        const std::string& w = words[at];
        if (w == "&&" || w == "||" || w == "|" || w == ";" || w[0] == '>' || w == "2>&1") break;
        if (w == "--") {  // launch: what follows is every process's train command
          sub = "train";
          continue;
        }
        if (w.rfind("--", 0) != 0) continue;
        const std::string flag = w.substr(0, w.find('='));
        if (flag == "--help" || flag == "--version") continue;
        CHECK_THAT(help_of(sub), Contains(flag));
        if (flag == "--set") {
          const std::string kv = w.find('=') != std::string::npos && w.find('=') == 5
                                     ? w.substr(6)
                                     : (at + 1 < words.size() ? words[++at] : std::string());
          const std::string field = kv.substr(0, kv.find('='));
          CHECK_THAT(fields, Contains("  " + field + " = "));
        }
      }
    }
  }
  CHECK(commands >= 12);  // the README shows the trainer at work
}
