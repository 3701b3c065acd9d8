#include "trainer/util/error.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <new>
#include <system_error>

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

const char* kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kUsage:
      return "usage error";
    case ErrorKind::kConfig:
      return "config error";
    case ErrorKind::kData:
      return "data error";
    case ErrorKind::kDistributed:
      return "distributed error";
    case ErrorKind::kInterrupted:
      return "interrupted";
    case ErrorKind::kInternal:
      return "internal error";
  }
  return "internal error";
}

namespace {

std::string one_line(std::string m) {
  if (auto cut = m.find("\nException raised from"); cut != std::string::npos) m.resize(cut);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  for (char& c : m) {
    if (c == '\n') c = ' ';
  }
  return m;
}

}  // namespace

ErrorSummary describe_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return {err.kind(), err.what()};
  } catch (const std::filesystem::filesystem_error& err) {
    std::string m = err.what();
    if (err.code() == std::errc::no_space_on_device) {
      m += " (the disk is full)";
    } else if (err.code() == std::errc::read_only_file_system) {
      m += " (the file system is read-only)";
    } else if (err.code() == std::errc::permission_denied) {
      m += " (permission denied)";
    }
    return {ErrorKind::kData, m};
  } catch (const std::bad_alloc&) {
    return {ErrorKind::kInternal, "internal error: out of memory (std::bad_alloc)"};
  } catch (const c10::Error& err) {
    return {ErrorKind::kInternal,
            "internal error in LibTorch: " + one_line(err.what_without_backtrace())};
  } catch (const std::exception& err) {
    return {ErrorKind::kInternal, std::string("internal error: ") + one_line(err.what())};
  } catch (...) {
    return {ErrorKind::kInternal, "internal error: an exception of unknown type"};
  }
}

}  // namespace trainer
