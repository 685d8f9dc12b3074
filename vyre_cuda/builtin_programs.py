"""Built-in programs: the profiling harness's vecadd, and the self-test's kernels.

Each call returns a :class:`~vyre_cuda.Program` equal to an earlier call's, so their dispatches share one plan.
"""

from __future__ import annotations

from .errors import InvalidProgram
from .program import DTYPES, BufferDecl, Kernel, Program, dtype_of

__all__ = ["vecadd", "vecadd_f32", "block_sum_u32", "inclusive_scan_u32", "params_echo", "SELFTEST"]

_VECADD = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const T* a, const T* b, T* out, const vyre_u32* params) {
  const vyre_u64 i = vyre_global_id();
  // the launch count and a's, b's and out's counts in one load: every buffer is checked against
  // its own count, so no launch size reads past a shorter one; every element of `out` the launch
  // reaches is written (the sum, or zero past a shorter input, as a cleared output would read),
  // so `out` is declared zeroed=False: no clearing pass first
  const uint4 n = vyre_params_head(params);
  if (i < n.x && i < n.w) {
    out[i] = (i < n.y && i < n.z) ? T(a[i] + b[i]) : T(0.0f);
  }
}
"""

_CTYPES = {
    "u8": "unsigned char",
    "i8": "signed char",
    "u16": "unsigned short",
    "i16": "short",
    "u32": "unsigned int",
    "i32": "int",
    "f32": "float",
    "u64": "unsigned long long",
    "i64": "long long",
    "f64": "double",
    "f16": "__half",
    "bf16": "__nv_bfloat16",
}
_PRELUDES = {"f16": "#include <cuda_fp16.h>\n", "bf16": "#include <cuda_bf16.h>\n"}
# made once: a program built again passes the same str (hash kept, its kernel found without comparing text)
_VECADD_SOURCES = {name: _PRELUDES.get(name, "") + f"typedef {c} T;\n" + _VECADD for name, c in _CTYPES.items()}


def vecadd(dtype="f32", workgroup: int = 256) -> Program:
    """``out[i] = a[i] + b[i]`` over runtime-sized buffers of ``dtype``.

    The kernel writes every element of ``out`` it is launched over (zero past a shorter input), so
    ``out`` is declared ``zeroed=False``: no clearing pass; elements past a smaller
    ``DispatchConfig(elements=...)`` are left as they were. ``dtype`` is any of the twelve names
    (``"f32"``, ``"bf16"``, ...), an alias such as ``"float32"`` or ``"half"``, or a numpy dtype;
    f16 and bf16 need the CUDA runtime headers (``pip install nvidia-cuda-runtime``).

    >>> vecadd("float32").name, vecadd("bf16").buffers[2].dtype
    ('vecadd_f32', DType(bf16))
    """
    try:
        d = dtype_of(dtype)
    except InvalidProgram:
        raise InvalidProgram(
            f"vecadd has no element type {dtype!r}",
            f"use one of {', '.join(DTYPES)}, an alias such as 'float32', 'half' or 'bfloat16', "
            "or the matching numpy dtype",
        ) from None
    source = _VECADD_SOURCES[d.name]
    return Program(
        Kernel.cuda(source),
        [BufferDecl.read("a", 0, d), BufferDecl.read("b", 1, d), BufferDecl.output("out", 2, d, zeroed=False)],
        workgroup_size=(workgroup, 1, 1),
        name=f"vecadd_{d.name}",
    )


_VECADD_F32 = _VECADD_SOURCES["f32"]


def vecadd_f32() -> Program:
    """The harness's default program, equal to ``vecadd("f32")`` (the two share one cached plan)."""
    # spelled out with constant arguments: the profile's rebuilt-program row calls this per dispatch
    # to measure the constructors' remembered calls, not the generic factory's dtype resolution
    return Program(
        Kernel.cuda(_VECADD_F32),
        [
            BufferDecl.read("a", 0, "f32"),
            BufferDecl.read("b", 1, "f32"),
            BufferDecl.output("out", 2, "f32", zeroed=False),
        ],
        workgroup_size=(256, 1, 1),
        name="vecadd_f32",
    )


_BLOCK_SUM = r"""
#include "vyre_cuda.cuh"
// One partial sum per block, reduced in dynamic shared memory (the workgroup buffer `scratch`).
// Any block size works with any scratch size: slot s sums the block's elements s, s + S, ...
VYRE_KERNEL vyre_main(const vyre_u32* x, vyre_u32* sums, const vyre_u32* params) {
  vyre_u32* scratch = vyre_shared<vyre_u32>();
  const vyre_u32 n = vyre_binding_count(params, 0);
  const vyre_u32 slots = min(blockDim.x, vyre_binding_count(params, 2));
  const vyre_u64 base = (vyre_u64)blockIdx.x * blockDim.x;
  if (threadIdx.x < slots) {
    vyre_u32 acc = 0u;
    for (vyre_u32 t = threadIdx.x; t < blockDim.x; t += slots) {
      if (base + t < n) acc += x[base + t];
    }
    scratch[threadIdx.x] = acc;
  }
  __syncthreads();
  for (vyre_u32 width = slots; width > 1u;) {
    const vyre_u32 half = (width + 1u) / 2u;
    if (threadIdx.x < width - half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
    width = half;
  }
  if (threadIdx.x == 0 && vyre_in_bounds(params, 1, blockIdx.x)) sums[blockIdx.x] = scratch[0];
}
"""


