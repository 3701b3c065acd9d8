// The limit on open files (RLIMIT_NOFILE). A training process holds a socket to every peer (Gloo's
// full mesh) and the chief's also every task's store connections, so a job of hundreds of tasks
// needs more than the usual soft limit of 1,024. Processes start with the soft limit raised to
// the hard one (children inherit it); what cannot be raised is checked against the world size
// before any rendezvous (dist::open_files_needed).
#pragma once

#include <cstdint>

namespace trainer::util {

struct OpenFileLimit {
  int64_t soft = 0;  // INT64_MAX when unlimited
  int64_t hard = 0;
};

OpenFileLimit open_file_limit();  // as it is now

// Raises the soft limit to the hard one (never lowers it; an unlimited hard limit gives
// fs.nr_open); returns the limits afterwards, whose soft one is what a process may open. Never
// throws: a limit that cannot be read or raised is returned as it is.
OpenFileLimit raise_open_file_limit();

}  // namespace trainer::util
