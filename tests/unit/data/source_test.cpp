// Listing sources: imagefolder layout and csv manifests (parsing, labels, path containment).
#include "common/catch.h"

#include "fixtures.h"
#include "trainer/data/source.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;
namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_text;

namespace {

SourceOptions folder_spec(const fs::path& dir) {
  SourceOptions s;
  s.format = "imagefolder";
  s.path = {dir.string()};
  return s;
}

SourceOptions csv_spec(const fs::path& manifest) {
  SourceOptions s;
  s.format = "csv";
  s.path = {manifest.string()};
  return s;
}

std::string error_of(const SourceOptions& spec, const std::vector<std::string>& names = {}) {
  try {
    list_source(spec, "data.train", names);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

}  // namespace

TEST_CASE("imagefolder lists sorted classes and sorted image files", "[data][source]") {
  TempDir tmp;
  const fs::path root = tmp / "train";
  write_text(root / "b" / "x.jpeg", "not decoded");
  write_text(root / "a" / "2.png", "");
  write_text(root / "a" / "1.jpg", "");
  write_text(root / "a" / "4.JPG", "");
  write_text(root / "a" / "sub" / "3.jpg", "");
  write_text(root / "a" / "notes.txt", "");
  write_text(root / "a" / ".hidden.jpg", "");
  write_text(root / ".cache" / "z.jpg", "");
  fs::create_directories(root / "c");  // a class without images: a warning, not an error

  const Listing l = list_source(folder_spec(root), "data.train");
  CHECK(l.class_names == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(l.examples.size() == 5);
  CHECK(l.examples[0].path == (root / "a" / "1.jpg").string());
  CHECK(l.examples[1].path == (root / "a" / "2.png").string());
  CHECK(l.examples[2].path == (root / "a" / "4.JPG").string());
  CHECK(l.examples[3].path == (root / "a" / "sub" / "3.jpg").string());
  CHECK(l.examples[4].path == (root / "b" / "x.jpeg").string());
  CHECK(l.examples[0].label == 0);
  CHECK(l.examples[3].label == 0);
  CHECK(l.examples[4].label == 1);
  CHECK_THAT(l.origin, Contains("data.train") && Contains("imagefolder"));

  SECTION("given class names fix the label indices") {
    const Listing g = list_source(folder_spec(root), "data.validation", {"c", "b", "a", "d"});
    CHECK(g.class_names == std::vector<std::string>{"c", "b", "a", "d"});
    CHECK(g.examples[0].label == 2);
    CHECK(g.examples[4].label == 1);
  }
  SECTION("a sub-directory not among the given class names is an error") {
    CHECK_THAT(error_of(folder_spec(root), {"a", "b"}), Contains("'c'") || Contains("/c'"));
  }
}

TEST_CASE("imagefolder errors name the source and the path", "[data][source]") {
  TempDir tmp;
  CHECK_THAT(error_of(folder_spec(tmp / "nope")), Contains("data.train") && Contains("nope"));
  fs::create_directories(tmp / "empty");
  CHECK_THAT(error_of(folder_spec(tmp / "empty")), Contains("no class sub-directories"));
  fs::create_directories(tmp / "noimg" / "a");
  write_text(tmp / "noimg" / "a" / "readme.txt", "");
  CHECK_THAT(error_of(folder_spec(tmp / "noimg")), Contains("no images"));
  SourceOptions none;
  CHECK_THAT(error_of(none), Contains("data.train.path"));
  SourceOptions bad = folder_spec(tmp.path());
  bad.format = "tfrecords";
  CHECK_THAT(error_of(bad), Contains("tfrecords"));
}

TEST_CASE("csv manifest with integer labels", "[data][source]") {
  TempDir tmp;
  write_text(tmp / "train.csv", "image_id,label\n1.jpg,2\nsub/2.jpg,0\n3.jpg,2\n");
  const Listing l = list_source(csv_spec(tmp / "train.csv"), "data.train");
  CHECK(l.class_names == std::vector<std::string>{"0", "1", "2"});
  REQUIRE(l.examples.size() == 3);
  CHECK(l.examples[0].path == (tmp / "1.jpg").string());  // image_root = the manifest's dir
  CHECK(l.examples[1].path == (tmp / "sub" / "2.jpg").string());
  CHECK(l.examples[0].label == 2);
  CHECK(l.examples[1].label == 0);
  CHECK(l.examples[2].label == 2);

  SECTION("given class names name the indices") {
    const Listing g =
        list_source(csv_spec(tmp / "train.csv"), "data.train", {"cbb", "cbsd", "cgm", "cmd"});
    CHECK(g.class_names.size() == 4);
    CHECK(g.examples[0].label == 2);
  }
  SECTION("an index out of range of the class names names the row") {
    const std::string e = error_of(csv_spec(tmp / "train.csv"), {"x", "y"});
    CHECK_THAT(e, Contains("train.csv") && Contains("row 1") && Contains("out of range"));
  }
  SECTION("a negative index is out of range") {
    write_text(tmp / "neg.csv", "image_id,label\n1.jpg,1\n2.jpg,-1\n");
    CHECK_THAT(error_of(csv_spec(tmp / "neg.csv")), Contains("row 2") && Contains("-1"));
  }
}

TEST_CASE("csv manifest with class-name labels, another image root and columns", "[data][source]") {
  TempDir tmp;
  write_text(tmp / "m" / "list.csv",
             "label,extra,file\nhealthy,1,a.jpg\ncmd,2,b.jpg\ncbb,3,c.jpg\n");
  SourceOptions spec = csv_spec(tmp / "m" / "list.csv");
  spec.image_column = "file";
  spec.image_root = (tmp / "images").string();
  fs::create_directories(tmp / "images");
  const Listing l = list_source(spec, "data.validation");
  CHECK(l.class_names == std::vector<std::string>{"cbb", "cmd", "healthy"});
  REQUIRE(l.examples.size() == 3);
  CHECK(l.examples[0].label == 2);
  CHECK(l.examples[1].label == 1);
  CHECK(l.examples[2].label == 0);
  CHECK(l.examples[0].path == (tmp / "images" / "a.jpg").string());

  SECTION("given class names: an unknown name is an error naming the row") {
    const std::string e = error_of(spec, {"cbb", "healthy"});
    CHECK_THAT(e, Contains("row 2") && Contains("'cmd'"));
  }
  SECTION("given class names keep their order") {
    const Listing g = list_source(spec, "data.validation", {"healthy", "cmd", "cbb", "cgm"});
    CHECK(g.examples[0].label == 0);
    CHECK(g.examples[2].label == 2);
  }
}

TEST_CASE("csv parser: quotes, escaped quotes, commas, CRLF, BOM, blank lines", "[data][source]") {
  TempDir tmp;
  write_text(tmp / "q.csv",
             "\xEF\xBB\xBF"
             "\"image_id\", label ,note\r\n"
             "\"a,b.jpg\",\"x \"\"quoted\"\" name\",\"multi\r\nline\"\r\n"
             "\r\n"
             "  plain.jpg  ,  y  ,\r\n");
  const Listing l = list_source(csv_spec(tmp / "q.csv"), "data.train");
  REQUIRE(l.examples.size() == 2);
  CHECK(l.examples[0].path == (tmp / "a,b.jpg").string());
  CHECK(l.examples[1].path == (tmp / "plain.jpg").string());
  CHECK(l.class_names == std::vector<std::string>{"x \"quoted\" name", "y"});
  CHECK(l.examples[0].label == 0);
  CHECK(l.examples[1].label == 1);

  SECTION("the line of a bad row counts embedded newlines") {
    write_text(tmp / "bad.csv", "image_id,label\n\"multi\nline.jpg\",0\nonly_one_field\n");
    CHECK_THAT(error_of(csv_spec(tmp / "bad.csv")),
               Contains("row 2") && Contains("line 4") && Contains("1 fields"));
  }
  SECTION("an unterminated quote is an error") {
    write_text(tmp / "open.csv", "image_id,label\n\"a.jpg,0\n");
    CHECK_THAT(error_of(csv_spec(tmp / "open.csv")), Contains("unterminated"));
  }
}

TEST_CASE("csv: a missing column names the manifest, the column and the columns found",
          "[data][source]") {
  TempDir tmp;
  write_text(tmp / "train.csv", "path,diagnosis\na.jpg,1\n");
  const std::string e = error_of(csv_spec(tmp / "train.csv"));
  CHECK_THAT(e, Contains("train.csv") && Contains("'image_id'") && Contains("path, diagnosis"));
  write_text(tmp / "header_only.csv", "image_id,label\n");
  CHECK_THAT(error_of(csv_spec(tmp / "header_only.csv")), Contains("no rows"));
  CHECK_THAT(error_of(csv_spec(tmp / "absent.csv")), Contains("absent.csv"));
}

TEST_CASE("csv: image paths must stay inside the image root", "[data][source]") {
  TempDir tmp;
  fs::create_directories(tmp / "root");
  const fs::path manifest = tmp / "root" / "m.csv";

  write_text(manifest, "image_id,label\nok.jpg,0\n../escape.jpg,1\n");
  std::string e = error_of(csv_spec(manifest));
  CHECK_THAT(e, Contains("m.csv") && Contains("row 2") && Contains("'../escape.jpg'") &&
                    Contains("outside"));

  write_text(manifest, "image_id,label\nsub/../../root2/x.jpg,0\n");
  CHECK_THAT(error_of(csv_spec(manifest)), Contains("row 1") && Contains("outside"));

  write_text(manifest, "image_id,label\n/etc/passwd,0\n");
  CHECK_THAT(error_of(csv_spec(manifest)), Contains("'/etc/passwd'"));

  const std::string inside = (tmp / "root" / "in.jpg").string();
  write_text(manifest, "image_id,label\nsub/../a.jpg,0\n" + inside + ",1\n");
  const Listing l = list_source(csv_spec(manifest), "data.train");
  REQUIRE(l.examples.size() == 2);
  CHECK(l.examples[0].path == (tmp / "root" / "a.jpg").string());
  CHECK(l.examples[1].path == inside);
}
