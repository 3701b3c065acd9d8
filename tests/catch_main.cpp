// The one Catch2 main shared by every test executable (Catch2 2 and 3 alike: a Session, as
// Catch2's own main does).
#if !__has_include(<catch2/catch_all.hpp>)
#define CATCH_CONFIG_RUNNER
#endif
#include "common/catch.h"

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
