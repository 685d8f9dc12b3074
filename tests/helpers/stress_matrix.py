"""The GPU stress's configurations and the command line of each child (tests/stress.py), shared by
the GPU test that runs them and the CPU test that checks each command line parses as meant."""

from __future__ import annotations

import pathlib

STRESS = pathlib.Path(__file__).resolve().parents[1] / "stress.py"
# (backends on device 0, threads per backend, Knobs.stream_share_after: None the default (a
# stream per dispatch), 4 shared early so that the stress reaches it; Knobs.fence_on_demand)
MATRIX = [
    (1, 4, None, False),
    (2, 2, None, False),
    (3, 2, None, False),
    (3, 4, None, False),
    (3, 4, 4, False),
    (2, 3, None, True),
]
IDS = [f"{b}x{t}" + ("" if k is None else f"-share{k}") + ("-fence" if f else "") for b, t, k, f in MATRIX]


def child_args(seed: int, backends: int, threads: int, per_thread: int, share, fence: bool) -> list[str]:
    """The stress child's arguments (after the interpreter) for one configuration."""
    args = [
        str(STRESS),
        "--seed",
        str(seed),
        "--backends",
        str(backends),
        "--threads",
        str(threads),
        "--dispatches",
        str(per_thread),
        "--max-mib",
        "64",
        "--chunk-mib",
        "8",
        "--chunks",
        "4",
    ]
    if share is not None:
        args += ["--share-streams", str(share)]
    if fence:
        args.append("--fence-on-demand")
    return args
