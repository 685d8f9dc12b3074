// Persistent host-copy threads for the floor's memcpy ceilings (vyre_cuda/profile/_floor.pyx).
//
// A CopyTeam splits a fixed list of copies into equal byte shares, starts one std::thread per
// share once, then runs any number of passes: each pass releases every thread, each copies its
// share, and run() returns when all are done. Threads are started once per measurement, never
// per copy: starting threads per chunk costs more than the copy gains (measured on the H200).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace vyre_floor {

struct CopySpan {
  char* dst;
  const char* src;
  size_t len;
};

// Shares start on this boundary so that two threads never write the same cache line.
constexpr size_t kShareAlign = 64;

inline void relax(unsigned& spins) noexcept {
  // Spin briefly (a pass of a small copy is microseconds), then yield the core.
  if (++spins < 256) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else {
    std::this_thread::yield();
  }
}

class CopyTeam {
 public:
  CopyTeam() = default;
  ~CopyTeam() { stop(); }
  CopyTeam(const CopyTeam&) = delete;
  CopyTeam& operator=(const CopyTeam&) = delete;

  // Plan `count` copies (dst[i] <- src[i], len[i] bytes) split over `threads` threads.
  // Returns 0, or -1 when memory for the plan could not be allocated.
  int plan(char* const* dst, const char* const* src, const size_t* len, int count,
           int threads) noexcept {
    stop();
    try {
      shares_.assign(static_cast<size_t>(threads), std::vector<CopySpan>());
      size_t total = 0;
      for (int i = 0; i < count; ++i) total += len[i];
      size_t job = 0;
      size_t offset = 0;  // within job
      size_t begin = 0;
      for (size_t t = 0; t < shares_.size(); ++t) {
        size_t end = (t + 1 == shares_.size())
                         ? total
                         : total / shares_.size() * (t + 1) / kShareAlign * kShareAlign;
        if (end < begin) end = begin;
        size_t need = end - begin;
        while (need > 0 && job < static_cast<size_t>(count)) {
          size_t left = len[job] - offset;
          if (left == 0) {
            ++job;
            offset = 0;
            continue;
          }
          size_t take = left < need ? left : need;
          shares_[t].push_back(CopySpan{dst[job] + offset, src[job] + offset, take});
          offset += take;
          need -= take;
        }
        begin = end;
      }
    } catch (...) {
      shares_.clear();
      return -1;
    }
    return 0;
  }

  // Start one thread per share. Returns 0, or -1 when a thread could not be started (the
  // threads already started are joined).
  int start() noexcept {
    stop();
    stopping_.store(false, std::memory_order_relaxed);
    generation_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    try {
      pool_.reserve(shares_.size());
      for (size_t i = 0; i < shares_.size(); ++i) pool_.emplace_back(&CopyTeam::work, this, i);
    } catch (...) {
      stop();
      return -1;
    }
    return 0;
  }

  // One pass over every share; returns when all threads have finished theirs.
  void run() noexcept {
    done_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    unsigned spins = 0;
    while (done_.load(std::memory_order_acquire) != pool_.size()) relax(spins);
  }

  // Join every thread (safe to call twice).
  void stop() noexcept {
    if (pool_.empty()) return;
    stopping_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    for (std::thread& t : pool_) {
      if (t.joinable()) t.join();
    }
    pool_.clear();
  }

  size_t threads() const noexcept { return pool_.size(); }

 private:
  void work(size_t index) noexcept {
    unsigned long seen = 0;
    for (;;) {
      unsigned spins = 0;
      unsigned long now;
      while ((now = generation_.load(std::memory_order_acquire)) == seen) relax(spins);
      seen = now;
      if (stopping_.load(std::memory_order_relaxed)) return;
      for (const CopySpan& s : shares_[index]) std::memcpy(s.dst, s.src, s.len);
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::vector<CopySpan>> shares_;
  std::vector<std::thread> pool_;
  std::atomic<unsigned long> generation_{0};
  std::atomic<size_t> done_{0};
  std::atomic<bool> stopping_{false};
};

// The clock of the timed loops: the core's (vyre_cuda._driver.now_ns), passed in.
typedef unsigned long long (*Clock)(void);

// Copy every job (dst[i] <- src[i], len[i] bytes) warmup + iterations times, writing the ns of
// each timed pass to out[]. One thread copies in the calling thread (no hand-off); more start
// a CopyTeam once for all passes. Returns 0, or -1 when the threads could not be started.
inline int timed_copies(char* const* dst, const char* const* src, const size_t* len, int count,
                        int threads, long long iterations, long long warmup, int64_t* out,
                        Clock clock) noexcept {
  CopyTeam team;
  if (threads > 1 && (team.plan(dst, src, len, count, threads) != 0 || team.start() != 0)) {
    return -1;
  }
  for (long long i = 0; i < warmup + iterations; ++i) {
    unsigned long long t0 = clock();
    if (threads > 1) {
      team.run();
    } else {
      for (int j = 0; j < count; ++j) std::memcpy(dst[j], src[j], len[j]);
    }
    if (i >= warmup) out[i - warmup] = static_cast<int64_t>(clock() - t0);
  }
  return 0;
}

}  // namespace vyre_floor
