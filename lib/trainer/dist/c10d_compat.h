// Private to dist/: the one place that includes c10d (TCPStore, PrefixStore, Gloo and, in CUDA
// builds, NCCL) and absorbs LibTorch-version differences in its C++ API. Never include this
// from a public header. Header-only; declarations only, no state.
#pragma once

// LibTorch's CMake config does not export these: the c10d headers compile their backend classes
// only when told the backend was built in. Debian's libtorch and the official CUDA/CPU LibTorch
// packages are built with Gloo; NCCL exists only in CUDA builds.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#if defined(TRAINER_WITH_CUDA) && !defined(USE_C10D_NCCL)
#define USE_C10D_NCCL 1
#endif

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef TRAINER_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "trainer/util/torch_compat.h"

namespace trainer::dist::compat {

// The class that declares the virtual collectives (allreduce, broadcast, allgather, barrier)
// that ProcessGroupGloo and ProcessGroupNCCL implement: c10d::ProcessGroup up to 1.13; from 2.0
// on the backends derive from c10d::Backend and ProcessGroup only dispatches to them.
#if TRAINER_TORCH_AT_LEAST(2, 0)
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

// c10d::Work is the handle type of both 1.13 and 2.x (1.12 and older: ProcessGroup::Work, not
// supported).
using Work = c10d::Work;

}  // namespace trainer::dist::compat
