# cython: language_level=3
"""Driver access: initialisation, device attributes, contexts, modules, and the one error checker."""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset
from posix.time cimport clock_gettime, nanosleep, timespec, CLOCK_MONOTONIC

from cuda.bindings cimport cydriver

from .errors import NO_DRIVER_FIX as _NO_DRIVER_FIX  # (private: not part of this module's API)
from .errors import DriverUnavailable, KernelCompileFailed, driver_error

_initialized = False


cdef unsigned long long now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <unsigned long long>ts.tv_sec * 1000000000ULL + <unsigned long long>ts.tv_nsec


def status_name(int status):
    """The CUresult name of a status code (e.g. 'CUDA_ERROR_OUT_OF_MEMORY')."""
    cdef const char* name = NULL
    try:
        if cydriver.cuGetErrorName(<cydriver.CUresult>status, &name) == cydriver.CUDA_SUCCESS and name != NULL:
            return name.decode()
    except Exception:
        pass
    return f"CUresult({status})"


cdef int raise_cu(cydriver.CUresult status, const char* call) except -1 with gil:
    raise driver_error(status_name(<int>status), call.decode(), code=<int>status)


cdef int check_cu(cydriver.CUresult status, const char* call) except -1 nogil:
    # The GIL is taken only to raise.
    if status == cydriver.CUDA_SUCCESS:
        return 0
    return raise_cu(status, call)


def init_driver():
    """cuInit once; DriverUnavailable (with a Fix) when there is no driver or no device."""
    global _initialized
    cdef int count = 0
    cdef cydriver.CUresult status
    if _initialized:
        return
    try:
        with nogil:
            status = cydriver.cuInit(0)
    except RuntimeError as exc:  # cuda-bindings raises this when libcuda.so cannot be loaded
        raise DriverUnavailable(
            f"the CUDA driver library could not be loaded ({exc})", _NO_DRIVER_FIX
        ) from None
    if status != cydriver.CUDA_SUCCESS:
        raise DriverUnavailable(
            f"cuInit failed with {status_name(<int>status)}",
            "check that the NVIDIA driver is loaded (nvidia-smi) and that CUDA_VISIBLE_DEVICES "
            "names a device",
        )
    with nogil:
        status = cydriver.cuDeviceGetCount(&count)
    if status != cydriver.CUDA_SUCCESS or count == 0:
        raise DriverUnavailable(
            "the CUDA driver found no device",
            "check nvidia-smi and CUDA_VISIBLE_DEVICES",
        )
    _initialized = True


def device_count():
    cdef int count = 0
    init_driver()
    check_cu(cydriver.cuDeviceGetCount(&count), b"cuDeviceGetCount")
    return count


def driver_version():
    cdef int version = 0
    init_driver()
    check_cu(cydriver.cuDriverGetVersion(&version), b"cuDriverGetVersion")
    return version


cdef int _attr(cydriver.CUdevice dev, cydriver.CUdevice_attribute attr) except? -1:
    cdef int value = 0
    check_cu(cydriver.cuDeviceGetAttribute(&value, attr, dev), b"cuDeviceGetAttribute")
    return value


def check_ordinal(ordinal):
    """Raise ValidationError unless ``ordinal`` names a device the driver sees (every entry
    point that takes a device calls this before its first per-device driver call)."""
    init_driver()
    count = device_count()
    if ordinal < 0 or ordinal >= count:
        from .errors import ValidationError
        raise ValidationError(
            f"device {ordinal} does not exist; the driver sees {count} device(s)",
            f"pass a device ordinal in 0..{count - 1}",
        )


