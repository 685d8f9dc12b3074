// The native half of awaiting a dispatch: a Notifier is one event loop's eventfd plus the tokens
// of the awaits whose GPU work has finished. A host function the driver runs (on its own thread,
// no Python, no GIL) records its await's token and writes the eventfd once; the loop, which
// watches the eventfd with add_reader, drains the tokens and wakes those awaits.
//
// Lifetime: freed (and its eventfd closed) by the last of its owner and its armed host functions,
// so a late host function never writes to a reused descriptor. All under the Notifier's mutex.
#pragma once

#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

namespace vyre_notify {

// process-wide counts, for tests and stats: notifiers alive, host functions armed and not yet run
inline std::atomic<long long> live_notifiers{0};
inline std::atomic<long long> armed_now{0};
inline std::atomic<unsigned long long> fired_total{0};
inline std::atomic<unsigned long long> spin_queries{0};  // completion queries of spin()

struct Notifier {
  std::mutex mu;
  std::vector<uint64_t> fired;  // tokens of finished awaits, not yet drained
  int fd = -1;
  long refs = 1;  // the owner, plus one per armed host function that has not run
  bool signalled = false;  // the eventfd was written since the last drain
  bool lost = false;  // a token could not be stored: the drain reports every await as woken
  pid_t pid = 0;  // the process that made it (a forked child never takes the mutex)
};

// one armed host function's argument: owned by that host function
struct Arm {
  Notifier* n;
  uint64_t token;
};

inline Notifier* create(int* err) {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return nullptr;
  }
  Notifier* n = new (std::nothrow) Notifier();
  if (n == nullptr) {
    close(fd);
    *err = ENOMEM;
    return nullptr;
  }
  n->fd = fd;
  n->pid = getpid();
  live_notifiers.fetch_add(1);
  return n;
}

inline void destroy(Notifier* n) {
  close(n->fd);
  delete n;
  live_notifiers.fetch_sub(1);
}

// record ``token`` and wake the loop (any thread, no Python); drops one reference
inline void fire(Notifier* n, uint64_t token) {
  bool last;
  {
    std::lock_guard<std::mutex> g(n->mu);
    try {
      n->fired.push_back(token);
    } catch (...) {
      n->lost = true;
    }
    if (!n->signalled) {
      n->signalled = true;
      uint64_t one = 1;
      ssize_t r = write(n->fd, &one, sizeof(one));  // (a full counter still reads as readable)
      (void)r;
    }
    last = --n->refs == 0;
  }
  fired_total.fetch_add(1, std::memory_order_relaxed);
  if (last) destroy(n);
}

// the driver's host function (CUhostFn): runs once the work it was queued behind is done
extern "C" inline void vyre_notify_host_fn(void* data) {
  Arm* a = static_cast<Arm*>(data);
  Notifier* n = a->n;
  uint64_t token = a->token;
  delete a;
  armed_now.fetch_sub(1);
  fire(n, token);
}

// a reference for a host function about to be armed, in the Arm it will own (nullptr: no memory)
inline Arm* new_arm(Notifier* n, uint64_t token) {
  Arm* a = new (std::nothrow) Arm{n, token};
  if (a == nullptr) return nullptr;
  {
    std::lock_guard<std::mutex> g(n->mu);
    n->refs++;
  }
  armed_now.fetch_add(1);
  return a;
}

// the driver refused the host function: it will never run, so its reference goes now
inline void cancel_arm(Arm* a) {
  Notifier* n = a->n;
  delete a;
  armed_now.fetch_sub(1);
  std::lock_guard<std::mutex> g(n->mu);
  n->refs--;  // (never the last: the owner calls this)
}

// the loop's side: take the finished tokens and re-arm the eventfd; returns whether some were lost
inline bool drain(Notifier* n, std::vector<uint64_t>* out) {
  std::lock_guard<std::mutex> g(n->mu);
  out->swap(n->fired);
  n->fired.clear();
  n->signalled = false;
  uint64_t count;
  ssize_t r = read(n->fd, &count, sizeof(count));  // resets the counter (EAGAIN: nothing written)
  (void)r;
  bool lost = n->lost;
  n->lost = false;
  return lost;
}

// the owner lets go; a forked child only closes its copy of the descriptor (the parent's host
// functions never run in it, and the mutex may have been held at the fork)
inline void release(Notifier* n) {
  if (n->pid != getpid()) {
    close(n->fd);
    return;
  }
  bool last;
  {
    std::lock_guard<std::mutex> g(n->mu);
    last = --n->refs == 0;
  }
  if (last) destroy(n);
}

}  // namespace vyre_notify
