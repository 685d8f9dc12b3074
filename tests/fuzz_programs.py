"""Random vyre_cuda programs for differential fuzzing: one description, two implementations.

:func:`generate` builds a :class:`ProgramDesc` from a seed: 1 to 6 buffers of every access kind
(read, uniform, read_write, write_only, output, workgroup), dtypes u8..f64 including f16 and bf16
(carried as uint16 bits), static and runtime sizes (0, 1, odd, large), element-aligned output byte
ranges, grid sync with 1 to 4 phases, and optionally an ``echo`` buffer that receives the params
block the kernel saw. From the same description come

* :func:`cuda_source` / :func:`build_program`: CUDA C++ using the ``vyre_cuda.cuh`` accessors,
  each buffer bound-checked with its own element count (``vyre_binding_count``), grid-stride
  loops (so any launch size is correct), ``vyre_grid_sync()`` between phases;
* :func:`reference`: a numpy model of a whole dispatch (fixpoint iterations x phases), and
  :func:`apply_launch`, the same model of one launch, run in place on arrays (the CPU profile uses
  it to emulate the kernel on the fake driver, reading the counts from the params block).

The arithmetic is chosen so both sides are exactly equal: integer targets accumulate the *bits*
of their sources in wrapping u64 arithmetic; float targets accumulate in double precision in a
fixed order with no fused multiply-add (the kernel is compiled with ``--fmad=false``), values stay
far from overflow, and the final rounding (f32, f16, bf16 round-to-nearest-even) is done the same
way on both sides. Comparisons still use dtype tolerances for floats (:func:`compare`).

Formulas, for target ``t`` element ``i`` (``old`` = its current value):

* integer ``t``: ``acc = Z + M*ib(old) + sum_r A_r*ib(r[(i+S_r) % n_r]) + sum_g B_g*ib(tbl_g[(13i+5) % c_g])
  + i*0x9E3779B1 [+ Q*ib(u[(i+H) % n_u])] + (ph+1)*0x51`` (mod 2**64), stored truncated;
* float ``t``: ``acc = Z + 0.5*fv(old) + sum_r A_r*fv(r[...]) + sum_g B_g*(ib(tbl)&255) + i%17
  [+ 0.25*fv(u[...])] + (ph+1)``, stored rounded to the target dtype;

where ``ib`` is the source's bits (sign-extended for signed integers), ``fv`` its value for floats
and ``ib & 255`` for integers, ``tbl_g[k] = k*7+3`` (in the workgroup buffer's dtype) is filled in
shared memory by every block, and ``u`` is the previous phase's target (grid-sync programs only:
phase ``p`` writes ``W[p % m]`` from ``W[(p-1) % m]``, read with ``__ldcg`` across the barrier).
A program without grid sync updates every writable buffer once per launch from the read-only
inputs only, so no thread reads what another writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vyre_cuda import BufferDecl, Kernel, Program
from vyre_cuda.program import DTYPES

__all__ = [
    "Buf",
    "DispatchPlan",
    "ProgramDesc",
    "apply_launch",
    "build_program",
    "compare",
    "cuda_source",
    "expected_words",
    "generate",
    "launch_count",
    "make_inputs",
    "plan_dispatch",
    "reference",
]

DTYPE_NAMES = ("u8", "i8", "u16", "i16", "f16", "bf16", "u32", "i32", "f32", "u64", "i64", "f64")
TABLE_DTYPES = ("u8", "i16", "u32", "i32", "u64", "f32", "f64")
INPUT_KINDS = ("read", "uniform", "read_write")
OUTPUT_KINDS = ("read_write", "write_only", "output")
FLOATS = ("f16", "bf16", "f32", "f64")
SIGNED = ("i8", "i16", "i32", "i64")
UNSIGNED_C = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
UNSIGNED_NP = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
CTYPE = {
    "u8": "unsigned char",
    "i8": "signed char",
    "u16": "unsigned short",
    "i16": "short",
    "f16": "__half",
    "bf16": "unsigned short",
    "u32": "unsigned int",
    "i32": "int",
    "f32": "float",
    "u64": "unsigned long long",
    "i64": "long long",
    "f64": "double",
}
GOLDEN = 0x9E3779B1
PHASE_SALT = 0x51
KERNEL_OPTIONS = ("--fmad=false", "--ftz=false")
MASK64 = (1 << 64) - 1


def itemsize(dtype: str) -> int:
    return DTYPES[dtype].itemsize


# ---------------------------------------------------------------------------------- description
@dataclass(frozen=True)
class Buf:
    """One buffer of a generated program and its constants in the formulas."""

    name: str
    binding: int
    kind: str  # read, uniform, read_write, write_only, output, workgroup, echo
    dtype: str
    count: int  # elements; 0 = runtime-sized
    byte_range: tuple | None = None  # element-aligned (start, end) bytes, writable buffers only
    alignment: int | None = None
    coef: int = 1  # A_r (inputs), M (integer targets), B_g (tables)
    shift: int = 0  # S_r (inputs), H (phase source offset, targets)
    salt: int = 1  # Z (targets)
    src_coef: int = 1  # Q (integer targets reading the previous phase's target)

    @property
    def is_input(self) -> bool:
        return self.kind in INPUT_KINDS

    @property
    def is_target(self) -> bool:
        """A buffer the formulas write (every writable buffer but the echo)."""
        return self.kind in OUTPUT_KINDS

    @property
    def is_output(self) -> bool:
        return self.kind in OUTPUT_KINDS or self.kind == "echo"

    @property
    def is_workgroup(self) -> bool:
        return self.kind == "workgroup"

    @property
    def ident(self) -> str:
        return f"b{self.binding}"


@dataclass(frozen=True)
class ProgramDesc:
    """A generated program: its buffers (declaration order) and launch shape."""

    seed: int
    buffers: tuple
    block: int
    grid_sync: bool = False
    phases: int = 1
    min_runtime: int = 0  # every dispatch's runtime count is >= this (byte ranges on runtime buffers)
    launch: str | None = None  # Program(launch=...) when the installed vyre_cuda supports it
    name: str = field(default="")

    @property
    def targets(self) -> list:
        return [b for b in self.buffers if b.is_target]

    @property
    def reads(self) -> list:
        """Read-only inputs (read, uniform): the sources of every formula."""
        return [b for b in self.buffers if b.kind in ("read", "uniform")]

    @property
    def tables(self) -> list:
        return sorted((b for b in self.buffers if b.is_workgroup), key=lambda b: b.binding)

    @property
    def args(self) -> list:
        """Kernel arguments: non-workgroup buffers in binding order."""
        return sorted((b for b in self.buffers if not b.is_workgroup), key=lambda b: b.binding)

    @property
    def inputs(self) -> list:
        return [b for b in self.buffers if b.is_input]

    @property
    def outputs(self) -> list:
        return [b for b in self.buffers if b.is_output]

    @property
    def echo(self):
        return next((b for b in self.buffers if b.kind == "echo"), None)

    @property
    def max_binding(self) -> int:
        return max(b.binding for b in self.buffers)

    @property
    def words(self) -> int:
        """u32 words of the params block the kernel reads (phase words included)."""
        return self.max_binding + 2 + (2 if self.grid_sync else 0)

    def shared_offsets(self) -> dict:
        """Byte offset of each workgroup buffer in dynamic shared memory: binding order, 16-aligned."""
        offsets, end = {}, 0
        for b in self.tables:
            end = -(-end // 16) * 16
            offsets[b.binding] = end
            end += b.count * itemsize(b.dtype)
        return offsets

    def phase_target(self, p: int):
        """(target, source or None) of phase ``p`` of a grid-sync program."""
        t = self.targets
        target, source = t[p % len(t)], t[(p - 1) % len(t)]
        return target, (None if source is target else source)

    def summary(self) -> str:
        parts = [
            f"{b.kind}:{b.name}@{b.binding}:{b.dtype}[{b.count or 'N'}]"
            + (f"{list(b.byte_range)}" if b.byte_range else "")
            for b in self.buffers
        ]
        sync = f" grid_sync x{self.phases}" if self.grid_sync else ""
        return f"seed={self.seed} block={self.block}{sync} min_runtime={self.min_runtime} " + " ".join(parts)


def _count(rng, allow_runtime: bool, large: bool) -> int:
    if allow_runtime and rng.random() < 0.5:
        return 0
    k = rng.random()
    if k < 0.15:
        return 1
    if k < 0.45:
        return int(rng.integers(2, 64)) | 1  # small odd
    if k < 0.9 or not large:
        return int(rng.integers(64, 4097))
    return int(rng.integers(4097, 70_001))


def generate(seed: int, *, large: bool = True, supports_launch: bool = False) -> ProgramDesc:
    """A random program description, a pure function of ``seed``."""
    rng = np.random.default_rng(seed)
    grid_sync = bool(rng.random() < 0.3)
    phases = int(rng.integers(1, 5)) if grid_sync else 1
    n = int(rng.integers(1, 7))
    kinds = [
        str(k)
        for k in rng.choice(
            ["read", "read", "uniform", "read_write", "write_only", "output", "output", "workgroup"], size=n
        )
    ]
    if not any(k in OUTPUT_KINDS for k in kinds):
        kinds[int(rng.integers(0, n))] = str(rng.choice(OUTPUT_KINDS))
    if grid_sync and phases > 1 and sum(k in OUTPUT_KINDS for k in kinds) < 2 and rng.random() < 0.8:
        kinds.append(str(rng.choice(OUTPUT_KINDS)))  # ping-pong between two targets across phases
    if sum(k == "workgroup" for k in kinds) > 2:
        kinds = [k if k != "workgroup" else "read" for k in kinds]
    has_echo = bool(rng.random() < 0.8)
    total = len(kinds) + has_echo
    # unique bindings, dense or sparse
    spread = total if rng.random() < 0.5 else 3 * total + 8
    bindings = [int(b) for b in rng.choice(spread, size=total, replace=False)]
    block = int(rng.choice([1, 32, 64, 96, 128, 256, 256, 512, 1024]))
    runtime_inputs = False
    buffers = []
    shared = 0
    min_runtime = 0
    for index, kind in enumerate(kinds):
        binding = bindings[index]
        name = f"{kind[:2]}{index}"
        if kind == "workgroup":
            dtype = str(rng.choice(TABLE_DTYPES))
            size = itemsize(dtype)
            budget = max(1, (200_000 - shared) // size - 16)
            want = int(
                rng.choice([int(rng.integers(1, 64)), int(rng.integers(64, 4096)), int(rng.integers(4096, 60_000))])
            )
            count = max(1, min(want // size if want > 4096 else want, budget))
            shared = -(-shared // 16) * 16 + count * size
            buffers.append(Buf(name, binding, kind, dtype, count, coef=int(rng.integers(1, 6))))
            continue
        dtype = str(rng.choice(DTYPE_NAMES))
        if kind in INPUT_KINDS:
            count = _count(rng, True, large)
            runtime_inputs |= count == 0
        else:
            count = _count(rng, True, large)
        buffers.append(
            Buf(
                name,
                binding,
                kind,
                dtype,
                count,
                alignment=rng.choice([None, None, None, 16, 256, 4096]),
                coef=int(rng.integers(1, 6)),
                shift=int(rng.integers(0, 1000)),
                salt=int(rng.integers(1, 10)),
                src_coef=int(rng.integers(1, 6)),
            )
        )
    if not runtime_inputs:  # a runtime-sized output needs a runtime-sized input to take its length from
        buffers = [
            b if b.count or b.is_input or b.is_workgroup else _replace(b, count=int(rng.integers(1, 300)))
            for b in buffers
        ]
    runtime_inputs = any(b.count == 0 and b.is_input for b in buffers)
    # element-aligned byte ranges on some writable buffers; on a runtime-sized one the range lies
    # in the first `min_runtime` elements, which every dispatch then provides
    with_ranges = []
    for b in buffers:
        if b.is_target and rng.random() < 0.3:
            elements = b.count or int(rng.integers(1, 40))
            if not b.count:
                min_runtime = max(min_runtime, elements)
            lo = int(rng.integers(0, elements + 1))
            hi = int(rng.integers(lo, elements + 1))
            b = _replace(b, byte_range=(lo * itemsize(b.dtype), hi * itemsize(b.dtype)))
        with_ranges.append(b)
    buffers = with_ranges
    if has_echo:
        binding = bindings[-1]
        words = max(b.binding for b in buffers + [Buf("x", binding, "echo", "u32", 1)]) + 2 + (2 if grid_sync else 0)
        buffers.append(Buf(f"echo{len(buffers)}", binding, "echo", "u32", words, alignment=rng.choice([None, 16])))
    launch = None
    if supports_launch and rng.random() < 0.2:
        named = [b for b in buffers if not b.is_workgroup and (b.count or runtime_inputs)]
        if named:
            launch = named[int(rng.integers(0, len(named)))].name
    desc = ProgramDesc(
        seed,
        tuple(buffers),
        block,
        grid_sync,
        phases,
        min_runtime if runtime_inputs else 0,
        launch,
        name=f"fuzz_{seed}",
    )
    _check_desc(desc)
    return desc


def _replace(b: Buf, **kw) -> Buf:
    fields = dict(b.__dict__)
    fields.update(kw)
    return Buf(**fields)


def _check_desc(desc: ProgramDesc) -> None:
    assert desc.targets, desc
    assert len({b.binding for b in desc.buffers}) == len(desc.buffers), desc
    assert sum(b.count * itemsize(b.dtype) + 16 for b in desc.tables) <= 232_448, desc
    if desc.echo is not None:
        assert desc.echo.count == desc.words, desc


# ---------------------------------------------------------------------------------- CUDA source
def _bits_expr(b: Buf, index: str, cached: bool) -> str:
    ut = UNSIGNED_C[itemsize(b.dtype)]
    if cached:
        return f"(vyre_u64)__ldcg(reinterpret_cast<const {ut}*>({b.ident}) + ({index}))"
    return f"(vyre_u64)(reinterpret_cast<const {ut}*>({b.ident})[{index}])"


def _ib(dtype: str, bits: str) -> str:
    if dtype in SIGNED and itemsize(dtype) < 8:
        return f"vyre_sx{8 * itemsize(dtype)}({bits})"
    return f"({bits})"


def _fv(dtype: str, bits: str) -> str:
    if dtype == "f32":
        return f"(double)__uint_as_float((unsigned int)({bits}))"
    if dtype == "f64":
        return f"__longlong_as_double((long long)({bits}))"
    if dtype == "f16":
        return f"(double)__half2float(__ushort_as_half((unsigned short)({bits})))"
    if dtype == "bf16":
        return f"(double)__uint_as_float(((unsigned int)({bits})) << 16)"
    return f"(double)({_ib(dtype, bits)} & 0xFFull)"


def _store(b: Buf, index: str, acc: str) -> str:
    size = itemsize(b.dtype)
    ut = UNSIGNED_C[size]
    target = f"reinterpret_cast<{ut}*>({b.ident})[{index}]"
    if b.dtype == "f32":
        return f"{target} = __float_as_uint((float)({acc}));"
    if b.dtype == "f64":
        return f"{target} = (unsigned long long)__double_as_longlong({acc});"
    if b.dtype == "f16":
        return f"{target} = __half_as_ushort(__float2half_rn((float)({acc})));"
    if b.dtype == "bf16":
        return f"{target} = vyre_bf16_rne((float)({acc}));"
    return f"{target} = ({ut})({acc});"


_PRELUDE = r"""
__device__ __forceinline__ vyre_u64 vyre_sx8(vyre_u64 x) { x &= 0xFFull; return (x ^ 0x80ull) - 0x80ull; }
__device__ __forceinline__ vyre_u64 vyre_sx16(vyre_u64 x) { x &= 0xFFFFull; return (x ^ 0x8000ull) - 0x8000ull; }
__device__ __forceinline__ vyre_u64 vyre_sx32(vyre_u64 x) {
  x &= 0xFFFFFFFFull;
  return (x ^ 0x80000000ull) - 0x80000000ull;
}
__device__ __forceinline__ unsigned short vyre_bf16_rne(float f) {
  const unsigned int u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
"""


def _table_bits_expr(g: Buf, offset: int) -> str:
    """Bits of workgroup table ``g`` at the element element ``i`` reads."""
    return f"(vyre_u64)vyre_shared<{UNSIGNED_C[itemsize(g.dtype)]}>({offset}u)[(i * 13ull + 5ull) % {g.count}ull]"


def _formula(desc: ProgramDesc, t: Buf, phase: int | None, source: Buf | None) -> list:
    """Lines updating target ``t`` for every element, grid-stride."""
    offsets = desc.shared_offsets()
    old = _bits_expr(t, "i", cached=False)
    lines = [f"for (vyre_u64 i = gid; i < n_{t.ident}; i += stride) {{"]
    ph = f"{phase}u" if phase is not None else "0u"
    if t.dtype in FLOATS:
        lines.append(f"  double acc = (double){t.salt};")
        lines.append(f"  acc = acc + 0.5 * {_fv(t.dtype, old)};")
        for r in desc.reads:
            bits = _bits_expr(r, f"(i + {r.shift}ull) % n_{r.ident}", cached=False)
            lines.append(f"  if (n_{r.ident}) acc = acc + (double){r.coef} * {_fv(r.dtype, bits)};")
        for g in desc.tables:
            bits = _table_bits_expr(g, offsets[g.binding])
            lines.append(f"  acc = acc + (double){g.coef} * (double)({_ib(g.dtype, bits)} & 0xFFull);")
        lines.append("  acc = acc + (double)(i % 17ull);")
        if source is not None:
            bits = _bits_expr(source, f"(i + {t.shift}ull) % n_{source.ident}", cached=True)
            lines.append(f"  if (n_{source.ident}) acc = acc + 0.25 * {_fv(source.dtype, bits)};")
        lines.append(f"  acc = acc + (double)({ph} + 1u);")
    else:
        lines.append(f"  vyre_u64 acc = {t.salt}ull;")
        lines.append(f"  acc += {t.coef}ull * {_ib(t.dtype, old)};")
        for r in desc.reads:
            bits = _bits_expr(r, f"(i + {r.shift}ull) % n_{r.ident}", cached=False)
            lines.append(f"  if (n_{r.ident}) acc += {r.coef}ull * {_ib(r.dtype, bits)};")
        for g in desc.tables:
            bits = _table_bits_expr(g, offsets[g.binding])
            lines.append(f"  acc += {g.coef}ull * {_ib(g.dtype, bits)};")
        lines.append(f"  acc += i * {GOLDEN}ull;")
        if source is not None:
            bits = _bits_expr(source, f"(i + {t.shift}ull) % n_{source.ident}", cached=True)
            lines.append(f"  if (n_{source.ident}) acc += {t.src_coef}ull * {_ib(source.dtype, bits)};")
        lines.append(f"  acc += (vyre_u64)({ph} + 1u) * {PHASE_SALT}ull;")
    lines.append("  " + _store(t, "i", "acc"))
    lines.append("}")
    return lines


def _table_value(g: Buf) -> str:
    if g.dtype == "f32":
        return "__float_as_uint((float)(k * 7u + 3u))"
    if g.dtype == "f64":
        return "(unsigned long long)__double_as_longlong((double)(k * 7u + 3u))"
    return f"({UNSIGNED_C[itemsize(g.dtype)]})(k * 7u + 3u)"


def cuda_source(desc: ProgramDesc) -> str:
    """The kernel of ``desc`` (entry ``vyre_main``)."""
    out = []
    if any(b.dtype == "f16" for b in desc.buffers):
        out.append("#include <cuda_fp16.h>")
    out.append('#include "vyre_cuda.cuh"')
    out.append(f"// generated by tests/fuzz_programs.py: {desc.summary()}")
    out.append(_PRELUDE)
    params = []
    for b in desc.args:
        const = "const " if b.kind in ("read", "uniform") else ""
        params.append(f"{const}{CTYPE[b.dtype]}* {b.ident}")
    params.append("const vyre_u32* params")
    # 1024 threads (a block size the fuzzer uses) must fit: cap the registers per thread
    out.append(f"VYRE_KERNEL __launch_bounds__(1024) vyre_main({', '.join(params)}) {{")
    body = []
    offsets = desc.shared_offsets()
    for g in desc.tables:
        ut = UNSIGNED_C[itemsize(g.dtype)]
        body.append(
            f"for (vyre_u32 k = threadIdx.x; k < {g.count}u; k += blockDim.x) "
            f"vyre_shared<{ut}>({offsets[g.binding]}u)[k] = {_table_value(g)};"
        )
    if desc.tables:
        body.append("__syncthreads();")
    body.append("const vyre_u64 gid = vyre_global_id(), stride = vyre_global_threads();")
    for b in desc.args:
        body.append(f"const vyre_u64 n_{b.ident} = vyre_binding_count(params, {b.binding}u);")
        body.append(f"(void)n_{b.ident};")
    echo = desc.echo
    echo_lines = []
    if echo is not None:
        echo_lines = [
            (
                f"for (vyre_u64 k = gid; k < {desc.words}ull && k < n_{echo.ident}; k += stride) "
                f"{echo.ident}[k] = params[k];"
            )
        ]
    if desc.grid_sync:
        body.append("const vyre_u32 ph_end = vyre_phase_end(params);")
        body.append("for (vyre_u32 ph = vyre_phase_begin(params); ph < ph_end; ++ph) {")
        body.extend("  " + line for line in echo_lines)
        for p in range(desc.phases):
            target, source = desc.phase_target(p)
            body.append(f"  {'if' if p == 0 else 'else if'} (ph == {p}u) {{")
            body.extend("    " + line for line in _formula(desc, target, p, source))
            body.append("  }")
        body.append("  if (ph + 1u < ph_end) vyre_grid_sync();")
        body.append("}")
    else:
        body.extend(echo_lines)
        for t in desc.targets:
            body.extend(_formula(desc, t, None, None))
    out.extend("  " + line for line in body)
    out.append("}")
    return "\n".join(out) + "\n"


def _decl(b: Buf) -> BufferDecl:
    kw = {}
    if b.byte_range is not None:
        kw["output_byte_range"] = b.byte_range
    if b.alignment is not None:
        kw["alignment"] = int(b.alignment)
    if b.kind == "workgroup":
        return BufferDecl.workgroup(b.name, b.binding, b.dtype, b.count)
    if b.kind == "echo":
        return BufferDecl.write_only(b.name, b.binding, "u32", b.count, **kw)
    return getattr(BufferDecl, b.kind)(b.name, b.binding, b.dtype, b.count, **kw)


def build_program(desc: ProgramDesc) -> Program:
    kw = {"launch": desc.launch} if desc.launch else {}
    return Program(
        Kernel.cuda(cuda_source(desc), options=KERNEL_OPTIONS),
        [_decl(b) for b in desc.buffers],
        workgroup_size=(desc.block, 1, 1),
        grid_sync=desc.grid_sync,
        phases=desc.phases,
        name=desc.name,
        **kw,
    )


# ---------------------------------------------------------------------------------- data
def numpy_dtype(dtype: str) -> np.dtype:
    return np.dtype(DTYPES[dtype].numpy)


def random_values(rng, dtype: str, n: int) -> np.ndarray:
    """Fresh random elements of ``dtype`` (never all zeros); bf16 as its uint16 bits, since a
    numpy bfloat16 array (ml_dtypes) exports no buffer format."""
    if dtype in FLOATS:
        x = rng.standard_normal(n) * 30.0
        special = rng.random(n) < 0.05
        x[special] = rng.choice([0.0, -0.0, 1.0, -2.5, 1e-6, 99.75], size=int(special.sum()))
        if dtype == "f64":
            return x
        if dtype == "f32":
            x = x.astype(np.float32)
            tiny = rng.random(n) < 0.01
            x[tiny] = np.float32(1e-40)  # a subnormal
            return x
        if dtype == "f16":
            return x.astype(np.float16)
        bits = x.astype(np.float32).view(np.uint32) >> 16  # bf16 by truncation: finite
        return bits.astype(np.uint16)  # bf16 inputs travel as their uint16 bits
    info = np.iinfo(numpy_dtype(dtype))
    return rng.integers(info.min, info.max, size=n, dtype=numpy_dtype(dtype), endpoint=True)


def element_counts(desc: ProgramDesc, runtime: int) -> dict:
    """binding -> element count of every non-workgroup buffer for a dispatch of ``runtime``."""
    return {b.binding: (b.count or runtime) for b in desc.args}


def make_inputs(desc: ProgramDesc, rng, runtime: int) -> list:
    """Caller inputs in declaration order (read, uniform, read_write buffers)."""
    return [random_values(rng, b.dtype, b.count or runtime) for b in desc.inputs]


# ---------------------------------------------------------------------------------- the model
def _bits(arr: np.ndarray) -> np.ndarray:
    return arr.view(UNSIGNED_NP[arr.dtype.itemsize]).astype(np.uint64)


def _ib_np(dtype: str, bits: np.ndarray) -> np.ndarray:
    if dtype in SIGNED and itemsize(dtype) < 8:
        m = np.uint64(1 << (8 * itemsize(dtype) - 1))
        mask = np.uint64((1 << (8 * itemsize(dtype))) - 1)
        return ((bits & mask) ^ m) - m
    return bits


def _fv_np(dtype: str, bits: np.ndarray) -> np.ndarray:
    if dtype == "f32":
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    if dtype == "f64":
        return bits.view(np.float64)
    if dtype == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return (_ib_np(dtype, bits) & np.uint64(0xFF)).astype(np.float64)


def _bf16_rne(f32: np.ndarray) -> np.ndarray:
    u = f32.view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    out[(u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)] = 0x7FC0
    return out


def _stored(dtype: str, acc: np.ndarray) -> np.ndarray:
    """``acc`` rounded or truncated to ``dtype``, as that dtype's numpy array."""
    if dtype == "f64":
        return acc.astype(np.float64)
    if dtype == "f32":
        return acc.astype(np.float32)
    if dtype == "f16":
        return acc.astype(np.float32).astype(np.float16)
    if dtype == "bf16":
        return _bf16_rne(acc.astype(np.float32)).view(numpy_dtype("bf16"))
    return acc.astype(UNSIGNED_NP[itemsize(dtype)]).view(numpy_dtype(dtype))


def table_bits(g: Buf) -> np.ndarray:
    k = np.arange(g.count, dtype=np.uint64)
    value = k * np.uint64(7) + np.uint64(3)
    if g.dtype == "f32":
        return value.astype(np.float32).view(np.uint32).astype(np.uint64)
    if g.dtype == "f64":
        return value.astype(np.float64).view(np.uint64)
    return value & np.uint64((1 << (8 * itemsize(g.dtype))) - 1)


def _update(desc: ProgramDesc, arrays: dict, counts: dict, t: Buf, phase: int | None, source: Buf | None) -> None:
    n = counts[t.binding]
    if n == 0:
        return
    i = np.arange(n, dtype=np.uint64)
    old = _bits(arrays[t.binding][:n])
    ph = np.uint64(phase or 0)
    if t.dtype in FLOATS:
        acc = np.full(n, float(t.salt))
        acc = acc + 0.5 * _fv_np(t.dtype, old)
        for r in desc.reads:
            nr = counts[r.binding]
            if nr:
                idx = (i + np.uint64(r.shift)) % np.uint64(nr)
                acc = acc + float(r.coef) * _fv_np(r.dtype, _bits(arrays[r.binding][:nr])[idx])
        for g in desc.tables:
            bits = table_bits(g)[(i * np.uint64(13) + np.uint64(5)) % np.uint64(g.count)]
            acc = acc + float(g.coef) * (_ib_np(g.dtype, bits) & np.uint64(0xFF)).astype(np.float64)
        acc = acc + (i % np.uint64(17)).astype(np.float64)
        if source is not None and counts[source.binding]:
            nu = counts[source.binding]
            idx = (i + np.uint64(t.shift)) % np.uint64(nu)
            acc = acc + 0.25 * _fv_np(source.dtype, _bits(arrays[source.binding][:nu])[idx])
        acc = acc + float(ph + np.uint64(1))
    else:
        acc = np.full(n, t.salt, dtype=np.uint64)
        acc = acc + np.uint64(t.coef) * _ib_np(t.dtype, old)
        for r in desc.reads:
            nr = counts[r.binding]
            if nr:
                idx = (i + np.uint64(r.shift)) % np.uint64(nr)
                acc = acc + np.uint64(r.coef) * _ib_np(r.dtype, _bits(arrays[r.binding][:nr])[idx])
        for g in desc.tables:
            bits = table_bits(g)[(i * np.uint64(13) + np.uint64(5)) % np.uint64(g.count)]
            acc = acc + np.uint64(g.coef) * _ib_np(g.dtype, bits)
        acc = acc + i * np.uint64(GOLDEN)
        if source is not None and counts[source.binding]:
            nu = counts[source.binding]
            idx = (i + np.uint64(t.shift)) % np.uint64(nu)
            acc = acc + np.uint64(t.src_coef) * _ib_np(source.dtype, _bits(arrays[source.binding][:nu])[idx])
        acc = acc + (ph + np.uint64(1)) * np.uint64(PHASE_SALT)
    arrays[t.binding][:n] = _stored(t.dtype, acc)


def apply_launch(desc: ProgramDesc, arrays: dict, counts: dict, words=None, phase_range=None) -> None:
    """One launch of the kernel, in place: ``arrays`` maps binding -> that buffer's elements,
    ``counts`` binding -> element count (as the params words give them), ``words`` the params
    block (written to the echo buffer), ``phase_range`` (begin, end) for grid-sync programs."""
    if desc.grid_sync:
        begin, end = phase_range
        for p in range(begin, end):
            target, source = desc.phase_target(p)
            _update(desc, arrays, counts, target, p, source)
    else:
        for t in desc.targets:
            _update(desc, arrays, counts, t, None, None)
    echo = desc.echo
    if echo is not None and words is not None:
        n = min(desc.words, counts[echo.binding])
        arrays[echo.binding][:n] = np.asarray(words[:n], dtype=np.uint32)


def launch_count(desc: ProgramDesc, runtime: int, config) -> int:
    """Word 0 of the params block, by the documented launch-sizing rule, first match wins:
    ``DispatchConfig(elements=)``, the program's ``launch=`` binding, grid x block under
    ``grid_override``, then the largest output (the largest binding with workgroup buffers)."""
    block = (config.workgroup_override or (desc.block, 1, 1)) if config is not None else (desc.block, 1, 1)
    if config is not None and getattr(config, "elements", None) is not None:
        return config.elements
    counts = element_counts(desc, runtime)
    if desc.launch:
        return next(counts[b.binding] for b in desc.buffers if b.name == desc.launch)
    if config is not None and config.grid_override:
        return config.grid_override[0] * block[0]
    outputs = [counts[b.binding] for b in desc.outputs]
    if outputs and not desc.tables:
        return max(outputs)
    return max(counts.values())


def expected_words(desc: ProgramDesc, runtime: int, config, phase_range=None) -> list:
    words = [0] * (desc.max_binding + 2)
    words[0] = launch_count(desc, runtime, config)
    for b in desc.buffers:
        words[b.binding + 1] = b.count if b.is_workgroup else (b.count or runtime)
    if desc.grid_sync:
        words += list(phase_range)
    return words


def reference(desc: ProgramDesc, inputs: list, runtime: int, config=None, route: str = "regular") -> list:
    """Expected outputs (declaration order, each its byte range's elements) of one dispatch."""
    counts = element_counts(desc, runtime)
    arrays = {}
    it = iter(inputs)
    for b in desc.buffers:
        if b.is_input:  # (bf16 inputs arrive as uint16 bits; outputs come back as the bf16 dtype)
            arrays[b.binding] = np.array(next(it), copy=True).view(numpy_dtype(b.dtype))
        elif not b.is_workgroup:
            arrays[b.binding] = np.zeros(counts[b.binding], numpy_dtype(b.dtype if b.kind != "echo" else "u32"))
    iterations = (config.fixpoint_iterations or 1) if config is not None else 1
    for _ in range(iterations):
        if desc.grid_sync:
            apply_launch(desc, arrays, counts, None, (0, desc.phases))
        else:
            apply_launch(desc, arrays, counts)
    if desc.echo is not None:
        last = (desc.phases - 1, desc.phases) if route == "split" else (0, desc.phases)
        words = expected_words(desc, runtime, config, last if desc.grid_sync else None)
        n = min(desc.words, counts[desc.echo.binding])
        arrays[desc.echo.binding][:n] = np.asarray(words[:n], dtype=np.uint32)
    outs = []
    for b in desc.outputs:
        arr = arrays[b.binding]
        if b.byte_range is not None:
            size = arr.dtype.itemsize
            arr = arr[b.byte_range[0] // size : b.byte_range[1] // size]
        outs.append(arr)
    return outs


# ---------------------------------------------------------------------------------- comparison
TOLERANCE = {"f16": (2e-3, 1e-3), "bf16": (1.6e-2, 1e-2), "f32": (2e-6, 1e-30), "f64": (1e-12, 1e-300)}


def compare(desc: ProgramDesc, got: list, want: list) -> list:
    """Mismatch descriptions (empty when every element of every output agrees): integers
    exactly, floats within the dtype's tolerance with NaN in the same places."""
    problems = []
    if len(got) != len(want):
        return [f"{len(got)} outputs returned, {len(want)} expected"]
    for b, g, w in zip(desc.outputs, got, want, strict=True):
        g = np.asarray(g)
        if g.dtype != w.dtype or g.shape != w.shape:
            problems.append(f"{b.name}: got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}")
            continue
        dtype = "u32" if b.kind == "echo" else b.dtype
        if dtype in FLOATS:
            gv, wv = _fv_np(dtype, _bits(g)), _fv_np(dtype, _bits(w))
            rtol, atol = TOLERANCE[dtype]
            same_nan = np.isnan(gv) == np.isnan(wv)
            close = np.isclose(gv, wv, rtol=rtol, atol=atol, equal_nan=True) & same_nan
            bad = np.flatnonzero(~close)
            if bad.size:
                k = bad[0]
                problems.append(
                    f"{b.name} ({dtype}): {bad.size} of {g.size} elements differ; first at {k}: "
                    f"got {gv[k]!r}, expected {wv[k]!r}"
                )
        else:
            bad = np.flatnonzero(_bits(g) != _bits(w))
            if bad.size:
                k = bad[0]
                problems.append(
                    f"{b.name} ({dtype}): {bad.size} of {g.size} elements differ; first at {k}: "
                    f"got {g[k]!r}, expected {w[k]!r}"
                )
    return problems


# ---------------------------------------------------------------------------------- dispatch plans
ENTRIES = ("dispatch", "dispatch_into", "async_result", "async_result_into", "timed", "async_timed")


@dataclass(frozen=True)
class DispatchPlan:
    """How one dispatch of a program runs: runtime count, config fields and entry point."""

    runtime: int
    entry: str
    grid: int | None = None
    block: int | None = None
    iterations: int | None = None
    cooperative: bool = False

    def config(self):
        from vyre_cuda import DispatchConfig

        if self.grid is None and self.block is None and self.iterations is None and not self.cooperative:
            return None
        return DispatchConfig(
            grid_override=self.grid,
            workgroup_override=self.block,
            fixpoint_iterations=self.iterations,
            cooperative=self.cooperative,
        )


def plan_dispatch(desc: ProgramDesc, rng, *, max_runtime: int = 300_000) -> DispatchPlan:
    """A random dispatch of ``desc``: sizes 0/1/odd/medium/large, configs, entry points."""
    k = rng.random()
    if k < 0.04 and desc.min_runtime == 0:
        runtime = 0
    elif k < 0.15:
        runtime = 1
    elif k < 0.45:
        runtime = int(rng.integers(2, 300)) | 1
    elif k < 0.93:
        runtime = int(rng.integers(300, max(301, min(20_000, max_runtime))))
    else:
        runtime = int(rng.integers(min(20_000, max_runtime), max_runtime + 1))
    runtime = max(runtime, desc.min_runtime)
    entry = str(rng.choice(ENTRIES))
    grid = block = iterations = None
    cooperative = False
    c = rng.random()
    if c < 0.25:
        grid = int(rng.choice([1, 2, 7, 64, 131, 132, 133, 1000]))
    elif desc.grid_sync and c < 0.45:
        grid = int(rng.choice([3000, 20_000]))  # over residency on most devices: host-split
    if rng.random() < 0.15:
        block = int(rng.choice([1, 32, 64, 96, 256, 1024]))
    if rng.random() < 0.3:
        iterations = int(rng.integers(1, 5))
    if not desc.grid_sync and grid is not None and grid <= 132 and rng.random() < 0.3:
        cooperative = True  # a plain kernel as one cooperative launch (always fits: <= 1 block per SM)
    return DispatchPlan(runtime, entry, grid, block, iterations, cooperative)
