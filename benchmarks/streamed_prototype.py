"""Streamed-dispatch prototype: chunked vecadd through the public API against the DMA ceilings.

The data behind the streamed route's constants (notes/streamed-dispatch.md). On one GPU, in one
run, for ``vecadd_f32`` (a, b in, out) at each ``--sizes`` per buffer, from numpy arrays and from
page-locked arrays (``vyre_cuda.pinned_empty``):

- the physical ceilings (pinned memory, ``cuda.bindings.driver``, the dispatch's byte counts):
  H2D of both inputs alone, D2H of the output alone, both directions at once on two streams, and
  both one after the other on one stream;
- today's serial route: ``dispatch`` and ``dispatch_into``;
- a chunked prototype: the rows cut into chunks of ``--chunks`` bytes per buffer, ``K`` (``--depths``)
  ``dispatch_async`` calls in flight on one backend, the oldest completed by ``result_into`` into
  the output's slice.

Every configuration is checked against numpy ``a + b`` on random data first (output poisoned with
NaN, every element compared) and again after every timed round (the chunk boundaries and a stride
of elements, poisoned before the round); a wrong result exits 1. Times are wall-clock medians of
``--rounds`` interleaved rounds after ``--warmup`` runs of each configuration. GB/s counts the bytes
moved both ways (3 x N for the dispatches and the duplex ceiling).

Run on a GPU machine after building in place::

    python benchmarks/streamed_prototype.py --out streamed.json

About 20-40 s on an H200 with the defaults (64 MiB and 256 MiB, chunks 4/8/16 MiB, K 2/3/4).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import platform
import re
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

MIB = 1 << 20
UNITS = {"": MIB, "K": 1 << 10, "KIB": 1 << 10, "M": MIB, "MIB": MIB, "G": 1 << 30, "GIB": 1 << 30, "B": 1}
DUPLEX = "dma both directions"
SERIAL_REFERENCE = "dispatch_into"  # the row every "vs serial" ratio of the same memory kind divides by
ITEMSIZE = 4  # float32


class WrongResult(Exception):
    """An output differs from numpy's a + b."""


# ---------------------------------------------------------------------------- pure parts
def parse_size(text: str) -> int:
    """``"64M"``, ``"256MiB"``, ``"512K"``, ``"1G"`` or a plain number of MiB -> bytes (a multiple of 4)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Z]*)", text.strip().upper())
    digits, unit = match.groups() if match else ("", "?")
    if not digits or unit not in UNITS:
        raise ValueError(f"size {text!r} is not a number with an optional unit K, M or G. Fix: pass e.g. 64M or 512K")
    nbytes = int(float(digits) * UNITS[unit])
    if nbytes <= 0 or nbytes % ITEMSIZE:
        raise ValueError(f"size {text!r} is {nbytes} bytes, not a positive multiple of 4. Fix: pass whole float32s")
    return nbytes


def format_bytes(nbytes: int) -> str:
    """``4194304`` -> ``"4 MiB"``, ``98304`` -> ``"96 KiB"`` (the largest unit that divides it)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def parse_list(text: str, item=parse_size) -> list:
    return [item(part) for part in text.split(",") if part.strip()]


