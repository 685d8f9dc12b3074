// Host side of graph replay: the instantiated graph execs of one prepared dispatch.
//
// No CUDA here (handles are void*): the driver calls stay in Cython over cydriver. An exec is
// keyed by the exact kernel-argument values its launches were captured with (every buffer
// pointer, then the slab the params pointers derive from), since a graph bakes its parameters in.
#pragma once

#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

namespace vyre {

class GraphCache {
  public:
    explicit GraphCache(size_t capacity) : capacity_(capacity ? capacity : 1) {}
    GraphCache(const GraphCache&) = delete;
    GraphCache& operator=(const GraphCache&) = delete;

    // CUDA graph objects are not thread-safe: every use of an exec (lookup, capture, update,
    // launch) happens under this lock.
    void lock() { m_.lock(); }
    void unlock() { m_.unlock(); }

    // the entry captured with exactly key[0..n), marked most recently used; -1 when none
    long find(const unsigned long long* key, size_t n) {
        for (size_t i = 0; i < entries_.size(); ++i) {
            Entry& e = entries_[i];
            if (e.key.size() == n && std::memcmp(e.key.data(), key, n * sizeof(*key)) == 0) {
                e.tick = ++tick_;
                return static_cast<long>(i);
            }
        }
        return -1;
    }
    void* exec(long i) const { return entries_[static_cast<size_t>(i)].exec; }
    bool full() const { return entries_.size() >= capacity_; }
    size_t size() const { return entries_.size(); }

    // the least recently used entry (the cache is not empty)
    long oldest() const {
        size_t best = 0;
        for (size_t i = 1; i < entries_.size(); ++i)
            if (entries_[i].tick < entries_[best].tick) best = i;
        return static_cast<long>(best);
    }
    void rekey(long i, const unsigned long long* key, size_t n) {
        Entry& e = entries_[static_cast<size_t>(i)];
        e.key.assign(key, key + n);
        e.tick = ++tick_;
    }
    void insert(const unsigned long long* key, size_t n, void* exec) {
        Entry e;
        e.key.assign(key, key + n);
        e.exec = exec;
        e.tick = ++tick_;
        entries_.push_back(e);
    }
    void remove(long i) { entries_.erase(entries_.begin() + i); }

    // Every exec, removed from the cache: the caller destroys them (or forgets them when their
    // context is gone). After this the cache stays closed: nothing is captured again.
    std::vector<void*> take_all() {
        std::vector<void*> out;
        for (const Entry& e : entries_) out.push_back(e.exec);
        entries_.clear();
        closed = true;
        return out;
    }

    // A private non-blocking stream to capture on when the dispatch runs on a caller's stream:
    // capturing a caller's (possibly blocking) stream would make other threads' legacy-stream
    // work fail while the capture lasts. Created at the first such capture, destroyed with the
    // execs (take_capture_stream).
    void* capture_stream = nullptr;
    void* take_capture_stream() {
        void* s = capture_stream;
        capture_stream = nullptr;
        return s;
    }

    bool disabled = false;  // capture or instantiation failed once: this plan issues its launches
    bool closed = false;    // released with its module or backend: never captures again

  private:
    struct Entry {
        std::vector<unsigned long long> key;
        void* exec = nullptr;
        unsigned long long tick = 0;
    };
    std::mutex m_;
    std::vector<Entry> entries_;
    size_t capacity_;
    unsigned long long tick_ = 0;
};

}  // namespace vyre