def device_caps(int ordinal):
    """The attributes vyre_cuda plans with, as a dict of DeviceCaps fields."""
    cdef cydriver.CUdevice dev
    cdef char name[256]
    cdef char bus[64]
    cdef size_t total = 0
    check_ordinal(ordinal)
    check_cu(cydriver.cuDeviceGet(&dev, ordinal), b"cuDeviceGet")
    memset(name, 0, sizeof(name))
    memset(bus, 0, sizeof(bus))
    check_cu(cydriver.cuDeviceGetName(name, sizeof(name) - 1, dev), b"cuDeviceGetName")
    check_cu(cydriver.cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev), b"cuDeviceGetPCIBusId")
    check_cu(cydriver.cuDeviceTotalMem(&total, dev), b"cuDeviceTotalMem")
    return dict(
        ordinal=ordinal,
        name=name.decode(errors="replace"),
        cc=(_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        sm_count=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        warp_size=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        max_threads_per_block=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        max_block_dim=(_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
                       _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                       _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)),
        max_grid_dim=(_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
                      _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                      _attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)),
        max_shared_per_block=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        max_shared_per_block_optin=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        max_threads_per_sm=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
        max_blocks_per_sm=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR),
        cooperative_launch=bool(_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)),
        copy_engines=_attr(dev, cydriver.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT),
        total_memory=total,
        driver_version=driver_version(),
        pci_bus_id=bus.decode(errors="replace"),
    )


def retain_primary_context(int ordinal):
    """Retain the device's primary context (shared with CuPy, PyTorch and the runtime API)."""
    cdef cydriver.CUdevice dev
    cdef cydriver.CUcontext ctx
    cdef cydriver.CUresult status
    check_ordinal(ordinal)
    check_cu(cydriver.cuDeviceGet(&dev, ordinal), b"cuDeviceGet")
    with nogil:
        check_cu(cydriver.cuDevicePrimaryCtxRetain(&ctx, dev), b"cuDevicePrimaryCtxRetain")
        status = cydriver.cuCtxSetCurrent(ctx)
        if status != cydriver.CUDA_SUCCESS:
            cydriver.cuDevicePrimaryCtxRelease(dev)  # give the retain back before raising
            check_cu(status, b"cuCtxSetCurrent")
    return <uintptr_t>ctx


def release_primary_context(int ordinal):
    cdef cydriver.CUdevice dev
    check_cu(cydriver.cuDeviceGet(&dev, ordinal), b"cuDeviceGet")
    with nogil:
        check_cu(cydriver.cuDevicePrimaryCtxRelease(dev), b"cuDevicePrimaryCtxRelease")


def reset_primary_context(int ordinal):
    """Destroy this process's primary context on the device (recovery after a kernel fault)."""
    cdef cydriver.CUdevice dev
    check_ordinal(ordinal)
    check_cu(cydriver.cuDeviceGet(&dev, ordinal), b"cuDeviceGet")
    with nogil:
        check_cu(cydriver.cuDevicePrimaryCtxReset(dev), b"cuDevicePrimaryCtxReset")


cdef extern from *:
    """
    /* The capture gate (one per process): > 0 counts this process's stream captures open now,
       < 0 its context synchronizes running (negated); each kind shares the gate with its own
       kind only. A synchronize waiting for the gate turns new captures away (they issue), so
       back-to-back captures cannot starve it. */
    static int vyre_capture_gate = 0;
    static int vyre_syncs_waiting = 0;
    static inline int vyre_capture_try_open(void) {
        if (__atomic_load_n(&vyre_syncs_waiting, __ATOMIC_SEQ_CST)) return 0;
        int v = __atomic_load_n(&vyre_capture_gate, __ATOMIC_SEQ_CST);
        while (v >= 0)  /* (a failed exchange reloads v) */
            if (__atomic_compare_exchange_n(&vyre_capture_gate, &v, v + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                return 1;
        return 0;
    }
    static inline void vyre_capture_close(void) { __atomic_sub_fetch(&vyre_capture_gate, 1, __ATOMIC_SEQ_CST); }
    static inline int vyre_sync_try_begin(void) {
        int v = __atomic_load_n(&vyre_capture_gate, __ATOMIC_SEQ_CST);
        while (v <= 0)
            if (__atomic_compare_exchange_n(&vyre_capture_gate, &v, v - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                return 1;
        return 0;
    }
    static inline void vyre_sync_end(void) { __atomic_add_fetch(&vyre_capture_gate, 1, __ATOMIC_SEQ_CST); }
    static inline void vyre_sync_wants(int v) { __atomic_add_fetch(&vyre_syncs_waiting, v, __ATOMIC_SEQ_CST); }
    """
    int vyre_capture_try_open() noexcept nogil
    void vyre_capture_close() noexcept nogil
    int vyre_sync_try_begin() noexcept nogil
    void vyre_sync_end() noexcept nogil
    void vyre_sync_wants(int v) noexcept nogil


