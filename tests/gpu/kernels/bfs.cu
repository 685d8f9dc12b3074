// BFS-style relaxation on a CSR graph as a 2-phase grid-sync program (tests only).
//
// Bindings: 0 row_ptr (u32, n + 1), 1 col_idx (u32), 2 dist (u32, n, read-write),
//           3 next (u32, n, output scratch), 4 state (u32, 3, output).
// One fixpoint iteration = phase 0 then phase 1:
//   0: next[v] = min(dist[v], min over neighbours u of dist[u] + 1)   (a synchronous, Jacobi step)
//      and thread 0 clears this iteration's changed flag;
//   1: commit next into dist, count the commits, raise the changed flag, count the iteration.
// state[0] = iterations run, state[1] = whether the last iteration changed anything,
// state[2] = total commits (each reachable node but the source commits exactly once).
// Every loop is grid-stride, so any grid size works (one launch per phase when host-split).
// Values written by other blocks in an earlier phase (or launch) are read with __ldcg, past L1.
#include "vyre_cuda.cuh"

#define BFS_INF 0xFFFFFFFFu

VYRE_KERNEL vyre_main(const vyre_u32* row_ptr, const vyre_u32* col_idx, vyre_u32* dist,
                      vyre_u32* next, vyre_u32* state, const vyre_u32* params) {
  const vyre_u32 n = vyre_binding_count(params, 2);
  const vyre_u64 first = vyre_global_id();
  const vyre_u64 stride = vyre_global_threads();
  const vyre_u32 end = vyre_phase_end(params);
  for (vyre_u32 ph = vyre_phase_begin(params); ph < end; ++ph) {
    if (ph == 0) {
      if (first == 0) state[1] = 0u;
      for (vyre_u64 v = first; v < n; v += stride) {
        vyre_u32 best = __ldcg(&dist[v]);
        const vyre_u32 lo = row_ptr[v], hi = row_ptr[v + 1];
        for (vyre_u32 e = lo; e < hi; ++e) {
          const vyre_u32 du = __ldcg(&dist[col_idx[e]]);
          if (du != BFS_INF && du + 1u < best) best = du + 1u;
        }
        next[v] = best;
      }
    } else {
      vyre_u32 commits = 0;
      for (vyre_u64 v = first; v < n; v += stride) {
        const vyre_u32 nv = __ldcg(&next[v]);
        if (nv != __ldcg(&dist[v])) {
          dist[v] = nv;
          ++commits;
        }
      }
      if (commits) {
        atomicAdd(&state[2], commits);
        atomicExch(&state[1], 1u);
      }
      if (first == 0) atomicAdd(&state[0], 1u);
    }
    // exactly phases - 1 barriers per launch, reached unconditionally by every block
    if (ph + 1 < end) vyre_grid_sync();
  }
}
