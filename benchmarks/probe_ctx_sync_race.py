"""Does this driver survive cuCtxSynchronize on one thread while other threads create and destroy
streams? A probe of the driver alone (no vyre_cuda), run in a child process per variant so that a
crash is counted, not fatal.

    python benchmarks/probe_ctx_sync_race.py [--seconds 20] [--threads 4] [--runs 3]

Variants (the syncing thread's call, while the workers create a stream, queue memsets on it and
destroy it, with the work still pending or after a cuStreamSynchronize):
- ctx_sync: cuCtxSynchronize in a loop;
- event_sync: an event recorded on a stream of the syncing thread's own, then cuEventSynchronize
  (the control: per-stream waits);
- ctx_sync_capture: cuCtxSynchronize in a loop while each worker, between its memsets, captures a
  memset into a graph on a second stream of its own (thread-local capture mode, as vyre_cuda's
  graph trial does), launches the graph on the first stream and destroys it; the synchronize's
  refusals during a capture, and the captures it breaks, are counted, not raised;
- ctx_sync_gated: as ctx_sync_capture, but the synchronize and the capture (begin to end) hold one
  lock, as vyre_cuda's capture gate keeps them apart; the graph's instantiation, launch and
  destruction run outside it, beside the synchronize;
- ctx_sync_gated_all: the lock also covers the instantiation, launch and destruction (nothing of
  the graph's beside a synchronize);
- pool_churn: no capture; each worker also makes a stream-ordered memory pool of its own per
  round, allocates from it and frees into it on its stream a few times, and destroys it (the
  frees still pending, or after a stream synchronize), while the syncing thread calls
  cuCtxSynchronize (as a backend's close() destroys its pool beside another backend's
  dispatches and a DeviceArray pool's synchronize);
- pool_churn_nosync: the same with the event control instead of cuCtxSynchronize (pools alone).
Prints one JSON line per run: variant, exit code (-11 is SIGSEGV), syncs and streams made.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time


def child(variant: str, seconds: float, nthreads: int, pending: bool) -> None:
    from cuda.bindings import driver as d

    def ok(r):
        err = r[0] if isinstance(r, tuple) else r
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(str(err))
        return r[1] if isinstance(r, tuple) and len(r) == 2 else None

    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))
    nbytes = 64 << 20
    stop = time.monotonic() + seconds
    made = [0]
    syncs = [0]
    lock = threading.Lock()

    broken = [0]

    gate = threading.Lock()  # the gated variants' capture gate
    gated = variant.startswith("ctx_sync_gated")

    def capture(cs, s, buf):
        # a memset captured on cs, the graph launched on s, then destroyed (its launch pending)
        if variant == "ctx_sync_gated_all":
            with gate:
                return capture_ungated(cs, s, buf, gated=False)
        return capture_ungated(cs, s, buf, gated=gated)

    def capture_ungated(cs, s, buf, gated):
        if gated:
            gate.acquire()
        ok(d.cuStreamBeginCapture(cs, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        d.cuMemsetD32Async(buf, 1, 1024, cs)
        err, graph = d.cuStreamEndCapture(cs)
        if gated:
            gate.release()
        if err != d.CUresult.CUDA_SUCCESS:
            with lock:
                broken[0] += 1
            return
        err, exe = d.cuGraphInstantiate(graph, 0)
        if err == d.CUresult.CUDA_SUCCESS:
            ok(d.cuGraphLaunch(exe, s))
            ok(d.cuGraphExecDestroy(exe))
        ok(d.cuGraphDestroy(graph))

    churn = variant.startswith("pool_churn")

    def pool_round(s):
        # a pool of this worker's own: alloc, memset, free on s, then destroyed
        props = d.CUmemPoolProps()
        props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 0
        pool = ok(d.cuMemPoolCreate(props))
        for k in range(4):
            p = ok(d.cuMemAllocFromPoolAsync(1 << 20, pool, s))
            ok(d.cuMemsetD32Async(p, k, (1 << 20) // 4, s))
            ok(d.cuMemFreeAsync(p, s))
        if not pending:
            ok(d.cuStreamSynchronize(s))
        ok(d.cuMemPoolDestroy(pool))

    def worker():
        ok(d.cuCtxSetCurrent(ctx))
        buf = ok(d.cuMemAlloc(nbytes))
        n = 0
        cs = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING))
        while time.monotonic() < stop:
            s = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING))
            for _ in range(4):
                ok(d.cuMemsetD32Async(buf, n & 0xFF, nbytes // 4, s))
            if variant == "ctx_sync_capture" or gated:
                capture(cs, s, buf)
            if churn:
                pool_round(s)
            if not pending:
                ok(d.cuStreamSynchronize(s))
            ok(d.cuStreamDestroy(s))  # (pending work completes; the stream's resources go after)
            n += 1
        ok(d.cuCtxSynchronize())
        ok(d.cuStreamDestroy(cs))
        ok(d.cuMemFree(buf))
        with lock:
            made[0] += n

    def syncer():
        ok(d.cuCtxSetCurrent(ctx))
        own = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING))
        ev = ok(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        while time.monotonic() < stop:
            if gated:
                with gate:
                    err = d.cuCtxSynchronize()[0]
                if err != d.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(str(err))
            elif variant.startswith("ctx_sync") or variant == "pool_churn":
                err = d.cuCtxSynchronize()[0]
                if err != d.CUresult.CUDA_SUCCESS and variant == "ctx_sync":
                    raise RuntimeError(str(err))
            else:
                ok(d.cuEventRecord(ev, own))
                ok(d.cuEventSynchronize(ev))
            syncs[0] += 1
            time.sleep(0.0002)
        ok(d.cuEventDestroy(ev))
        ok(d.cuStreamDestroy(own))

    threads = [threading.Thread(target=worker) for _ in range(nthreads)] + [threading.Thread(target=syncer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"syncs": syncs[0], "streams_made": made[0], "captures_broken": broken[0]}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", default="ctx_sync,event_sync,ctx_sync_capture")
    ap.add_argument("--child", default=None)
    ap.add_argument("--pending", type=int, default=1)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.seconds, args.threads, bool(args.pending))
        return 0
    for variant in args.variants.split(","):
        for pending in (1, 0):
            for run in range(args.runs):
                p = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        variant,
                        "--seconds",
                        str(args.seconds),
                        "--threads",
                        str(args.threads),
                        "--pending",
                        str(pending),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=args.seconds * 4 + 60,
                )
                last = (p.stdout.strip().splitlines() or ["{}"])[-1]
                try:
                    counts = json.loads(last)
                except ValueError:
                    counts = {}
                print(
                    json.dumps(
                        {
                            "variant": variant,
                            "pending_at_destroy": bool(pending),
                            "run": run,
                            "rc": p.returncode,
                            **counts,
                            "stderr": p.stderr.strip()[-300:],
                        }
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