def block_sum_u32(n_blocks: int, workgroup: int = 256, scratch_elems: int | None = None) -> Program:
    """Per-block sums of a u32 input of ``n_blocks * workgroup`` elements, through a workgroup
    buffer (``scratch_elems`` u32 of shared memory, default one per thread; any size works)."""
    scratch = scratch_elems or workgroup
    return Program(
        Kernel.cuda(_BLOCK_SUM),
        [
            BufferDecl.read("x", 0, "u32", n_blocks * workgroup),
            BufferDecl.output("sums", 1, "u32", n_blocks),
            BufferDecl.workgroup("scratch", 2, "u32", scratch),
        ],
        workgroup_size=(workgroup, 1, 1),
        name="block_sum_u32",
        launch="x",
    )


_SCAN = r"""
#include "vyre_cuda.cuh"
// Inclusive prefix sum in three phases separated by grid barriers:
//   0: scan each tile of blockDim.x elements, record tile totals;
//   1: block 0 scans the tile totals;
//   2: add the preceding tiles' total to every element.
// Tiles are visited grid-stride, so any grid size works (one launch per phase when host-split).
__device__ vyre_u32 block_scan(vyre_u32 v, vyre_u32* warp_sums) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = (blockDim.x + 31u) >> 5;
  for (unsigned o = 1; o < 32; o <<= 1) {
    const vyre_u32 t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += t;
  }
  if (lane == 31u) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    vyre_u32 w = lane < warps ? warp_sums[lane] : 0u;
    for (unsigned o = 1; o < 32; o <<= 1) {
      const vyre_u32 t = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += t;
    }
    if (lane < warps) warp_sums[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += warp_sums[warp - 1];
  __syncthreads();
  return v;
}

VYRE_KERNEL vyre_main(const vyre_u32* x, vyre_u32* y, vyre_u32* tile_sums, const vyre_u32* params) {
  __shared__ vyre_u32 warp_sums[32];
  // each buffer bounded by its own count: x and y by the shorter of the two, tiles by tile_sums
  const vyre_u32 n = min(vyre_binding_count(params, 0), vyre_binding_count(params, 1));
  const vyre_u32 tiles = min((n + blockDim.x - 1u) / blockDim.x, vyre_binding_count(params, 2));
  const vyre_u32 end = vyre_phase_end(params);
  for (vyre_u32 ph = vyre_phase_begin(params); ph < end; ++ph) {
    if (ph == 0) {
      for (vyre_u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        const vyre_u64 i = (vyre_u64)t * blockDim.x + threadIdx.x;
        vyre_u32 v = i < n ? x[i] : 0u;
        v = block_scan(v, warp_sums);
        if (i < n) y[i] = v;
        if (threadIdx.x == blockDim.x - 1u) tile_sums[t] = v;
      }
    } else if (ph == 1) {
      if (blockIdx.x == 0) {
        const vyre_u32 chunk = (tiles + blockDim.x - 1u) / blockDim.x;
        const vyre_u32 lo = min(tiles, threadIdx.x * chunk), hi = min(tiles, lo + chunk);
        vyre_u32 local = 0;
        for (vyre_u32 t = lo; t < hi; ++t) local += __ldcg(&tile_sums[t]);
        const vyre_u32 before = block_scan(local, warp_sums) - local;
        vyre_u32 run = before;
        for (vyre_u32 t = lo; t < hi; ++t) {
          run += __ldcg(&tile_sums[t]);
          tile_sums[t] = run;
        }
      }
    } else {
      for (vyre_u32 t = blockIdx.x + 1u; t < tiles; t += gridDim.x) {
        const vyre_u64 i = (vyre_u64)t * blockDim.x + threadIdx.x;
        if (i < n) y[i] += __ldcg(&tile_sums[t - 1]);
      }
    }
    if (ph + 1 < end) vyre_grid_sync();
  }
}
"""


def inclusive_scan_u32(workgroup: int = 256) -> Program:
    """Inclusive prefix sum of a runtime-sized u32 input: a 3-phase grid-sync program.

    Outputs ``y`` (the scan) and ``tile_sums`` (scratch: scanned per-tile totals).
    """
    return Program(
        Kernel.cuda(_SCAN),
        [BufferDecl.read("x", 0, "u32"), BufferDecl.output("y", 1, "u32"), BufferDecl.output("tile_sums", 2, "u32")],
        workgroup_size=(workgroup, 1, 1),
        grid_sync=True,
        phases=3,
        name="inclusive_scan_u32",
    )


_PARAMS_ECHO = r"""
#include "vyre_cuda.cuh"
// Copies the params block the kernel received into `words`, so tests can see the ABI.
VYRE_KERNEL vyre_main(const vyre_u32* a, vyre_u32* words, const vyre_u32* params) {
  const vyre_u64 i = vyre_global_id();
  if (i < WORDS && vyre_in_bounds(params, 5, i)) words[i] = params[i];
}
"""


def params_echo(a_count: int = 0, words: int = 8) -> Program:
    """Echo the first ``words`` params words (ABI introspection); the launch covers ``words``."""
    return Program(
        Kernel.cuda(f"#define WORDS {words}\n" + _PARAMS_ECHO),
        [BufferDecl.read("a", 0, "u32", a_count), BufferDecl.output("words", 5, "u32", words)],
        workgroup_size=(32, 1, 1),
        name="params_echo",
        launch="words",
    )


SELFTEST = ("vecadd_f32", "vecadd_i64", "block_sum_u32", "inclusive_scan_u32")
