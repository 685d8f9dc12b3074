# cython: language_level=3
"""The prepared plan: a frozen planning DispatchPlan as C structs, made once per plan key.

:meth:`Prepared.from_plan` is the core's only conversion of a plan, and decides nothing; the hot
path reads only these C fields.
"""

cimport cython
import struct

from .program import BindingRole
from .planning.binding import input_spec
from ._accounting import align_up, bucket_size
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._windows cimport Source, SRC_ZERO, SRC_INPUT, SRC_PARAMS
from ._launch cimport GraphCache, GRAPH_EXECS, TRIAL_WARMUP, TRIAL_SAMPLES
from ._driver cimport bind_context
from ._pools cimport lock_with_gil

cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    void a_store "vyre::store"(int* p, int v)
    bint a_cas "vyre::cas"(int* p, int expected, int desired)


@cython.final
cdef class ResidentBlocks:
    """The resident params blocks of one backend's plans (``Prepared.resident``).

    A block is freed when its plan dies (every dispatch holds its plan until its GPU work is
    done); ``close()`` frees the rest once the device is idle, ``forget()`` with no driver call
    (context lost). The table is under ``mu``; frees run after it, without the GIL."""

    def __cinit__(self, uintptr_t ctx):
        self.ctx = <cydriver.CUcontext>ctx
        self.alive = True
        self.live = {}

    cdef int upload(self, Prepared p, StreamPool spool) except -1:
        """At a plan's first params-only dispatch: its params blocks uploaded to a block kept for
        its life (``p.resident``), synchronously (a pageable copy completes with its stream). On
        failure the plan stays on its params-only slab."""
        cdef cydriver.CUdeviceptr block = 0
        cdef cydriver.CUstream s = NULL
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef const char* src
        cdef size_t n = p.compact_upload_end
        cdef bint kept
        if not a_cas(&p.resident_state, 0, 1):
            return 0  # (another thread claimed it: this dispatch takes the params-only slab)
        if p.compact_image is None or self.ctx == NULL or n == 0:
            return 0
        src = p.compact_image
        bind_context(self.ctx)
        try:
            spool.acquire_stream(&s, False)  # (synchronised below: no one else's work on it)
        except BaseException:
            return 0
        with nogil:
            st = cydriver.cuMemAlloc(&block, n)
            if st == cydriver.CUDA_SUCCESS:
                st = cydriver.cuMemcpyHtoDAsync(block, src, n, s)
                if st == cydriver.CUDA_SUCCESS:
                    st = cydriver.cuStreamSynchronize(s)
        spool.release_stream(s)
        lock_with_gil(self.mu)
        kept = st == cydriver.CUDA_SUCCESS and self.alive
        if kept:
            self.live[<uintptr_t>block] = n  # (an int key: no Python code runs under the lock)
        self.mu.unlock()
        if not kept:
            if block:
                with nogil:
                    cydriver.cuMemFree(block)
            return 0
        p.resident_owner = self
        p.resident = block
        a_store(&p.resident_state, 2)  # (after both fields: a dispatch that reads 2 finds them set)
        return 0

    cdef void free_block(self, cydriver.CUdeviceptr ptr) noexcept:
        cdef cydriver.CUcontext prev
        lock_with_gil(self.mu)
        held = self.alive and self.live.pop(<uintptr_t>ptr, None) is not None
        self.mu.unlock()
        if held:  # (not alive: the context went away, and the block with it)
            with nogil:
                if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                    cydriver.cuMemFree(ptr)
                    cydriver.cuCtxPopCurrent(&prev)

    @property
    def nbytes(self):
        lock_with_gil(self.mu)
        n = sum(self.live.values())
        self.mu.unlock()
        return n

    def close(self):
        """Free every block (the device is idle: no dispatch runs and none can start)."""
        cdef vector[uintptr_t] ptrs
        cdef size_t i
        lock_with_gil(self.mu)
        blocks, self.live = self.live, {}
        self.alive = False
        self.mu.unlock()
        for ptr in blocks:
            ptrs.push_back(<uintptr_t>ptr)
        if not ptrs.empty():
            bind_context(self.ctx)
            with nogil:
                for i in range(ptrs.size()):
                    cydriver.cuMemFree(<cydriver.CUdeviceptr>ptrs[i])

    def forget(self):
        lock_with_gil(self.mu)
        self.alive = False
        self.live = {}
        self.mu.unlock()


