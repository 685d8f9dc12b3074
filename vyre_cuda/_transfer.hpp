// Host side of the transfer engine: copy threads and the ring's slot table. No CUDA here (the
// driver calls stay in Cython).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "_relax.h"

#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define VYRE_HAVE_STREAMING_STORES 1
#endif

namespace vyre {


// The ring pointer is published once, after its events exist: readers that find it set see them.
inline char* load_acquire(char** p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_release(char** p, char* v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// One copy of a job: src == nullptr means "zero n bytes at dst".
struct CopyTask {
    char* dst;
    const char* src;
    size_t n;
};

// Copy (src != nullptr) or zero n bytes with non-temporal stores: no read-for-ownership, no cache
// eviction (2 bytes of traffic per byte instead of 3). Ends with a store fence for the DMA engine.
inline void stream_copy(char* dst, const char* src, size_t n) {
#ifdef VYRE_HAVE_STREAMING_STORES
    if (n < 4096) {
        if (src) std::memcpy(dst, src, n);
        else std::memset(dst, 0, n);
        return;
    }
    size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
    if (src) std::memcpy(dst, src, head);
    else std::memset(dst, 0, head);
    dst += head;
    if (src) src += head;
    n -= head;
    size_t lines = n / 64;
    __m128i* d = reinterpret_cast<__m128i*>(dst);
    if (src) {
        const __m128i* s = reinterpret_cast<const __m128i*>(src);
        for (size_t i = 0; i < lines; ++i, d += 4, s += 4) {
            __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
            __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
            _mm_stream_si128(d, a);
            _mm_stream_si128(d + 1, b);
            _mm_stream_si128(d + 2, c);
            _mm_stream_si128(d + 3, e);
        }
    } else {
        const __m128i z = _mm_setzero_si128();
        for (size_t i = 0; i < lines; ++i, d += 4) {
            _mm_stream_si128(d, z);
            _mm_stream_si128(d + 1, z);
            _mm_stream_si128(d + 2, z);
            _mm_stream_si128(d + 3, z);
        }
    }
    size_t done = lines * 64;
    if (src) std::memcpy(dst + done, src + done, n - done);
    else std::memset(dst + done, 0, n - done);
    _mm_sfence();
#else
    if (src) std::memcpy(dst, src, n);
    else std::memset(dst, 0, n);
#endif
}

inline void run_task(const CopyTask& t, bool streaming = false) {
    if (streaming) stream_copy(t.dst, t.src, t.n);
    else if (t.src) std::memcpy(t.dst, t.src, t.n);
    else std::memset(t.dst, 0, t.n);
}

// Persistent worker threads that split one copy job at a time. A caller that finds the pool busy
// copies on its own thread instead of queueing (memory bandwidth is shared anyway).
class CopyPool {
  public:
    CopyPool() = default;
    CopyPool(const CopyPool&) = delete;
    CopyPool& operator=(const CopyPool&) = delete;
    ~CopyPool() { stop(); }

    // threads: extra threads beside the caller; min_split: bytes per participant below which
    // a job runs inline (thread wake-ups would cost more than they save).
    void configure(int threads, size_t min_split) {
        threads_ = threads < 0 ? 0 : threads;
        min_split_ = min_split ? min_split : 1;
        pieces_.reserve(4096);
    }

    int threads() const { return threads_; }
    int live_threads() const { return workers_ ? static_cast<int>(workers_->size()) : 0; }
    unsigned long long parallel_jobs() const { return parallel_jobs_.load(std::memory_order_relaxed); }

    // Copy every task; returns how many threads took part (1 = inline).
    int run(const CopyTask* tasks, size_t n_tasks, bool streaming = false) {
        int participants = start(tasks, n_tasks, streaming);
        finish(participants);
        return participants;
    }

    // Publish a copy job and return at once (the caller issues driver calls meanwhile); finish()
    // joins in and waits. Returns the threads taking part: 1 means it already ran inline and
    // finish(1) does nothing. No other job between start and finish. streaming: see stream_copy.
    int start(const CopyTask* tasks, size_t n_tasks, bool streaming = false) {
        size_t total = 0;
        for (size_t i = 0; i < n_tasks; ++i) total += tasks[i].n;
        size_t want = threads_ ? total / min_split_ : 0;
        if (want < 2 || !job_mutex_.try_lock()) {
            for (size_t i = 0; i < n_tasks; ++i) run_task(tasks[i], streaming);
            return 1;
        }
        if (!ensure_started()) {
            job_mutex_.unlock();
            for (size_t i = 0; i < n_tasks; ++i) run_task(tasks[i], streaming);
            return 1;
        }
        size_t participants = want < static_cast<size_t>(threads_) + 1 ? want : threads_ + 1;
        // several pieces per participant so a slow thread does not hold the job up
        size_t piece = total / (participants * 4);
        if (piece < (32u << 10)) piece = 32u << 10;
        piece = (piece + 4095) & ~static_cast<size_t>(4095);
        pieces_.clear();
        for (size_t i = 0; i < n_tasks; ++i) {
            const CopyTask& t = tasks[i];
            for (size_t off = 0; off < t.n; off += piece) {
                size_t n = t.n - off < piece ? t.n - off : piece;
                pieces_.push_back(CopyTask{t.dst + off, t.src ? t.src + off : nullptr, n});
            }
        }
        job_.pieces = pieces_.data();
        job_.count = pieces_.size();
        job_.streaming = streaming;
        job_.next.store(0, std::memory_order_relaxed);
        job_.done.store(0, std::memory_order_relaxed);
        current_.store(&job_, std::memory_order_seq_cst);
        {
            std::lock_guard<std::mutex> lk(wake_mutex_);
            generation_.fetch_add(1, std::memory_order_seq_cst);
        }
        wake_.notify_all();
        return static_cast<int>(participants);  // >= 2: want >= 2
    }

    void finish(int started) {
        if (started <= 1) return;
        work(&job_);
        while (job_.done.load(std::memory_order_acquire) < job_.count) vyre_cpu_relax();
        // a worker that woke late may still hold &job_: wait until none does
        current_.store(nullptr, std::memory_order_seq_cst);
        while (active_.load(std::memory_order_seq_cst) != 0) vyre_cpu_relax();
        parallel_jobs_.fetch_add(1, std::memory_order_relaxed);
        job_mutex_.unlock();
    }

    // Wake sleeping workers ahead of a job due within microseconds (first window pays no wake-up).
    void wake() {
        if (!workers_ || pid_ != getpid()) return;
        {
            std::lock_guard<std::mutex> lk(wake_mutex_);
            generation_.fetch_add(1, std::memory_order_seq_cst);
        }
        wake_.notify_all();
    }

    // Join every worker (idempotent). Called on close and from the destructor.
    void stop() {
        if (!workers_) return;
        if (pid_ != getpid()) {  // forked child: the threads do not exist here; forget them
            workers_ = nullptr;
            return;
        }
        {
            std::lock_guard<std::mutex> lk(wake_mutex_);
            running_.store(false, std::memory_order_seq_cst);
            generation_.fetch_add(1, std::memory_order_seq_cst);
        }
        wake_.notify_all();
        for (auto& t : *workers_) t.join();
        delete workers_;
        workers_ = nullptr;
    }

  private:
    struct Job {
        const CopyTask* pieces = nullptr;
        size_t count = 0;
        std::atomic<size_t> next{0};
        std::atomic<size_t> done{0};
        bool streaming = false;
    };

    static void work(Job* job) {
        for (;;) {
            size_t i = job->next.fetch_add(1, std::memory_order_relaxed);
            if (i >= job->count) return;
            run_task(job->pieces[i], job->streaming);
            job->done.fetch_add(1, std::memory_order_release);
        }
    }

    bool ensure_started() {
        if (workers_ && pid_ == getpid()) return true;
        if (workers_) workers_ = nullptr;  // forked child: leak the parent's handles, start afresh
        pid_ = getpid();
        running_.store(true);
        auto* ws = new std::vector<std::thread>();
        // the generation as of now, not as of when each thread first runs: a wake() or stop()
        // between the two would otherwise be missed, and stop() would wait forever in join()
        unsigned long long born = generation_.load(std::memory_order_seq_cst);
        try {
            for (int i = 0; i < threads_; ++i) ws->emplace_back([this, born] { worker_main(born); });
        } catch (...) {
            workers_ = ws;
            stop();
            return false;
        }
        workers_ = ws;
        return true;
    }

    void worker_main(unsigned long long seen) {
        for (;;) {
            // The next window usually comes within microseconds, sooner than a sleeping thread
            // wakes (tens of us in a VM): spin, then yield for a while, only then sleep.
            auto start = std::chrono::steady_clock::now();
            while (generation_.load(std::memory_order_acquire) == seen) {
                auto waited = std::chrono::steady_clock::now() - start;
                if (waited < std::chrono::microseconds(spin_us_)) {
                    for (int k = 0; k < 64; ++k) vyre_cpu_relax();
                } else if (waited < std::chrono::microseconds(yield_us_)) {
                    std::this_thread::yield();
                } else {
                    break;
                }
            }
            if (generation_.load(std::memory_order_acquire) == seen) {
                std::unique_lock<std::mutex> lk(wake_mutex_);
                wake_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
            }
            seen = generation_.load(std::memory_order_acquire);
            if (!running_.load(std::memory_order_acquire)) return;
            active_.fetch_add(1, std::memory_order_seq_cst);
            Job* job = current_.load(std::memory_order_seq_cst);
            if (job) work(job);
            active_.fetch_sub(1, std::memory_order_seq_cst);
        }
    }

    int threads_ = 0;
    size_t min_split_ = 256u << 10;
    int spin_us_ = 50;
    int yield_us_ = 2000;
    std::vector<std::thread>* workers_ = nullptr;
    pid_t pid_ = 0;
    std::mutex job_mutex_;
    std::mutex wake_mutex_;
    std::condition_variable wake_;
    std::atomic<bool> running_{false};
    std::atomic<unsigned long long> generation_{0};
    std::atomic<Job*> current_{nullptr};
    std::atomic<int> active_{0};
    std::atomic<unsigned long long> parallel_jobs_{0};
    Job job_;
    std::vector<CopyTask> pieces_;
};

// Which ring slots are free, least recently released first (likeliest done). A holder never
// blocks in acquire() while it holds an undrained slot, so holders always make progress.
class SlotTable {
  public:
    void reset(int n) {
        std::lock_guard<std::mutex> lk(m_);
        free_.clear();
        for (int i = 0; i < n; ++i) free_.push_back(i);
        size_ = n;
    }
    int size() const { return size_; }

    int try_acquire() {
        std::lock_guard<std::mutex> lk(m_);
        if (free_.empty()) return -1;
        int k = free_.front();
        free_.pop_front();
        return k;
    }

    int acquire() {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return !free_.empty(); });
        int k = free_.front();
        free_.pop_front();
        return k;
    }

    void release(int k) {
        {
            std::lock_guard<std::mutex> lk(m_);
            free_.push_back(k);
        }
        cv_.notify_one();
    }

    int free_count() {
        std::lock_guard<std::mutex> lk(m_);
        return static_cast<int>(free_.size());
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<int> free_;
    int size_ = 0;
};

// Orders one module's cooperative launches on the GPU (see CoopGate in _launch.pyx).
class CoopOrder {
  public:
    void lock() { m_.lock(); }
    void unlock() { m_.unlock(); }
    void* last = nullptr;   // CUevent recorded after the module's latest cooperative launch
    bool recorded = false;  // whether `last` has been recorded at least once

  private:
    std::mutex m_;
};

}  // namespace vyre
