// Host stand-in for vyre_cuda.cuh (tests only): lets a generated kernel (tests/fuzz_programs.py)
// compile as C++ and run on the CPU as ONE thread of ONE block. With one thread, grid-stride
// loops visit every element in order, the block's shared-memory fill completes before it is
// read, and the grid barrier has nothing to wait for, so the result is the kernel's result.
// The ABI accessors follow the documented params block exactly like the real header.
#pragma once
#include <cstdint>
#include <cstring>

#define VYRE_KERNEL extern "C" void
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

#ifndef VYRE_PHASE_WORD
#define VYRE_PHASE_WORD 0xFFFFFFFFu
#endif

typedef unsigned int vyre_u32;
typedef unsigned long long vyre_u64;

struct vyre_host_dim3 {
  unsigned int x, y, z;
};
static const vyre_host_dim3 threadIdx = {0u, 0u, 0u};
static const vyre_host_dim3 blockIdx = {0u, 0u, 0u};
static const vyre_host_dim3 blockDim = {1u, 1u, 1u};
static const vyre_host_dim3 gridDim = {1u, 1u, 1u};

inline vyre_u32 vyre_count(const vyre_u32* params) { return params[0]; }
inline vyre_u32 vyre_binding_count(const vyre_u32* params, vyre_u32 binding) { return params[binding + 1u]; }
inline vyre_u32 vyre_phase_begin(const vyre_u32* params) {
  return VYRE_PHASE_WORD == 0xFFFFFFFFu ? 0u : params[VYRE_PHASE_WORD];
}
inline vyre_u32 vyre_phase_end(const vyre_u32* params) {
  return VYRE_PHASE_WORD == 0xFFFFFFFFu ? 1u : params[VYRE_PHASE_WORD + 1u];
}
inline vyre_u64 vyre_global_id() { return 0u; }
inline vyre_u64 vyre_global_threads() { return 1u; }

alignas(16) static unsigned char vyre_host_shared[232448];
template <typename T>
inline T* vyre_shared(unsigned int byte_offset = 0u) {
  return reinterpret_cast<T*>(vyre_host_shared + byte_offset);
}

inline void __syncthreads() {}
inline void vyre_grid_sync() {}

template <typename T>
inline T __ldcg(const T* p) { return *p; }

inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline long long __double_as_longlong(double d) { long long x; std::memcpy(&x, &d, 8); return x; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