def chunk_spans(rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    """``[(begin, end), ...]`` covering rows ``[0, rows)`` in order, every chunk ``chunk_rows``
    long but the last (the streamed plan's rule: chunk k is ``[k * c, min((k + 1) * c, rows))``)."""
    if rows < 0 or chunk_rows < 1:
        raise ValueError(f"rows={rows}, chunk_rows={chunk_rows}: need rows >= 0 and chunk_rows >= 1")
    return [(begin, min(begin + chunk_rows, rows)) for begin in range(0, rows, chunk_rows)]


def sample_indices(rows: int, spans, stride: int = 4099) -> np.ndarray:
    """Rows checked after every timed round: the first and last two rows of every chunk (where
    an off-by-one lands) and every ``stride``-th row."""
    picks = [np.arange(0, rows, stride, dtype=np.int64)]
    for begin, end in spans:
        picks.append(np.array([begin, begin + 1, end - 2, end - 1], dtype=np.int64))
    idx = np.unique(np.concatenate(picks))
    return idx[(idx >= 0) & (idx < rows)]


def check_output(name: str, out: np.ndarray, expected: np.ndarray, idx: np.ndarray | None = None) -> None:
    """Raise :class:`WrongResult` naming the first wrong row (all rows, or only ``idx``)."""
    if out.shape != expected.shape:
        raise WrongResult(f"{name}: output shape {out.shape}, expected {expected.shape}")
    got, want = (out, expected) if idx is None else (out[idx], expected[idx])
    bad = np.flatnonzero(got != want)  # NaN (the poison) never equals
    if bad.size:
        k = int(bad[0]) if idx is None else int(idx[bad[0]])
        raise WrongResult(
            f"{name}: {bad.size} wrong of {got.size} checked; first at row {k}: got {out[k]!r}, want {expected[k]!r}"
        )


def poison(out: np.ndarray, idx: np.ndarray | None = None) -> None:
    if idx is None:
        out.fill(np.nan)
    else:
        out[idx] = np.nan


def run_chunked(backend, program, a, b, out, spans, depth: int):
    """The prototype: at most ``depth`` chunk dispatches in flight, the oldest completed into its
    slice of ``out`` before the next is issued."""
    pending: collections.deque = collections.deque()
    for begin, end in spans:
        if len(pending) == depth:
            handle, (pb, pe) = pending.popleft()
            handle.result_into([out[pb:pe]])
        pending.append((backend.dispatch_async(program, [a[begin:end], b[begin:end]]), (begin, end)))
    while pending:
        handle, (pb, pe) = pending.popleft()
        handle.result_into([out[pb:pe]])
    return out


def summarize(samples_s) -> dict:
    ms = sorted(1e3 * t for t in samples_s)
    return {
        "median_ms": statistics.median(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "samples_ms": [round(t, 4) for t in ms],
    }


def add_ratios(rows: list[dict]) -> list[dict]:
    """Fill ``gbps``, ``vs_duplex`` (time / the both-directions ceiling's time) and ``vs_serial``
    (time / the ``dispatch_into`` row of the same memory kind) in every row of one size."""
    by_name = {(r["name"], r["kind"]): r for r in rows}
    duplex = by_name.get((DUPLEX, "pinned"))
    for row in rows:
        ms = row["median_ms"]
        row["gbps"] = row["bytes_moved"] / (ms * 1e-3) / 1e9 if ms > 0 else math.inf
        row["vs_duplex"] = ms / duplex["median_ms"] if duplex else None
        serial = by_name.get((SERIAL_REFERENCE, row["kind"]))
        row["vs_serial"] = ms / serial["median_ms"] if serial and not row["name"].startswith("dma") else None
    return rows


def best_chunked(rows: list[dict], kind: str) -> dict | None:
    chunked = [r for r in rows if r["kind"] == kind and r.get("depth")]
    return min(chunked, key=lambda r: r["median_ms"]) if chunked else None


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_table(nbytes: int, rows: list[dict]) -> str:
    head = f"vecadd f32, {format_bytes(nbytes)} per buffer ({3 * nbytes / 1e6:.1f} MB moved per dispatch)"
    lines = [
        head,
        f"{'route':<28} {'host':<7} {'median ms':>10} {'GB/s':>7} {'vs duplex':>9} {'vs serial':>9}",
    ]
    for r in rows:
        lines.append(
            f"{r['label']:<28} {r['kind']:<7} {r['median_ms']:>10.3f} {r['gbps']:>7.1f} "
            f"{_ratio(r['vs_duplex']):>9} {_ratio(r['vs_serial']):>9}"
        )
    for kind in ("numpy", "pinned"):
        best = best_chunked(rows, kind)
        if best:
            lines.append(
                f"best chunked, {kind}: {best['label']} = {_ratio(best['vs_duplex'])}x duplex, "
                f"{_ratio(best['vs_serial'])}x serial"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the GPU parts
class DmaCeilings:
    """Pinned DMA with the dispatch's byte counts through ``cuda.bindings.driver``, in the
    backend's (primary) context: 2 x N up on one stream, N down on another."""

    def __init__(self, context_handle: int, a, b, out):
        from cuda.bindings import driver as cu

        self.cu = cu
        self.ctx = cu.CUcontext(context_handle)
        self.n = a.nbytes
        self.hosts = (a.ctypes.data, b.ctypes.data, out.ctypes.data)
        self.a, self.out = a, out
        self.dev, self.streams = [], []
        self._current()
        try:
            for _ in range(3):
                self.dev.append(self._ok(cu.cuMemAlloc(self.n), "cuMemAlloc"))
            for _ in range(2):
                flags = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
                self.streams.append(self._ok(cu.cuStreamCreate(flags), "cuStreamCreate"))
        except BaseException:
            self.close()
            raise

    def _ok(self, result, call):
        if result[0] != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{call} failed: {result[0]!r}")
        return result[1] if len(result) > 1 else None

    def _current(self):
        self._ok(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def _up(self, stream):
        for dev, host in zip(self.dev[:2], self.hosts[:2], strict=True):
            self._ok(self.cu.cuMemcpyHtoDAsync(dev, host, self.n, stream), "cuMemcpyHtoDAsync")

    def _down(self, stream):
        self._ok(self.cu.cuMemcpyDtoHAsync(self.hosts[2], self.dev[2], self.n, stream), "cuMemcpyDtoHAsync")

    def _sync(self, *streams):
        for s in streams:
            self._ok(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")

    def h2d(self):
        self._current()
        self._up(self.streams[0])
        self._sync(self.streams[0])

    def d2h(self):
        self._current()
        self._down(self.streams[1])
        self._sync(self.streams[1])

    def duplex(self):
        self._current()
        self._up(self.streams[0])
        self._down(self.streams[1])
        self._sync(*self.streams)

    def one_stream(self):
        self._current()
        self._up(self.streams[0])
        self._down(self.streams[0])
        self._sync(self.streams[0])

    def verify(self, name: str):
        """The copies move the right bytes: a up, then back down into ``out``."""
        self._current()
        poison(self.out)
        self._ok(self.cu.cuMemcpyHtoDAsync(self.dev[2], self.hosts[0], self.n, self.streams[0]), "cuMemcpyHtoDAsync")
        self._sync(self.streams[0])
        self.d2h()
        check_output(name, self.out, self.a)

    def close(self):
        cu = self.cu
        cu.cuCtxSetCurrent(self.ctx)
        for s in self.streams:
            cu.cuStreamSynchronize(s)
            cu.cuStreamDestroy(s)
        for d in self.dev:
            cu.cuMemFree(d)
        self.streams, self.dev = [], []


class Config:
    """One measured row: ``run()`` returns the output array to check."""

    def __init__(self, name, kind, label, run, out, bytes_moved, idx, expected, **extra):
        self.name, self.kind, self.label, self.run, self.out = name, kind, label, run, out
        self.bytes_moved, self.idx, self.expected, self.extra = bytes_moved, idx, expected, extra
        self.samples: list[float] = []

    def checked(self) -> bool:
        return self.expected is not None

    def first(self):
        """The first warm-up: every output row checked, from a NaN-poisoned output."""
        if self.out is not None:
            poison(self.out)
        got = self.run()
        if self.checked():
            check_output(f"{self.label} ({self.kind})", got, self.expected)
            poison(got, self.idx)  # a recycled output cannot pass a later check with old values

    def timed(self, record: bool):
        if self.out is not None and self.checked():
            poison(self.out, self.idx)
        t0 = time.perf_counter()
        got = self.run()
        elapsed = time.perf_counter() - t0
        if self.checked():
            check_output(f"{self.label} ({self.kind})", got, self.expected, self.idx)
            poison(got, self.idx)
        if record:
            self.samples.append(elapsed)

    def row(self) -> dict:
        return dict(
            name=self.name, kind=self.kind, label=self.label, bytes_moved=self.bytes_moved, **self.extra
        ) | summarize(self.samples)


def build_configs(backend, program, nbytes, chunks, depths, hosts, expected, ceilings):
    rows = nbytes // ITEMSIZE
    all_spans = {c: chunk_spans(rows, max(1, c // ITEMSIZE)) for c in chunks}
    plain_idx = sample_indices(rows, [(0, rows)])
    configs = [
        Config("dma h2d", "pinned", "dma H2D alone (2N)", ceilings.h2d, None, 2 * nbytes, None, None),
        Config("dma d2h", "pinned", "dma D2H alone (N)", ceilings.d2h, None, nbytes, None, None),
        Config(DUPLEX, "pinned", "dma both directions", ceilings.duplex, None, 3 * nbytes, None, None),
        Config("dma one stream", "pinned", "dma up then down", ceilings.one_stream, None, 3 * nbytes, None, None),
    ]
    for kind, (a, b, out) in hosts.items():
        configs.append(
            Config(
                "dispatch",
                kind,
                "serial dispatch",
                lambda a=a, b=b: backend.dispatch(program, [a, b])[0],
                None,
                3 * nbytes,
                plain_idx,
                expected,
            )
        )
        configs.append(
            Config(
                SERIAL_REFERENCE,
                kind,
                "serial dispatch_into",
                lambda a=a, b=b, out=out: backend.dispatch_into(program, [a, b], [out])[0],
                out,
                3 * nbytes,
                plain_idx,
                expected,
            )
        )
        for chunk in chunks:
            spans = all_spans[chunk]
            idx = sample_indices(rows, spans)
            for depth in depths:
                configs.append(
                    Config(
                        "chunked",
                        kind,
                        f"chunked {format_bytes(chunk)} x{len(spans)} K={depth}",
                        lambda a=a, b=b, out=out, spans=spans, depth=depth: run_chunked(
                            backend, program, a, b, out, spans, depth
                        ),
                        out,
                        3 * nbytes,
                        idx,
                        expected,
                        chunk_bytes=chunk,
                        chunk_count=len(spans),
                        depth=depth,
                    )
                )
    return configs


def measure_size(vc, backend, program, nbytes, args, rng) -> dict:
    rows = nbytes // ITEMSIZE
    t_start = time.perf_counter()
    # random, never zero, and a + b exact in float32 either way (one rounding)
    a = (rng.random(rows, dtype=np.float32) + np.float32(0.5)).astype(np.float32)
    b = (rng.random(rows, dtype=np.float32) - np.float32(2.0)).astype(np.float32)
    expected = a + b
    hosts = {"numpy": (a, b, np.empty(rows, np.float32))}
    pa, pb, pout = (vc.pinned_empty(rows, np.float32) for _ in range(3))
    pa[:], pb[:] = a, b
    for arr in (pa, pb, pout):
        if not vc.is_page_locked(arr):
            raise RuntimeError("vyre_cuda.pinned_empty gave memory that is not page-locked")
    hosts["pinned"] = (pa, pb, pout)
    if args.on_inputs is not None:
        args.on_inputs(backend, program, [a, b])
    ceilings = DmaCeilings(backend.context_handle, pa, pb, pout)
    try:
        ceilings.verify("dma ceiling copies")
        configs = build_configs(backend, program, nbytes, args.chunks, args.depths, hosts, expected, ceilings)
        for c in configs:
            c.first()
            for _ in range(args.warmup - 1):
                c.timed(record=False)
        for r in range(args.rounds):  # interleaved, the order rotated each round
            k = r % len(configs)
            for c in configs[k:] + configs[:k]:
                c.timed(record=True)
    finally:
        ceilings.close()
    rows_out = add_ratios([c.row() for c in configs])
    print(format_table(nbytes, rows_out))
    elapsed = time.perf_counter() - t_start
    print(f"({elapsed:.1f} s for this size)\n", flush=True)
    return {"bytes_per_buffer": nbytes, "rows": rows_out, "seconds": elapsed}


def meta(vc, backend, args) -> dict:
    caps = backend.caps
    return {
        "device": getattr(caps, "name", "?"),
        "copy_engines": getattr(caps, "copy_engines", None),
        "vyre_cuda": getattr(vc, "__version__", "?"),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "warmup": args.warmup,
        "chunks": args.chunks,
        "depths": args.depths,
        "copy_threads": args.copy_threads,
        "duplex_reference": DUPLEX,
        "serial_reference": SERIAL_REFERENCE,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=parse_list, default=parse_list("64M,256M"), help="bytes per buffer (64M,256M)")
    ap.add_argument("--chunks", type=parse_list, default=parse_list("4M,8M,16M"), help="chunk bytes per buffer")
    ap.add_argument("--depths", type=lambda s: parse_list(s, int), default=[2, 3, 4], help="dispatches in flight")
    ap.add_argument("--rounds", type=int, default=9, help="timed interleaved rounds (>= 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs of each configuration (>= 1)")
    ap.add_argument("--copy-threads", type=int, default=None, help="CudaBackend(copy_threads=...)")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    return ap


def main(argv=None, *, on_inputs=None) -> int:
    """``on_inputs(backend, program, inputs)`` runs once per size before anything is measured (the
    fake-driver test registers its kernel emulation there)."""
    args = build_parser().parse_args(argv)
    if args.rounds < 5 or args.warmup < 1 or min(args.depths) < 1:
        print("need --rounds >= 5, --warmup >= 1 and depths >= 1", file=sys.stderr)
        return 2
    args.on_inputs = on_inputs
    import vyre_cuda as vc
    from vyre_cuda import builtin_programs

    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    program = builtin_programs.vecadd_f32()
    backend = vc.CudaBackend(0, copy_threads=args.copy_threads)
    report = {"meta": meta(vc, backend, args), "sizes": []}
    status = 0
    try:
        for nbytes in args.sizes:
            report["sizes"].append(measure_size(vc, backend, program, nbytes, args, rng))
    except WrongResult as exc:
        print(f"WRONG RESULT: {exc}", file=sys.stderr)
        report["wrong_result"] = str(exc)
        status = 1
    finally:
        backend.close()
    report["seconds"] = time.perf_counter() - t0
    print(f"total {report['seconds']:.1f} s")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
