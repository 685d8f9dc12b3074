// vyre_cuda device header: the kernel ABI's accessors and the grid barrier.
//
// ABI: the entry receives one `unsigned long long` device pointer per non-workgroup binding, in
// binding-number order, then a pointer to a u32 params block:
//   word 0            launch element count: DispatchConfig(elements=N), else the binding named
//                     by Program(launch=...) (or its callable's value), else grid.x * block.x
//                     under a grid_override, else the largest output (the largest binding when
//                     the program has workgroup buffers or no outputs)
//   word binding + 1  that binding's element count (a runtime-sized buffer's actual count,
//                     so a kernel can bound-check every buffer with vyre_in_bounds)
//   VYRE_PHASE_WORD   phase_begin, then phase_end (grid-sync programs only)
// The block starts 16-byte aligned and is zero-padded to a multiple of 16 bytes.
// The backend defines VYRE_PHASE_WORD (= max binding + 2) when it compiles a program's kernel.
#pragma once

#define VYRE_KERNEL extern "C" __global__ void

#ifndef VYRE_PHASE_WORD
#define VYRE_PHASE_WORD 0xFFFFFFFFu
#endif

typedef unsigned int vyre_u32;
typedef unsigned long long vyre_u64;

// Module-global grid barrier counter; the backend zeroes it before every launch.
extern "C" __device__ unsigned int _vyre_grid_barrier;
extern "C" __device__ unsigned int _vyre_grid_barrier = 0u;

__device__ __forceinline__ vyre_u32 vyre_count(const vyre_u32* params) { return params[0]; }

__device__ __forceinline__ vyre_u32 vyre_binding_count(const vyre_u32* params, vyre_u32 binding) {
  return params[binding + 1u];
}

// Whether element i exists in `binding`: i < its own element count (word binding + 1). Check
// every buffer a thread touches, so a launch larger than a buffer never reads or writes past it.
__device__ __forceinline__ bool vyre_in_bounds(const vyre_u32* params, vyre_u32 binding, vyre_u64 i) {
  return i < (vyre_u64)params[binding + 1u];
}

// Words 0-3 (the launch count, then the counts of bindings 0, 1 and 2) in one 16-byte load through
// the read-only cache: one memory access before a kernel's first bounds check instead of four
// (words past the block's last binding read as 0).
__device__ __forceinline__ uint4 vyre_params_head(const vyre_u32* params) {
  return __ldg(reinterpret_cast<const uint4*>(params));
}

__device__ __forceinline__ vyre_u32 vyre_phase_begin(const vyre_u32* params) {
  return VYRE_PHASE_WORD == 0xFFFFFFFFu ? 0u : params[VYRE_PHASE_WORD];
}

__device__ __forceinline__ vyre_u32 vyre_phase_end(const vyre_u32* params) {
  return VYRE_PHASE_WORD == 0xFFFFFFFFu ? 1u : params[VYRE_PHASE_WORD + 1u];
}

// Global linear thread index (1-D grid of 1-D blocks, the common case).
__device__ __forceinline__ vyre_u64 vyre_global_id() {
  return (vyre_u64)blockIdx.x * blockDim.x + threadIdx.x;
}

// Total threads in a 1-D launch, for grid-stride loops.
__device__ __forceinline__ vyre_u64 vyre_global_threads() {
  return (vyre_u64)gridDim.x * blockDim.x;
}

// Dynamic shared memory: workgroup buffers in binding order, each at its own offset.
template <typename T>
__device__ __forceinline__ T* vyre_shared(unsigned int byte_offset = 0u) {
  extern __shared__ __align__(16) unsigned char _vyre_dynamic_smem[];
  return reinterpret_cast<T*>(_vyre_dynamic_smem + byte_offset);
}

// Grid-wide barrier. Valid only in a cooperative launch (all blocks co-resident), which the
// backend guarantees for grid_sync programs routed cooperatively. Every block's leader adds one
// arrival; the k-th barrier completes when the counter reaches (k + 1) * gridBlocks. Arrivals of
// barrier k + 1 cannot start before barrier k completed, so the target follows from the old value.
__device__ __forceinline__ void vyre_grid_sync() {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    __threadfence();
    const unsigned int old = atomicAdd(&_vyre_grid_barrier, 1u);
    const unsigned int target = (old / blocks + 1u) * blocks;
    volatile unsigned int* counter = &_vyre_grid_barrier;
    while (*counter < target) {
      __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}
