// Strangers at the chief's port: the rendezvous store has no authentication, so anything on the
// network may connect to it (a port scanner, curl, random bytes, a connection left half-open).
// None of that may crash, hang or stall the chief: a job that meets and trains while such
// traffic arrives over loopback (a stranger every 0.3 s, fifteen of them before the second
// worker joins; six connections left half-open in the middle of a request, each of which stalled
// LibTorch 1.13's store for ever before the listener's reads were bounded) still finishes, with the
// same exit code and outputs. A flood of half-open connections is not covered on 1.13: each still
// stalls its store for up to 2 s. On LibTorch 2.x the store's server is libuv's (from 2.4 by
// default), which reads without blocking: the same test covers it, and the half-open connections
// stall nothing there.
#include "common/catch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;

namespace {

// Random bytes (case 2) and a huge declared length (case 4) make LibTorch's store allocate a
// length the stranger declares; it relies on operator new throwing std::bad_alloc for an
// impossible one (its daemon then drops the connection). AddressSanitizer's operator new cannot
// throw: it reports allocation-size-too-big and aborts, a report inside LibTorch that no
// suppression covers. So the ASan build leaves those two out: case 2 only connects and closes,
// case 4 leaves the start of a request open as case 3 does.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINER_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TRAINER_TEST_ASAN 1
#endif
#ifdef TRAINER_TEST_ASAN
constexpr bool kDeclaredLengths = false;
#else
constexpr bool kDeclaredLengths = true;
#endif

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

}  // namespace

TEST_CASE("strangers connecting to the chief's port never stop the job",
          "[multiworker][security]") {
  TempDir dir("strangers");
  make_dataset(dir.path(), "data", 8, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const int port = free_port();
  const std::string args =
      "--config job.yaml --job-dir job --set data.validation.path= --set train.max_steps=6 "
      "--set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=60";

  std::atomic<bool> stop{false};
  std::vector<int> held;  // half-open connections, kept until the job is over
  int connections = 0;
  // Strangers that reached the chief; the second worker starts only after the first 15 (every
  // kind three times, all six half-open connections held), so the counts below do not depend on
  // how fast the job then trains (a fast job once ended after five).
  std::atomic<int> rounds{0};
  constexpr int kRoundsBeforeWorker1 = 15;
  std::thread stranger([&] {
    std::mt19937 rng(7);
    int round = 0;
    while (!stop) {
      rounds = round;
      const int fd = connect_to(port);
      if (fd < 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      ++connections;
      switch (round++ % 5) {
        case 0:  // a port scanner: connect, close
          break;
        case 1:  // curl
          send_all(fd, "GET / HTTP/1.1\r\nHost: chief\r\nUser-Agent: curl/7.88\r\n\r\n");
          break;
        case 2: {  // random bytes
          if (!kDeclaredLengths) break;
          std::string junk(4096, '\0');
          for (char& c : junk) c = static_cast<char>(rng());
          send_all(fd, junk);
          break;
        }
        case 3:  // the start of a request that never finishes, left open
          if (held.size() < 6) {
            send_all(fd, std::string(1, '\x03'));
            held.push_back(fd);
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            continue;
          }
          break;
        case 4:  // a huge declared length, left open
          if (held.size() < 6) {
            send_all(fd, kDeclaredLengths ? std::string("\x01\xff\xff\xff\xff\xff\xff\xff\x7f", 9)
                                          : std::string(1, '\x03'));
            held.push_back(fd);
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            continue;
          }
          break;
      }
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });

  const auto start = std::chrono::steady_clock::now();
  Background w0(dir.path(), args, {tf_config(2, false, port, "worker", 0)}, "w0");
  // The strangers arrive while the chief waits for worker 1 (bounded: the chief's rendezvous
  // timeout is 60 s, a stranger every 0.3 s once it listens).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rounds < kRoundsBeforeWorker1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(rounds >= kRoundsBeforeWorker1);
  Background w1(dir.path(), args, {tf_config(2, false, port, "worker", 1)}, "w1");
  const Result r1 = w1.wait();
  const Result r0 = w0.wait();
  stop = true;
  stranger.join();
  for (int fd : held) ::close(fd);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("chief: " << r0.err);
  INFO("worker 1: " << r1.err);
  INFO(connections << " stranger connections, " << held.size() << " left half-open; " << took
                   << " s");
  CHECK(connections > 10);
  CHECK(held.size() == 6);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(fs::exists(dir / "job" / "model" / "model.safetensors"));
}
