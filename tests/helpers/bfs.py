"""The 2-phase BFS relaxation (tests/gpu/kernels/bfs.cu) as a Program, and graphs to run it on.

Phase 0 relaxes every node from its neighbours' distances into ``next``; phase 1 commits ``next``
into ``dist`` and counts the changes in ``state`` = [iterations, changed, commits]. One iteration of
the fixpoint loop is both phases, so after k iterations exactly the nodes within distance k of node
0 hold their distance (:meth:`Graph.expected`).
"""

from __future__ import annotations

import collections
import functools
import pathlib
from dataclasses import dataclass

import numpy as np

from vyre_cuda import BufferDecl, Kernel, Program

__all__ = ["BFS_SOURCE", "INF", "Graph", "bfs_program", "csr", "make_graph", "python_bfs"]

INF = 0xFFFFFFFF  # the distance of a node not reached (yet)
BFS_SOURCE = (pathlib.Path(__file__).resolve().parents[1] / "gpu" / "kernels" / "bfs.cu").read_text()


@functools.cache
def bfs_program(n: int) -> Program:
    """The 2-phase BFS relaxation of tests/gpu/kernels/bfs.cu for graphs of ``n`` nodes."""
    return Program(
        Kernel.cuda(BFS_SOURCE),
        [
            BufferDecl.read("row_ptr", 0, "u32", n + 1),
            BufferDecl.read("col_idx", 1, "u32"),
            BufferDecl.read_write("dist", 2, "u32", n),
            BufferDecl.output("next", 3, "u32", n),
            BufferDecl.output("state", 4, "u32", 3),
        ],
        workgroup_size=(256, 1, 1),
        grid_sync=True,
        phases=2,
        name="bfs_relax",
        launch="dist",  # one thread per node; col_idx (the edges) is longer on purpose
    )


def csr(n, src, dst):
    """``(row_ptr, col_idx)`` (u32) of the directed edges ``src[i] -> dst[i]`` over ``n`` nodes."""
    order = np.argsort(src, kind="stable")
    row_ptr = np.zeros(n + 1, dtype=np.uint32)
    row_ptr[1:] = np.cumsum(np.bincount(src, minlength=n))
    return row_ptr, np.ascontiguousarray(dst[order], dtype=np.uint32)


def python_bfs(row_ptr, col_idx, source=0):
    """Unit-weight distances from ``source`` (INF where unreachable), with collections.deque."""
    rp, ci = row_ptr.tolist(), col_idx.tolist()
    dist = [INF] * (len(rp) - 1)
    dist[source] = 0
    queue = collections.deque([source])
    while queue:
        v = queue.popleft()
        dv = dist[v] + 1
        for u in ci[rp[v] : rp[v + 1]]:
            if dist[u] == INF:
                dist[u] = dv
                queue.append(u)
    return np.array(dist, dtype=np.uint32)


@dataclass
class Graph:
    row_ptr: np.ndarray
    col_idx: np.ndarray
    dist0: np.ndarray
    ref: np.ndarray  # BFS distances from node 0
    depth: int  # largest finite distance

    @property
    def n(self):
        return len(self.dist0)

    @property
    def inputs(self):
        return [self.row_ptr, self.col_idx, self.dist0]

    def expected(self, iterations):
        """[dist, next, state] after ``iterations`` synchronous relaxation steps.

        After k steps exactly the nodes within distance k hold their distance, the rest INF; node
        v commits once, in step ref[v]; step k changed something iff some node lies at distance k.
        """
        k = iterations
        dist = np.where(self.ref <= k, self.ref, np.uint32(INF)).astype(np.uint32)
        commits = int(np.count_nonzero((self.ref >= 1) & (self.ref <= k)))
        changed = int(np.any(self.ref == k)) if k >= 1 else 0
        return [dist, dist.copy(), np.array([k, changed, commits], dtype=np.uint32)]


def make_graph(rng, n=20_000, degree=5, tail=300, unreachable=6):
    """A random undirected graph (``degree`` random edges per node), a path of ``tail`` nodes
    hanging off the node farthest from 0 (so the BFS depth is large), and a few unreachable nodes
    (one isolated pair, the rest isolated). Labels are shuffled, node 0 stays the source."""
    core = n - tail - unreachable
    src = rng.integers(0, core, core * degree)
    dst = rng.integers(0, core, core * degree)
    rp, ci = csr(core, np.concatenate([src, dst]), np.concatenate([dst, src]))
    d = python_bfs(rp, ci).astype(np.int64)
    anchor = int(np.argmax(np.where(d == INF, -1, d)))
    path = np.array([anchor, *range(core, core + tail)], dtype=np.int64)
    src = np.concatenate([src, path[:-1], [n - 2]])
    dst = np.concatenate([dst, path[1:], [n - 1]])
    perm = np.concatenate([[0], 1 + rng.permutation(n - 1)])
    src, dst = perm[src], perm[dst]
    row_ptr, col_idx = csr(n, np.concatenate([src, dst]), np.concatenate([dst, src]))
    ref = python_bfs(row_ptr, col_idx)
    depth = int(ref[ref != INF].max())
    dist0 = np.full(n, INF, dtype=np.uint32)
    dist0[0] = 0
    return Graph(row_ptr, col_idx, dist0, ref, depth)