# The capture gate. A cuCtxSynchronize on one thread while another thread captures a stream in
# thread-local mode (every capture of vyre_cuda's) crashed the H100's driver with SIGSEGV inside
# cuCtxSynchronize: 4 runs in 4 of benchmarks/probe_ctx_sync_race.py (no vyre_cuda in it), and 11
# GPU stress runs in 132, every one in a trim() or close() synchronize (notes/safe-to-share.md).
# The driver refuses such a synchronize only for a capture in global mode. So no synchronize of
# vyre_cuda's runs while one of its captures is open, and no capture begins while one runs: a
# capture that finds a synchronize running is not begun (the dispatch issues its launches
# instead), and a synchronize waits for the captures to end (synchronize_current). Synchronizes
# share the gate with each other, as captures do (two may wait on a long kernel together). A
# capture of another library's in thread-local mode cannot be seen here; in global mode the
# driver refuses.
cdef bint capture_try_open() noexcept nogil:
    """Open a capture through the gate: False while a synchronize runs (do not capture)."""
    return vyre_capture_try_open()


cdef void capture_open_wait() noexcept nogil:
    """Open a capture through the gate, waiting for a running synchronize to end."""
    cdef timespec nap
    while not vyre_capture_try_open():
        nap.tv_sec = 0
        nap.tv_nsec = 50000
        nanosleep(&nap, NULL)


cdef void capture_closed() noexcept nogil:
    vyre_capture_close()


def _count_capture_for_tests(int delta):
    """Open (1) or close (-1) a capture through the gate, as a graph trial does (tests only)."""
    if delta > 0:
        if not vyre_capture_try_open():
            raise RuntimeError("a context synchronize holds the capture gate")
    else:
        vyre_capture_close()


cdef int bind_context(cydriver.CUcontext ctx) except -1 nogil:
    cdef cydriver.CUcontext current = NULL
    check_cu(cydriver.cuCtxGetCurrent(&current), b"cuCtxGetCurrent")
    if current != ctx:
        check_cu(cydriver.cuCtxSetCurrent(ctx), b"cuCtxSetCurrent")
    return 0


def make_current(uintptr_t ctx):
    bind_context(<cydriver.CUcontext>ctx)


def mem_get_info():
    """(free, total) device bytes of the current context."""
    cdef size_t free_b = 0, total_b = 0
    with nogil:
        check_cu(cydriver.cuMemGetInfo(&free_b, &total_b), b"cuMemGetInfo")
    return free_b, total_b


cdef cydriver.CUresult synchronize_current(double capture_wait_s) noexcept nogil:
    """cuCtxSynchronize of the current context through the capture gate: while a capture of
    vyre_cuda's is open, or the driver refuses for another's, wait (pausing 50 us, doubling up to
    10 ms) for up to ``capture_wait_s``; then CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED."""
    cdef cydriver.CUresult st
    cdef unsigned long long deadline = now_ns() + <unsigned long long>(max(capture_wait_s, 0.0) * 1e9)
    cdef timespec nap
    cdef long pause = 50000
    cdef bint waiting = False
    while True:
        st = cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        if vyre_sync_try_begin():
            st = cydriver.cuCtxSynchronize()
            vyre_sync_end()
        # (the DeviceArray pool's flush passes 0: refused at once, it never waits)
        if st != cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED or capture_wait_s <= 0 or now_ns() >= deadline:
            break
        if not waiting:
            vyre_sync_wants(1)  # new captures of vyre_cuda's issue instead until this one has run
            waiting = True
        nap.tv_sec = 0
        nap.tv_nsec = pause
        nanosleep(&nap, NULL)
        if pause < 10000000:
            pause *= 2
    if waiting:
        vyre_sync_wants(-1)
    return st


