// The trainer binary's memory allocator settings. When the build links jemalloc (Debian's
// libjemalloc, see app/CMakeLists.txt), jemalloc reads this string at its first allocation:
// freed pages are never returned to the system (no decay), so the training step reuses its
// activation memory instead of taking minor page faults to map it in again every step (glibc
// unmaps blocks of that size on free). Users get this without LD_PRELOAD or MALLOC_CONF; an
// explicit MALLOC_CONF in the environment still overrides it. Without jemalloc the string is an
// unused global and util::configure_allocator() sets glibc's mallopt equivalent.
#ifdef TRAINER_WITH_JEMALLOC
extern "C" {
// NOLINTNEXTLINE: the name jemalloc looks up
__attribute__((used)) const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
}
#endif
