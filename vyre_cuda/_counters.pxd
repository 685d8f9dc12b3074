# Telemetry counter slots: the ONE list of them. The core indexes its counter array with these;
# telemetry.COUNTERS is built from them (name: the member without "T_", lower case, in slot order).

cpdef enum:
    T_DISPATCHES = 0
    T_H2D_BYTES
    T_H2D_OPS
    T_D2H_BYTES
    T_D2H_OPS
    T_TRANSIENT_ALLOC_BYTES
    T_PARAM_UPLOAD_BYTES
    T_LAUNCHES
    T_COOPERATIVE_LAUNCHES
    T_SPLIT_LAUNCHES
    T_MEMSET_OPS
    T_SYNC_POINTS
    T_TIMED_DISPATCHES
    T_TIMED_WALL_NS
    T_TIMED_DEVICE_NS
    T_TIMED_ENQUEUE_NS
    T_TIMED_WAIT_NS
    T_FAILED_DISPATCHES
    T_LEAKED_ALLOCATIONS
    T_STAGED_H2D_BYTES  # uploaded through staging (the mirror or the ring)
    T_DIRECT_H2D_BYTES  # DMA'd straight from page-locked inputs
    T_STAGED_D2H_BYTES
    T_DIRECT_D2H_BYTES
    T_RING_CHUNKS  # windows that went through the staging ring, both directions
    T_INTERRUPTED_WAITS  # waits ended by Ctrl-C (the work stays owned by a PendingDispatch)
    T_GRAPH_REPLAYS  # dispatches whose launches ran as one CUDA graph launch
    T_GRAPH_CAPTURES  # launch sequences captured and instantiated (a new argument-pointer set)
    T_GRAPH_UPDATES  # cached graph execs updated in place to new argument pointers
    T_GRAPH_FALLBACKS  # dispatches of a graph plan that issued their launches instead
    T_STREAMED_DISPATCHES  # dispatches that ran on the streamed route
    T_STREAMED_CHUNKS  # chunks those dispatches were cut into
    T_IN_PLACE_OUTPUTS  # device outputs the kernel wrote directly (no device-to-device copy)
    T_DEVICE_ARRAYS_READ_IN_C  # device inputs and outputs of a type the reader keeps (read in C)
    T_DEVICE_ARRAYS_READ_IN_PYTHON  # ... and of another type (__dlpack__, a CAI before v3, a StridedMemoryView)
    T_DEFERRED_DROPS  # handles dropped before the GPU finished: their resources went to the deferred list
    T_DEFERRED_RECYCLES  # deferred resources reclaimed (recycled, or written off on a driver error)
    T_DEFERRED_CAP_WAITS  # dispatches that waited for the oldest dropped work (the deferred list was full)
    N_COUNTERS  # the number of slots (not a counter; keep it last)
