// How many threads the trainer's own CPU kernels (model/batch_norm.cpp, model/max_pool.cpp,
// loop/optimizer_kernels.cpp) get from at::parallel_for in this build: ATen's OpenMP pragma is
// inline, so a kernel runs in parallel only where its file is compiled with OpenMP, as
// lib/CMakeLists.txt compiles every file that calls at::parallel_for, this one among them (in a
// GCC build; a Clang build, TRAINER_SERIAL_KERNELS, runs them on one thread).
// Runs `tasks` tasks of one item each and counts the distinct threads that ran one (at most
// at::get_num_threads()). For tests and diagnostics. Thread-safe.
#pragma once

#include <cstdint>

namespace trainer::model {

int own_kernel_threads(int64_t tasks = 64);

}  // namespace trainer::model
