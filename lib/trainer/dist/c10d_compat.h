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

#include <exception>
#include <string>
#include <vector>

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

// A TCPStore, server or client. From LibTorch 2.4 on TCPStoreOptions asks for the libuv server
// by default, and a LibTorch built without libuv (Debian 13's 2.6) refuses that in the
// constructor ("use_libuv was requested but PyTorch was build without libuv support"); there the
// classic server serves, as in 1.13. Pip's wheels have libuv.
inline c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host,
                                                         c10d::TCPStoreOptions opts) {
#if TRAINER_TORCH_AT_LEAST(2, 4)
  if (opts.useLibUV) {
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, opts);
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("without libuv") == std::string::npos) throw;
      opts.useLibUV = false;
    }
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

// c10d::Work is the handle type of both 1.13 and 2.x (1.12 and older: ProcessGroup::Work, not
// supported).
using Work = c10d::Work;

#ifdef TRAINER_WITH_CUDA
// Aborts NCCL's communicators so that no kernel or host thread stays blocked on a lost peer:
// ProcessGroupNCCL::abort() from LibTorch 2.4 on; before, each in-flight work's abort() (which
// aborts the communicators it used). Never throws.
inline void abort_nccl(Backend& nccl, const std::vector<c10::intrusive_ptr<Work>>& in_flight) {
  try {
#if TRAINER_TORCH_AT_LEAST(2, 4)
    (void)in_flight;
    static_cast<c10d::ProcessGroupNCCL&>(nccl).abort();
#else
    (void)nccl;
    for (const auto& w : in_flight) {
      if (!w->isCompleted()) w->abort();
    }
#endif
  } catch (const std::exception&) {
    // Already aborted, or nothing left to abort.
  }
}

// Destroys NCCL's communicators before the group is released: ProcessGroupNCCL::shutdown()
// from LibTorch 2.4 on (it warns at exit without); before, the destructor does it. Never throws.
inline void shutdown_nccl(Backend& nccl) {
#if TRAINER_TORCH_AT_LEAST(2, 4)
  try {
    static_cast<c10d::ProcessGroupNCCL&>(nccl).shutdown();
  } catch (const std::exception&) {
    // Already shut down or aborted.
  }
#else
  (void)nccl;
#endif
}
#endif

}  // namespace trainer::dist::compat
