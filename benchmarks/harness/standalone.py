"""The tight floor in a process of its own: ``standalone_floor.c``, built with the C compiler at run
time and driven beside the profile.

The in-process floor (:meth:`vyre_cuda.profile._floor.Floor.tight`) runs inside a Python process
whose interpreter, threads and allocations may slow it; the standalone process makes the same
driver calls with nothing else in it. The profile compares the two (target ``floor_vs_standalone``).

The program is compiled once per source and compiler into ``<cache_dir>/floor/`` (see
:func:`vyre_cuda.compile.cache_dir`), needs no CUDA header and links no libcuda: it loads the driver
library the profile's own process loaded (else the one ``ldconfig`` knows) with ``dlopen``.
Where there is no C compiler or no driver library, :class:`StandaloneFloor` raises
:class:`~vyre_cuda.errors.UnsupportedFeature` saying which, and the profile reports the target as
not measured with that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import platform
import re
import shutil
import subprocess
import tempfile

from vyre_cuda.errors import BackendError, UnsupportedFeature

__all__ = [
    "open_standalone",
    "GRAPH_SKIP",
    "GROUP",
    "SERIES",
    "SERIES_FAMILIES",
    "SOURCE",
    "StandaloneFloor",
    "build",
    "compiler",
    "find_libcuda",
]

SOURCE = pathlib.Path(__file__).with_name("standalone_floor.c")
# the program's series names -> the profile's series keys
SERIES = {
    **{w: f"floor.standalone.{w}" for w in ("spin", "event", "stream")},
    **{f"graph.{w}": f"floor.standalone_graph.{w}" for w in ("spin", "event", "stream")},
}
SERIES_FAMILIES = ("floor.standalone", "floor.standalone_graph")  # the fastest wait of each (tight.add_fastest)
# the names the profile's ``skipped`` gives the process, and its graph replay alone
GROUP = "standalone floor"
GRAPH_SKIP = "standalone floor graph"
_LIBCUDA = re.compile(r"/libcuda\.so(\.\d+)*\Z")


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH (None: none)."""
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def find_libcuda() -> str | None:
    """The CUDA driver library this process loaded (``/proc/self/maps``), else the
    ``libcuda.so.1`` that ``ldconfig -p`` lists; None when neither names one."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if _LIBCUDA.search(path) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.isfile(p)), None
    )
    if ldconfig is None:
        return None
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libcuda.so.1 ") and os.path.isfile(path):
            return path
    return None


def _folder() -> pathlib.Path:
    from vyre_cuda.compile.cache import cache_dir

    return cache_dir() / "floor"


def build(folder=None) -> pathlib.Path:
    """Compile ``standalone_floor.c`` into ``folder`` (default ``<cache_dir>/floor``) once per
    source and compiler; return the program's path.

    Raises UnsupportedFeature without a C compiler, BackendError with the compiler's output when
    the build fails.
    """
    cc = compiler()
    if cc is None:
        raise UnsupportedFeature(
            "no C compiler (cc, gcc or clang, or $CC) on the PATH to build the standalone floor process",
            "install a C compiler (e.g. apt-get install gcc), or set CC to one",
        )
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + cc.encode() + platform.machine().encode()).hexdigest()[:16]
    folder = pathlib.Path(folder) if folder is not None else _folder()
    target = folder / f"standalone_floor-{digest}"
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsupportedFeature(
            f"cannot create the folder {str(folder)!r} for the standalone floor program ({exc.strerror or exc})",
            "set VYRE_CUDA_CACHE_DIR to a writable folder",
        ) from None
    tmp = folder / f"{target.name}.{os.getpid()}"  # renamed into place: a parallel build never sees half a file
    cmd = [cc, "-O2", "-std=c11", "-o", str(tmp), str(SOURCE), "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        with contextlib.suppress(OSError):
            tmp.unlink()
        log = (proc.stdout + proc.stderr).strip()[-2000:]
        raise BackendError(
            f"building the standalone floor failed ({' '.join(cmd)}):\n{log}",
            "check that the C compiler works (it needs no CUDA header), or set CC to another one",
        )
    os.replace(tmp, target)
    return target


class StandaloneFloor:
    """The standalone floor process for one buffer size, started and set up once (context,
    module, buffers), then asked for rounds of samples with :meth:`run`.

    Parameters
    ----------
    image : bytes
        The compiled ``vecadd`` of :data:`vyre_cuda.profile._floor.FLOOR_SOURCE` (cubin, fatbin or PTX).
    nbytes : int
        Bytes per buffer.
    device : int
        The CUDA device ordinal.
    libcuda : str, optional
        The driver library to load (default: :func:`find_libcuda`).
    skipped : dict, optional
        Where :meth:`run` records why the graph replay was not measured (key :data:`GRAPH_SKIP`).
    """

    def __init__(self, image, nbytes, device=0, libcuda=None, skipped=None):
        self.nbytes = int(nbytes)
        self.skipped = {} if skipped is None else skipped
        self._proc: subprocess.Popen[str] | None = None
        libcuda = libcuda or find_libcuda()
        if libcuda is None:
            raise UnsupportedFeature(
                "no CUDA driver library found for the standalone floor process (none loaded in this "
                "process, none listed by ldconfig -p)",
                "install the NVIDIA driver, or run where `ldconfig -p` lists libcuda.so.1",
            )
        program = build()
        fd, image_path = tempfile.mkstemp(suffix=".image", dir=program.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(image))
            # stderr to a file: a pipe nobody reads could fill and stall the process
            self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
            self._proc = subprocess.Popen(
                [str(program), libcuda, image_path, str(self.nbytes), str(int(device))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
            )
            first = self._line()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(image_path)  # read at start-up
        if first != "ready":
            self.close()
            raise BackendError(
                f"the standalone floor process did not start: {first.removeprefix('error ')}",
                "run `vyre-cuda info` to check the driver; the in-process floor rows are unaffected",
            )

    def _line(self) -> str:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return "error the process was closed"
        line = proc.stdout.readline()
        if not line:
            code = proc.wait(timeout=60)
            self._stderr.seek(0)
            tail = self._stderr.read()[-1000:].strip()
            return f"error the process exited with status {code}" + (f" ({tail})" if tail else "")
        return line.rstrip("\n")

    def run(self, count, warmup=0) -> dict:
        """``count`` timed round trips per series (after ``warmup`` untimed ones) in the process:
        ``{series key: [ns, ...]}`` for the issued series and, where the capture works, the graph
        replays. Raises BackendError when the process fails or reports a wrong result."""
        proc = self._proc
        if proc is None or proc.poll() is not None or proc.stdin is None:
            raise BackendError("the standalone floor process is not running", "start a new StandaloneFloor")
        try:
            proc.stdin.write(f"run {int(count)} {int(warmup)}\n")
            proc.stdin.flush()
        except OSError:
            pass  # it exited: its reason is on its output
        out: dict = {}
        while True:
            line = self._line()
            if line == "done":
                return out
            name, _, rest = line.partition(" ")
            if name == "error":
                raise BackendError(
                    f"the standalone floor process failed: {rest}",
                    "run `vyre-cuda info` to check the driver; the in-process floor rows are unaffected",
                )
            if name == "skip":
                self.skipped[GRAPH_SKIP] = "capture failed: " + rest.removeprefix("graph ")
                continue
            if name not in SERIES:
                raise BackendError(
                    f"the standalone floor process wrote an unknown line: {line[:200]!r}",
                    "rebuild it: delete the standalone_floor-* programs under the cache folder",
                )
            out[SERIES[name]] = [int(v) for v in rest.split()]

    def close(self) -> None:
        """Ask the process to free everything and exit; kill it when it does not within 30 s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.write("quit\n")
                    proc.stdin.flush()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            for stream in (proc.stdin, proc.stdout, self._stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def open_standalone(image, nbytes, device, skipped) -> StandaloneFloor | None:
    """The standalone floor process for ``nbytes``, or None with the reason in
    ``skipped["standalone floor"]`` (no C compiler, no driver library, a failed start)."""
    try:
        return StandaloneFloor(image, nbytes, device, skipped=skipped)
    except (BackendError, OSError) as exc:
        reason = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        skipped[GROUP] = reason.splitlines()[0]
        return None