def context_synchronize(double capture_wait_s=10.0):
    """cuCtxSynchronize of the current context.

    While a stream of the context is being captured into a CUDA graph (a backend's graph trial,
    which the capture gate tells; a CuPy or torch capture in global mode on another thread, which
    the driver refuses with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), the call waits, pausing 50 us
    and doubling up to 10 ms, until the captures end or ``capture_wait_s`` has passed; then that
    refusal is raised."""
    cdef cydriver.CUresult st
    with nogil:
        st = synchronize_current(capture_wait_s)
        check_cu(st, b"cuCtxSynchronize")


# The host registry (_hostreg) serves every backend on any thread, so it never uses a backend's
# context handle (that backend may close and the handle die: an H100 stress run faulted in
# cuCtxSynchronize on one); it retains the device's primary context for each call instead.
cdef cydriver.CUresult _push_primary(int ordinal, bint only_live, cydriver.CUdevice* dev) noexcept nogil:
    # retained and pushed on success; with only_live, a primary context that does not exist now
    # is not made (CUDA_ERROR_INVALID_CONTEXT): there is no work and no registration in it
    cdef cydriver.CUcontext ctx
    cdef unsigned int flags = 0
    cdef int live = 0
    cdef cydriver.CUresult st = cydriver.cuDeviceGet(dev, ordinal)
    if st == cydriver.CUDA_SUCCESS and only_live:
        st = cydriver.cuDevicePrimaryCtxGetState(dev[0], &flags, &live)
        if st == cydriver.CUDA_SUCCESS and not live:
            return cydriver.CUDA_ERROR_INVALID_CONTEXT
    if st == cydriver.CUDA_SUCCESS:
        st = cydriver.cuDevicePrimaryCtxRetain(&ctx, dev[0])
    if st == cydriver.CUDA_SUCCESS:
        st = cydriver.cuCtxPushCurrent(ctx)
        if st != cydriver.CUDA_SUCCESS:
            cydriver.cuDevicePrimaryCtxRelease(dev[0])
    return st


cdef void _pop_primary(cydriver.CUdevice dev) noexcept nogil:
    cdef cydriver.CUcontext prev
    cydriver.cuCtxPopCurrent(&prev)
    cydriver.cuDevicePrimaryCtxRelease(dev)


def device_synchronize(int ordinal, double capture_wait_s=10.0):
    """Wait for all GPU work of device ``ordinal``'s primary context, if it exists (retained for
    the call; this thread's current context is left as it was). Retries a capture's refusal as
    context_synchronize does."""
    cdef cydriver.CUdevice dev
    cdef cydriver.CUresult st
    with nogil:
        st = _push_primary(ordinal, True, &dev)
    if st == cydriver.CUDA_ERROR_INVALID_CONTEXT:
        return
    check_cu(st, b"cuDevicePrimaryCtxRetain")
    with nogil:
        st = synchronize_current(capture_wait_s)
        _pop_primary(dev)
    check_cu(st, b"cuCtxSynchronize")


_LOG_BYTES = 16384


