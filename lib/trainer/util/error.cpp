#include "trainer/util/error.h"

namespace trainer {

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kUsage:
    case ErrorKind::kConfig:
      return 2;
    case ErrorKind::kData:
      return 3;
    case ErrorKind::kDistributed:
      return 4;
    case ErrorKind::kInterrupted:
      return 143;
    case ErrorKind::kInternal:
      return 1;
  }
  return 1;
}

}  // namespace trainer
