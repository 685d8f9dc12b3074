"""C stacks for crashing test children: :func:`preload_env` builds ``segv_trace.c`` (once per
folder) and returns the environment that preloads it, so a child dying on a fatal signal prints
its faulting thread's C stack after faulthandler's Python stacks (run the child with
``-X faulthandler``). Without a C compiler it returns the environment unchanged."""

from __future__ import annotations

import os
import pathlib

SOURCE = pathlib.Path(__file__).with_name("segv_trace.c")


def preload_env(folder: pathlib.Path, env: dict) -> dict:
    import fakecuda

    if fakecuda.compiler() is None:
        return env
    lib = fakecuda._compile_once(folder, "segv-", [SOURCE], "libsegv_trace.so", ([], []), "the crash tracer")
    preload = os.pathsep.join(filter(None, [str(lib / "libsegv_trace.so"), env.get("LD_PRELOAD")]))
    return dict(env, LD_PRELOAD=preload)