@cython.final
cdef class Prepared:
    """A dispatch planned once, as C data: the core's only conversion of a DispatchPlan."""

    def __init__(self):
        raise TypeError("Prepared is made by Prepared.from_plan(plan) from a planning DispatchPlan")

    @staticmethod
    def from_plan(plan):
        """Convert a :class:`vyre_cuda.planning.dispatch.DispatchPlan` (every decision is the
        plan's; nothing is decided here)."""
        cdef Prepared self = Prepared.__new__(Prepared)
        cdef InputCheck ic
        cdef Segment seg
        cdef DevArg da
        cdef OutCheck oc
        cdef bint zero
        layout, launch, route, config = plan.layout, plan.launch, plan.route, plan.config
        if plan.arg_count > MAX_ARGS:  # planning refuses these; the arrays below hold MAX_ARGS
            raise ValueError(f"{plan.arg_count} kernel arguments exceed {MAX_ARGS}")
        self.n_inputs = len(layout.inputs)
        for (index, offset, nbytes, zero_end), (itemsize, kind) in zip(layout.inputs, plan.input_specs):
            ic.index = index
            ic.itemsize = itemsize
            ic.kind = ord(kind) if kind else 0
            self.checks.push_back(ic)
        device_inputs = sorted({index for _, index, _, _ in layout.device_args})
        for index in device_inputs:
            itemsize, kind = input_spec(plan.program.inputs[index])
            ic.index = index
            ic.itemsize = itemsize
            ic.kind = ord(kind) if kind else 0
            self.dev_checks.push_back(ic)
        for (want, _), (_, need) in zip(plan.output_specs, layout.outputs):
            oc.kind = ord({"b": "u", "V": "u"}.get(want.kind, want.kind))
            oc.itemsize = want.itemsize
            oc.nbytes = need
            self.out_checks.push_back(oc)
        self.params_blob = layout.params_blob
        self.params_ptr = <const char*>self.params_blob
        self.params_len = len(self.params_blob)
        self.upload_end = layout.upload_end
        # the upload region as sorted runs covering [0, upload_end) exactly: inputs, their zeroed
        # tails, the params blocks, zeroed small outputs; any gap is zeroed too
        runs = []
        for index, offset, nbytes, zero_end in layout.inputs:
            runs.append((offset, nbytes, SRC_INPUT, index, 0))
            runs.append((offset + nbytes, zero_end - offset - nbytes, SRC_ZERO, -1, 0))
        runs.append((layout.params_offsets[0], self.params_len, SRC_PARAMS, -1, 0))
        self._cover(runs)
        for offset, nbytes in layout.readbacks:
            seg.offset = offset
            seg.nbytes = nbytes
            self.readbacks.push_back(seg)
        for offset, nbytes in layout.outputs:
            seg.offset = offset
            seg.nbytes = nbytes
            self.outputs.push_back(seg)
        for off in layout.arg_offsets:
            self.arg_offsets.push_back(off)
        for off in layout.params_offsets:
            self.params_offsets.push_back(off)
        self.slab_bytes = layout.slab_bytes
        self.ring = not plan.mirror
        self.bucket = plan.device_block
        self.staging_block = plan.staging_block
        self.audit_offset = plan.audit_offset
        self.clear_begin, self.clear_end = layout.clear
        for k in range(3):
            self.grid[k] = launch.grid[k]
            self.block[k] = launch.block[k]
        self.shared_bytes = launch.shared_bytes
        self.iterations = config.iterations
        self.route = {"regular": ROUTE_REGULAR, "cooperative": ROUTE_COOPERATIVE, "split": ROUTE_SPLIT,
                      "streamed": ROUTE_STREAMED}[route.kind]
        self.route_name = route.kind
        self.route_reason = route.reason
        self.function = <cydriver.CUfunction><uintptr_t>plan.function
        self.barrier = <cydriver.CUdeviceptr>plan.barrier
        self.barrier_ceiling = plan.barrier_ceiling
        self.out_dtypes = [d for d, _ in plan.output_specs]
        self.out_typenums = [d.num for d, _ in plan.output_specs]
        self.out_counts = [c for _, c in plan.output_specs]
        self.coop = plan.gate
        self.coop_order = &self.coop.order if self.coop is not None else NULL
        if plan.graph or plan.graph_trial:
            self.graphs = new GraphCache(GRAPH_EXECS)
        if plan.graph_trial:
            self.trial_left = TRIAL_WARMUP + 2 * TRIAL_SAMPLES
        self.label = config.label
        self.timeout = config.timeout
        self.plan = plan
        n_phases = len(layout.params_offsets)
        self.tel_h2d_bytes = layout.h2d_bytes
        self.tel_h2d_ops = 1 if layout.upload_end else 0
        self.tel_d2h_bytes = layout.d2h_bytes
        self.tel_d2h_ops = len(layout.readbacks)
        self.tel_param_bytes = len(layout.params_blob)
        per_iter = n_phases if self.route == ROUTE_SPLIT else 1
        self.tel_launches = per_iter * self.iterations
        self.tel_memsets = (1 if self.clear_end > self.clear_begin else 0) + (
            self.iterations if self.route == ROUTE_COOPERATIVE and self.barrier else 0)
        for arg, index, offset, nbytes in layout.device_args:
            da.arg, da.input, da.offset, da.nbytes = arg, index, offset, nbytes
            self.dev_args.push_back(da)
        stream = config.stream  # the plan key's config holds the stream's handle (an int)
        self.ext = stream is not None
        self.ext_stream = <cydriver.CUstream><uintptr_t>(stream or 0)
        self.device_outputs = config.outputs == "device"
        # a device output may take the kernel's writes directly when the slab region it replaces
        # is exactly its buffer (no byte range) and it is not also an input
        position = {slot.binding: k for k, slot in enumerate(plan.bindings.slots)}
        for slot, (_, nbytes) in zip(plan.bindings.outputs, layout.outputs):
            whole = slot.decl.output_byte_range is None and nbytes == slot.byte_len
            self.out_args.push_back(position[slot.binding] if whole and slot.role is BindingRole.OUTPUT else -1)
            zero = slot.role is not BindingRole.OUTPUT or bool(slot.decl.zeroed)
            self.out_zero.push_back(zero)  # (through a typed local: a conditional expression here
            # became a dangling temporary reference in Cython's C++)
        self._compact_from(layout)
        if self.route == ROUTE_STREAMED:
            self._streamed_from(plan.stream)
        return self

    cdef int _compact_from(self, layout) except -1:
        # the layout's params-only slab (every output written in place), for the plain route
        # (cooperative launches read a barrier counter back through the full slab's staging)
        cdef size_t end = layout.params_only_bytes
        self.compact_bucket = 0
        self.compact_upload_end = 0
        self.compact_staging = 0
        self.compact_image = None
        if end == 0 or self.route != ROUTE_REGULAR or self.coop is not None:
            return 0
        if self.ring and end != self.upload_end:
            return 0  # (the ring uploads every source: the upload must end with the params)
        self.compact_upload_end = end
        self.compact_bucket = bucket_size(align_up(end, 256))
        self.compact_staging = bucket_size(align_up(end, 256)) if self.ring else self.staging_block
        self.compact_image = self._params_image(end)
        return 0

    cdef bytes _params_image(self, size_t end):
        # the bytes [0, end) of the upload: params blocks and the zeros between them (None if an
        # input's bytes fall there: its plan cannot keep them resident)
        cdef Source src
        image = bytearray(end)
        for src in self.sources:
            if src.offset >= end:
                break
            if src.kind == SRC_INPUT:
                return None
            if src.kind == SRC_PARAMS:
                image[src.offset:src.offset + src.n] = self.params_blob[src.src_offset:src.src_offset + src.n]
        return bytes(image)

    def _cover(self, runs):
        """``sources``: the (offset, bytes, kind, input, src offset) ``runs`` sorted, cut at
        ``upload_end`` and with every gap zeroed, so they cover [0, upload_end) exactly."""
        cdef Source src
        cursor = 0
        self.sources.clear()
        for offset, nbytes, kind, index, src_offset in sorted(runs):
            if nbytes <= 0 or offset >= self.upload_end:
                continue
            if offset > cursor:
                src.offset, src.n, src.kind, src.index, src.src_offset = cursor, offset - cursor, SRC_ZERO, -1, 0
                self.sources.push_back(src)
            nbytes = min(nbytes, self.upload_end - offset)
            src.offset, src.n, src.kind, src.index, src.src_offset = offset, nbytes, kind, index, src_offset
            self.sources.push_back(src)
            cursor = offset + nbytes
        if cursor < self.upload_end:
            src.offset, src.n, src.kind, src.index, src.src_offset = cursor, self.upload_end - cursor, SRC_ZERO, -1, 0
            self.sources.push_back(src)

    def _streamed_from(self, stream):
        """The streamed route's C data from its :class:`~vyre_cuda.planning.stream.StreamPlan`."""
        cdef StreamCut cut
        cdef StreamWhole whole
        cdef ChunkShape* shape
        cdef size_t up = 0, rb = 0
        self.streamed = True
        self.ring = True  # page-locked inputs and outputs DMA directly; the rest is staged
        self.s_streams = stream.streams
        self.s_direct_streams = stream.direct_streams
        self.s_chunks = stream.chunk_count
        self.s_chunk_rows = stream.chunk_rows
        self.s_shared = stream.shared_bytes
        self.s_slot = stream.slot_bytes
        self.bucket = stream.device_bytes
        self.slab_bytes = stream.device_bytes
        # the shared region: inputs that go whole (zero-padded), then both params blocks, once
        # (each zero-padded to 16 bytes, as the device header promises kernels)
        p_full, p_last = stream.full.params_offset, stream.last.params_offset
        blob = bytearray(p_last - p_full + (4 * len(stream.last.params) + 15) // 16 * 16)
        for launch in (stream.full, stream.last):
            at = launch.params_offset - p_full
            blob[at:at + 4 * len(launch.params)] = struct.pack(f"<{len(launch.params)}I", *launch.params)
        self.params_blob = bytes(blob)
        self.params_ptr = <const char*>self.params_blob
        self.params_len = len(self.params_blob)
        self.upload_end = stream.shared_bytes
        runs = [(p_full, self.params_len, SRC_PARAMS, -1, 0)]
        memsets = [0, 0]  # per full chunk, for the last chunk
        for arg, b in enumerate(stream.bindings):
            if not b.cut:
                whole.arg, whole.offset = arg, b.region_offset
                self.s_whole.push_back(whole)
                runs.append((b.region_offset, b.total_bytes, SRC_INPUT, b.input_index, 0))
                continue
            cut.arg, cut.input, cut.output = arg, b.input_index, b.output_index
            cut.upload, cut.readback, cut.clear = b.upload, b.readback, b.clear
            cut.row_bytes = b.row_elements * b.itemsize
            cut.region_offset = b.region_offset
            cut.up_offset, cut.rb_offset = up, rb
            if b.upload:
                up += b.region_bytes
            if b.readback:
                rb += b.region_bytes
            self.s_cut.push_back(cut)
            for k, rows in enumerate((stream.chunk_rows, stream.last.rows)):
                n = rows * cut.row_bytes
                memsets[k] += 1 if cut.clear or (cut.upload and n % 16) else 0
        self._cover(runs)
        self.s_up, self.s_rb = up, rb
        self.staging_block = stream.streams * (up + rb)
        for which, launch in enumerate((stream.full, stream.last)):
            shape = &self.s_full if which == 0 else &self.s_last
            shape.rows = launch.rows
            for k in range(3):
                shape.grid[k] = launch.grid[k]
            shape.params_offset = launch.params_offset
        self.tel_h2d_bytes = stream.h2d_bytes
        self.tel_d2h_bytes = stream.d2h_bytes
        self.tel_param_bytes = self.params_len
        self.tel_launches = stream.chunk_count * self.iterations
        self.tel_d2h_ops = stream.chunk_count * sum(1 for b in stream.bindings if b.cut and b.readback)
        self.tel_memsets = (stream.chunk_count - 1) * memsets[0] + memsets[1]

    def __dealloc__(self):
        # the resident params block: no dispatch holds this plan, so none reads it (its owner
        # makes no driver call once the backend closed or lost its context)
        if self.resident and self.resident_owner is not None:
            self.resident_owner.free_block(self.resident)
        # Core.clear_prepared / forget_context released every exec of a plan the core dispatched
        # (with or without driver calls); a plan never registered there never captured. So no
        # driver call here: this may run after the context is gone.
        if self.graphs != NULL:
            self.graphs.take_all()
            del self.graphs
            self.graphs = NULL

    def release_graphs(self, bint destroy=True):
        """Destroy (or, when the context is gone, forget) every graph exec of this plan and stop
        capturing new ones; returns how many there were. Waits for a dispatch using them."""
        cdef vector[void*] execs
        cdef void* capture_stream
        cdef size_t i
        if self.graphs == NULL:
            return 0
        with nogil:  # a dispatch may hold the lock while a launch hook needs the GIL (fake driver)
            self.graphs.lock()
            execs = self.graphs.take_all()
            capture_stream = self.graphs.take_capture_stream()
            self.graphs.unlock()
            if destroy:
                # an exec still running is freed when it completes (cuGraphExecDestroy)
                for i in range(execs.size()):
                    cydriver.cuGraphExecDestroy(<cydriver.CUgraphExec>execs[i])
                if capture_stream != NULL:  # only captures ran on it, all ended
                    cydriver.cuStreamDestroy(<cydriver.CUstream>capture_stream)
        return execs.size()

    @property
    def graph_trial_left(self):
        """Blocking dispatches left before this plan's graph-or-issued trial decides (0: decided
        or no trial); ``graph_choice`` then says what was kept and why."""
        return self.trial_left

    @property
    def graph_execs(self):
        """Instantiated graph execs this plan holds now (0 without graph replay)."""
        if self.graphs == NULL:
            return 0
        return self.graphs.size()

    @property
    def graphed(self):
        """True when this plan replays its launches as a CUDA graph (capture has not failed, and a
        trial, if any, kept the graph)."""
        return (self.graphs != NULL and not self.graphs.disabled and not self.graphs.closed
                and not self.graph_off and self.trial_left == 0)

    @property
    def slab_bytes_(self):
        """Bytes of the device slab."""
        return self.slab_bytes

    @property
    def params_only_bucket(self):
        """The device block of a dispatch writing every output in place (0: none can)."""
        return self.compact_bucket

    @property
    def chunk_count(self):
        """Chunks of the streamed route (0 on every other route)."""
        return self.s_chunks

    @property
    def route_kind(self):
        return self.route_name

    @property
    def staged_through_ring(self):
        """True when the dispatch streams through the transfer engine's ring (large slabs)."""
        return self.ring

    @property
    def gate(self):
        return self.coop

    def launch_geometry(self):
        return (tuple(self.grid[k] for k in range(3)), tuple(self.block[k] for k in range(3)), self.shared_bytes)

    def upload_runs(self):
        """(offset, bytes, kind, input index) runs of the upload region, for tests."""
        return [(s.offset, s.n, ("zero", "input", "params")[s.kind], s.index) for s in self.sources]
