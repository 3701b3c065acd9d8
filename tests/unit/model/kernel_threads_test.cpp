// model::own_kernel_threads: the trainer's own kernels get every intra-op thread from
// at::parallel_for (which runs on the calling thread alone in a file compiled without OpenMP).
#include "common/catch.h"

#include <ATen/Parallel.h>

#include "trainer/model/kernel_threads.h"

TEST_CASE("the trainer's own kernels run on every intra-op thread", "[kernel_threads]") {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
#if TRAINER_SERIAL_KERNELS  // a Clang build (lib/CMakeLists.txt says why)
  CHECK(trainer::model::own_kernel_threads() == 1);
#else
  CHECK(trainer::model::own_kernel_threads() == 2);
#endif
  at::set_num_threads(1);
  CHECK(trainer::model::own_kernel_threads() == 1);
  at::set_num_threads(threads);
}
