// The few atomic operations the core's shared fields use (GCC/Clang builtins), so that no field two
// threads reach relies on the GIL: a dispatch's state, a backend's counts of calls, handles and
// deferred work, and the telemetry counters. Sequentially consistent where two fields are read
// against each other (close(): `closed` against `busy`); relaxed for counters only ever summed.
#pragma once

namespace vyre {

inline int load(const int* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
inline void store(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
// p: from `expected` to `desired`, once: true for the one caller that made the change
inline bool cas(int* p, int expected, int desired) {
  return __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
inline long long add(long long* p, long long v) { return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
inline long long loadll(const long long* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
// telemetry: each counter is only ever added to and read as a whole
inline void count(unsigned long long* p, unsigned long long v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long read(const unsigned long long* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void clear(unsigned long long* p) { __atomic_store_n(p, 0ULL, __ATOMIC_RELAXED); }

}  // namespace vyre