def load_module(bytes image, str entry, bint want_barrier):
    """Load a module image (cubin or NUL-terminated PTX); return (module, function, barrier, size).

    A load failure raises KernelCompileFailed carrying the driver's JIT log.
    """
    cdef cydriver.CUmodule module = NULL
    cdef cydriver.CUfunction function = NULL
    cdef cydriver.CUdeviceptr barrier = 0
    cdef size_t barrier_size = 0
    cdef cydriver.CUresult status
    cdef cydriver.CUjit_option options[2]
    cdef void* values[2]
    cdef char* log = <char*>malloc(_LOG_BYTES)
    cdef const char* data = image
    if log == NULL:
        raise MemoryError()
    memset(log, 0, _LOG_BYTES)
    options[0] = cydriver.CU_JIT_ERROR_LOG_BUFFER
    values[0] = <void*>log
    options[1] = cydriver.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
    values[1] = <void*><uintptr_t>_LOG_BYTES
    try:
        with nogil:
            status = cydriver.cuModuleLoadDataEx(&module, data, 2, options, values)
        if status != cydriver.CUDA_SUCCESS:
            from .errors import cu_explanation
            name = status_name(<int>status)
            jit_log = log.decode(errors="replace")
            err = KernelCompileFailed(
                f"cuModuleLoadDataEx failed with {name}: {cu_explanation(name)}",
                "see .log for the driver's JIT log",
                log=jit_log,
            )
            err.status = name
            raise err
    finally:
        free(log)
    entry_b = entry.encode()
    status = cydriver.cuModuleGetFunction(&function, module, entry_b)
    if status != cydriver.CUDA_SUCCESS:
        with nogil:
            cydriver.cuModuleUnload(module)
        raise KernelCompileFailed(
            f"the module has no kernel entry {entry!r} ({status_name(<int>status)})",
            "declare the kernel extern \"C\" __global__ (VYRE_KERNEL) and pass its name as entry",
        )
    if want_barrier:
        status = cydriver.cuModuleGetGlobal(&barrier, &barrier_size, module, b"_vyre_grid_barrier")
        if status != cydriver.CUDA_SUCCESS:
            barrier = 0
            barrier_size = 0
    return <uintptr_t>module, <uintptr_t>function, <uintptr_t>barrier, barrier_size


def unload_module(uintptr_t module):
    # the unload waits for the device's work: other Python threads run meanwhile
    with nogil:
        cydriver.cuModuleUnload(<cydriver.CUmodule>module)


def set_max_dynamic_shared(uintptr_t function, int nbytes):
    check_cu(cydriver.cuFuncSetAttribute(<cydriver.CUfunction>function,
                                         cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         nbytes), b"cuFuncSetAttribute")


def occupancy_blocks_per_sm(uintptr_t function, int block_threads, size_t shared_bytes):
    cdef int blocks = 0
    check_cu(cydriver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, <cydriver.CUfunction>function, block_threads, shared_bytes),
        b"cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return blocks


def host_register(int ordinal, uintptr_t address, size_t nbytes):
    """cuMemHostRegister of [address, address + nbytes), portable to every context, in device
    ``ordinal``'s primary context (retained for the call). Returns the status: a refusal is the
    caller's to fall back from."""
    cdef cydriver.CUresult st
    cdef cydriver.CUdevice dev
    with nogil:
        st = _push_primary(ordinal, False, &dev)
        if st == cydriver.CUDA_SUCCESS:
            st = cydriver.cuMemHostRegister(<void*>address, nbytes, cydriver.CU_MEMHOSTREGISTER_PORTABLE)
            _pop_primary(dev)
    return <int>st


def host_unregister(int ordinal, uintptr_t address):
    """cuMemHostUnregister of the range registered at ``address``, in device ``ordinal``'s primary
    context. Returns the status; 0 with nothing to do when that context no longer exists (the
    registration went with it, and no copy can be running)."""
    cdef cydriver.CUresult st
    cdef cydriver.CUdevice dev
    with nogil:
        st = _push_primary(ordinal, True, &dev)
        if st == cydriver.CUDA_SUCCESS:
            st = cydriver.cuMemHostUnregister(<void*>address)
            _pop_primary(dev)
        elif st == cydriver.CUDA_ERROR_INVALID_CONTEXT:
            st = cydriver.CUDA_SUCCESS
    return <int>st


def function_max_threads(uintptr_t function):
    """The most threads per block this kernel can launch with (its registers and shared memory
    can lower it below the device's limit): CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK."""
    cdef int value = 0
    with nogil:
        check_cu(cydriver.cuFuncGetAttribute(&value, cydriver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                             <cydriver.CUfunction>function), b"cuFuncGetAttribute")
    return value
