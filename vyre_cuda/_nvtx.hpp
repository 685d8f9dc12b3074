// NVTX ranges of traced dispatches (CudaBackend(trace=True) / VYRE_CUDA_TRACE=1).
//
// The C header, not the `nvtx` package: stage ranges open and close in nogil code. NVTX3 is
// header-only, each call a no-op unless a tool injected itself. setup.py defines VYRE_CUDA_NVTX=1
// when it finds <nvtx3/nvToolsExt.h>; without it every call only counts (nvtx_counts() agrees).
//
// Ranges go to the "vyre_cuda" domain. A blocking dispatch is a push/pop range named by its label
// with one nested push/pop range per stage; the stage open on this thread is kept in a
// thread-local so the stage marks of the enqueue routine can close it and open the next one.
// An async dispatch is a start/end range (it may end on another thread) from enqueue to result.
#pragma once
#include <stdint.h>

#ifndef VYRE_CUDA_NVTX
#define VYRE_CUDA_NVTX 0
#endif

#if VYRE_CUDA_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

enum {
    VYRE_NVTX_STAGES = 10,  // stage names below; counter slot VYRE_NVTX_STAGES is the dispatch range
    VYRE_NVTX_SLOTS = VYRE_NVTX_STAGES + 4,  // + dispatch pushes, pops, starts, ends
};

static const char* const vyre_nvtx_stage_names[VYRE_NVTX_STAGES] = {
    "plan_lookup", "upload", "launch", "readback_enqueue", "event_record", "wait", "copy_out",
    "release", "enqueue", "result",
};

// pushes per stage, then dispatch-range pushes, all pops, start ranges, end ranges
static unsigned long long vyre_nvtx_counts[VYRE_NVTX_SLOTS];
static thread_local int vyre_nvtx_open = 0;  // 1 + the stage open on this thread, 0: none

static inline void vyre_nvtx_count(int slot) { __atomic_fetch_add(&vyre_nvtx_counts[slot], 1ULL, __ATOMIC_RELAXED); }

#if VYRE_CUDA_NVTX
static inline nvtxDomainHandle_t vyre_nvtx_domain(void) {
    static nvtxDomainHandle_t domain = nvtxDomainCreateA("vyre_cuda");  // C++ static: made once
    return domain;
}

static inline nvtxEventAttributes_t vyre_nvtx_attributes(const char* message) {
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;
    return a;
}
#endif

static inline int vyre_nvtx_available(void) { return VYRE_CUDA_NVTX; }
static inline int vyre_nvtx_stage_open(void) { return vyre_nvtx_open; }

static inline void vyre_nvtx_push(const char* message, int slot) {
    vyre_nvtx_count(slot);
#if VYRE_CUDA_NVTX
    nvtxEventAttributes_t a = vyre_nvtx_attributes(message);
    nvtxDomainRangePushEx(vyre_nvtx_domain(), &a);
#endif
}

static inline void vyre_nvtx_pop(void) {
    vyre_nvtx_count(VYRE_NVTX_STAGES + 1);
#if VYRE_CUDA_NVTX
    nvtxDomainRangePop(vyre_nvtx_domain());
#endif
}

// close the stage open on this thread (if any) and open `stage` (-1: open none)
static inline void vyre_nvtx_stage(int stage) {
    if (vyre_nvtx_open) {
        vyre_nvtx_pop();
        vyre_nvtx_open = 0;
    }
    if (stage >= 0 && stage < VYRE_NVTX_STAGES) {
        vyre_nvtx_push(vyre_nvtx_stage_names[stage], stage);
        vyre_nvtx_open = stage + 1;
    }
}

static inline uint64_t vyre_nvtx_start(const char* message) {
    vyre_nvtx_count(VYRE_NVTX_STAGES + 2);
#if VYRE_CUDA_NVTX
    nvtxEventAttributes_t a = vyre_nvtx_attributes(message);
    return nvtxDomainRangeStartEx(vyre_nvtx_domain(), &a);
#else
    (void)message;
    return 0;
#endif
}

static inline void vyre_nvtx_end(uint64_t id) {
    vyre_nvtx_count(VYRE_NVTX_STAGES + 3);
#if VYRE_CUDA_NVTX
    nvtxDomainRangeEnd(vyre_nvtx_domain(), id);
#else
    (void)id;
#endif
}

static inline unsigned long long vyre_nvtx_counter(int slot) {
    return __atomic_load_n(&vyre_nvtx_counts[slot], __ATOMIC_RELAXED);
}

static inline void vyre_nvtx_reset(void) {
    for (int k = 0; k < VYRE_NVTX_SLOTS; k++) __atomic_store_n(&vyre_nvtx_counts[k], 0ULL, __ATOMIC_RELAXED);
}
