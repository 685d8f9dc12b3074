/* A fake CUDA driver (libcuda.so.1) for CPU tests: device memory is host memory, every stream
 * operation runs synchronously, and a launch calls an optional hook instead of a kernel.
 *
 * cuda-bindings resolves every driver entry point through cuGetProcAddress_v2 by name, so this
 * library exports that one function (plus cuGetProcAddress) and answers from the table at the
 * end. Loaded in a child interpreter through LD_LIBRARY_PATH, it lets the real CudaBackend, its
 * real pools and its real enqueue path run on a machine without a GPU, with checks a GPU does not
 * make as cheaply: every copy and memset must lie inside one live allocation (or a module
 * global), every free must name a live allocation, dynamic shared memory above 48 KiB needs the
 * opt-in attribute first, and a cooperative grid must fit the occupancy answer.
 *
 * Test controls (exported, called through ctypes): fake_cuda_stats(), fake_cuda_fail() to make
 * the n-th next call of one entry point return an error, fake_cuda_set_launch_hook() to run a
 * Python emulation of the kernel, fake_cuda_set_occupancy(), fake_cuda_reset_counters(),
 * fake_cuda_set_arg_count() (how many u64 kernel arguments a function takes: stream capture copies
 * them by value, as the real driver does from the kernel's signature).
 *
 * Graphs: stream capture records launches and 32-bit memsets into a graph (nothing runs), an
 * instantiated exec holds a copy, cuGraphExecUpdate replaces its parameters when the topology
 * matches, and cuGraphLaunch runs the nodes in order (calling the launch hook).
 *
 * A busy GPU (fake_cuda_hold(1), off by default): completion queries (cuEventQuery, cuStreamQuery)
 * answer CUDA_ERROR_NOT_READY, synchronizes wait, and host functions (cuLaunchHostFunc) wait, until
 * fake_cuda_hold(0). Host functions run as on the driver: on a thread of the driver's (one callback
 * thread, in launch order), never inside the caller's call, after the work queued before them
 * (which the fake has done by then; lazy mode runs it first). fake_cuda_drop_host_funcs() discards
 * the waiting ones, as the driver does after a fault ("not called in the event of an error in the
 * CUDA context"). fake_cuda_gpu_counts() reads the completion queries and the host functions
 * launched, run and dropped.
 *
 * Lazy mode (fake_cuda_set_lazy(1), off by default): stream work runs as LATE as CUDA allows, so
 * an ordering bug (a host buffer reused before the DMA that reads it ran, a staging buffer read
 * before the D2H that fills it ran, a missing cross-stream wait) gives wrong data instead of
 * passing by luck. Each stream (the legacy and per-thread handles 1 and 2 too) has a FIFO queue:
 *  - queued, checked at enqueue exactly as in eager mode and again at execution (memory freed
 *    meanwhile is a violation): the async copies and memsets, kernel launches (arguments copied by
 *    value, as many as fake_cuda_set_arg_count says; FakeDriver.emulate sets it) and graph
 *    launches (the exec's nodes copied at launch). A launch of a function whose argument count is
 *    unknown cannot be copied: it runs its stream's queue, then itself, before returning. A copy from pageable host memory reads its source at the call, as CUDA's
 *    staging does; page-locked sources and every destination are touched only when the op runs.
 *  - cuEventRecord marks the event at the end of the stream's queue; cuStreamWaitEvent queues a
 *    wait naming that mark (a never-recorded event: no wait), which first runs the other stream
 *    up to it.
 *  - what runs the queues: cuStreamSynchronize, cuStreamQuery (then success) and cuStreamDestroy
 *    run the whole stream; cuEventSynchronize, cuEventQuery and cuEventElapsedTime run up to the
 *    event's mark; cuMemFreeAsync runs its stream; cuCtxSynchronize, cuMemcpyDtoH, cuMemFree,
 *    cuMemFreeHost, cuMemHostUnregister, cuModuleUnload and fake_cuda_set_lazy(0) run every
 *    stream. Nothing else runs anything.
 *  - an op that fails when it runs (a violation, the launch hook's error) is an asynchronous error:
 *    it is kept on its stream and returned (once) by the next synchronize or query of that stream
 *    or of an event recorded on it, or by cuCtxSynchronize.
 *  - counters move at enqueue as in eager mode; fake_cuda_lazy_pending() says how many ops wait.
 *  - FAKE_CUDA_LAZY=1 in the environment turns it on when the library loads.
 * Lazy mode is meant for tests with ONE thread calling the driver: execution is serialised by its
 * own recursive mutex (a wait runs another stream from inside a run), and the launch hook runs
 * without the fake's lock but holding that mutex, so a second thread calling a running entry
 * point with the GIL held while a hook waits for the GIL would deadlock; after 30 s of waiting
 * the process aborts with that reason (vyre_cuda's copy threads never call the driver).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The few driver types and constants used here, as cuda.h defines them (stable ABI values), so
 * that building the fake needs only a C compiler. */
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute;
typedef int CUfunction_attribute;
typedef int CUjit_option;
typedef int CUdriverProcAddressQueryResult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUmemoryPool;
typedef int CUpointer_attribute;
typedef int CUmemPool_attribute;
typedef struct { char bytes[16]; } CUuuid;

enum {
  CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_PTX = 218, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600, CUDA_ERROR_ILLEGAL_ADDRESS = 700, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_ILLEGAL_INSTRUCTION = 715, CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720, CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_ILLEGAL_STATE = 401, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910, CUDA_ERROR_UNKNOWN = 999,
};
enum {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
  CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
};
enum { CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
enum { CU_JIT_ERROR_LOG_BUFFER = 5 };
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1 };
enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4, CU_POINTER_ATTRIBUTE_BUFFER_ID = 7, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12, CU_POINTER_ATTRIBUTE_MAPPED = 13,
};
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
enum { CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
       CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6, CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
       CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8 };

#define FAKE_TOTAL_MEM 150754820096ull /* an H200's cuDeviceTotalMem */
#define FAKE_SM_COUNT 132
#define FAKE_COPY_ENGINES 3 /* ASYNC_ENGINE_COUNT: not the planner's default 2, so a test sees it read */
#define FAKE_SHARED_OPTIN 232448
#define FAKE_SHARED_PER_SM 233472
#define FAKE_DEFAULT_SHARED 49152

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct Ctx { int device; int refs; } contexts[8];
static __thread CUcontext current_ctx = NULL;

/* ------------------------------------------------------------------ bookkeeping */
enum { KIND_DEVICE = 1, KIND_HOST = 2, KIND_GLOBAL = 3, KIND_REGISTERED = 4 };

typedef struct Alloc {
  char* base;
  size_t size;
  int kind;
  unsigned long long id;
  struct Alloc* next;
} Alloc;
static unsigned long long next_alloc_id = 1;

static Alloc* allocs = NULL;

enum {
  S_DEVICE_ALLOCS, S_DEVICE_BYTES, S_HOST_ALLOCS, S_HOST_BYTES, S_STREAMS, S_EVENTS, S_MODULES,
  S_LAUNCHES, S_COOP_LAUNCHES, S_HTOD, S_DTOH, S_MEMSETS, S_CTX_REFS, S_VIOLATIONS,
  S_DEVICE_ALLOC_CALLS, S_HOST_ALLOC_CALLS, S_STREAM_CREATES, S_EVENT_CREATES, S_SYNCS, S_NO_CONTEXT,
  S_REGISTERED, S_POOLS, S_DTOD, S_GRAPHS, S_GRAPH_EXECS, S_GRAPH_LAUNCHES, S_CAPTURED_NODES, S_EXEC_UPDATES, S_STREAM_WAITS,
  S_REGISTERED_BYTES, S_HTOD_REGISTERED, S_DTOH_REGISTERED, S_EVENT_RECORDS, S_BAD_HANDLES, S_UNSAFE_SYNCS, N_STATS
};
static long long stats[N_STATS];
static char last_violation[512];
static int lazy = 0; /* fake_cuda_set_lazy */
static void lazy_run_all(void);   /* lazy mode: run every stream's queue (errors stay on the streams) */
static CUresult lazy_sync_all(void); /* ... and take the first asynchronous error of any stream */

/* a call given a handle (stream, event, graph, module) that is not live (destroyed, or never
 * made): counted, so a test can tell a use after destroy (the real driver may crash on one) */
static CUresult bad_handle(void) {
  __atomic_fetch_add(&stats[S_BAD_HANDLES], 1, __ATOMIC_RELAXED);
  return CUDA_ERROR_INVALID_HANDLE;
}

static int n_devices(void) {
  const char* v = getenv("FAKE_CUDA_DEVICES");
  return v ? atoi(v) : 1;
}

static void violation(const char* what, unsigned long long addr, size_t n) {
  stats[S_VIOLATIONS]++;
  snprintf(last_violation, sizeof(last_violation), "%s: [0x%llx, +%zu) is not inside one live allocation", what,
           addr, n);
  if (getenv("FAKE_CUDA_VERBOSE")) fprintf(stderr, "fake libcuda: %s\n", last_violation);
}

static void violation_text(const char* text) {
  stats[S_VIOLATIONS]++;
  snprintf(last_violation, sizeof(last_violation), "%s", text);
  if (getenv("FAKE_CUDA_VERBOSE")) fprintf(stderr, "fake libcuda: %s\n", last_violation);
}

static Alloc* find_range(const char* p, size_t n, int kind);

/* DMA in flight on registered memory (eager mode; the caller holds `lock`). An async copy whose
 * host side lies in a registered range is in flight, as on the GPU, until the caller has seen its
 * stream finish past it: a stream synchronize or a successful query, an event recorded after it
 * synchronized or queried, or a context synchronize that BEGAN after it was enqueued (one that
 * began before does not wait for it, as with the driver: another thread's copy enqueued while a
 * context synchronize runs may still be running when it returns). A stream that waited on an event
 * (cuStreamWaitEvent) has seen the event's stream up to the event once it is seen past the wait.
 * cuMemHostUnregister of a range with a copy still in flight is a violation: the driver does not
 * wait for it, and the GPU faults (CUDA_ERROR_LAUNCH_FAILED) or moves the wrong bytes. */
typedef struct { const char* base; size_t n; CUstream s; unsigned long long seq; } Flight;
typedef struct { CUstream s; unsigned long long seen; } Seen;
typedef struct { CUstream waiter; unsigned long long at; CUstream src; unsigned long long upto; } Join;
#define MAX_FLIGHTS 4096
#define MAX_SEEN 512
#define MAX_JOINS 4096
static Flight flights[MAX_FLIGHTS];
static int n_flights = 0;
static Seen seen_streams[MAX_SEEN];
static int n_seen = 0;
static Join joins[MAX_JOINS];
static int n_joins = 0;
static unsigned long long op_seq = 0; /* every async op of every stream, in enqueue order */

static unsigned long long* seen_of(CUstream s) {
  for (int k = 0; k < n_seen; k++)
    if (seen_streams[k].s == s) return &seen_streams[k].seen;
  if (n_seen == MAX_SEEN) n_seen = 0; /* (forgets the oldest: its flights then count as seen) */
  seen_streams[n_seen].s = s;
  seen_streams[n_seen].seen = 0;
  return &seen_streams[n_seen++].seen;
}

static void seen_upto(CUstream s, unsigned long long seq) {
  unsigned long long* p = seen_of(s);
  if (*p >= seq) return;
  *p = seq;
  for (int k = 0; k < n_joins; k++)
    if (joins[k].waiter == s && joins[k].at <= seq) {
      Join j = joins[k];
      joins[k] = joins[--n_joins];
      k--;
      seen_upto(j.src, j.upto);
    }
}

static void seen_all(unsigned long long seq) {
  for (int k = 0; k < n_flights; k++) seen_upto(flights[k].s, seq);
}

static void prune_flights(void) {
  int w = 0;
  for (int k = 0; k < n_flights; k++)
    if (flights[k].seq > *seen_of(flights[k].s)) flights[w++] = flights[k];
  n_flights = w;
}

static void in_flight(const char* host, size_t n, CUstream s) {
  if (lazy || !find_range(host, n, KIND_REGISTERED)) return;
  if (n_flights == MAX_FLIGHTS) prune_flights();
  if (n_flights == MAX_FLIGHTS) n_flights = 0; /* (forgets: never a false violation) */
  flights[n_flights].base = host;
  flights[n_flights].n = n;
  flights[n_flights].s = s;
  flights[n_flights].seq = op_seq;
  n_flights++;
}

static void unregister_check(const char* base, size_t size) {
  prune_flights();
  for (int k = 0; k < n_flights; k++)
    if (flights[k].base < base + size && base < flights[k].base + flights[k].n) {
      char text[200];
      snprintf(text, sizeof(text), "cuMemHostUnregister of [%p, +%zu) while an async copy of its bytes may be in flight",
               (const void*)base, size);
      violation_text(text);
      return;
    }
}

/* The live allocations sorted by base (they are disjoint: device blocks, pinned blocks and
 * registered ranges never overlap), for a binary search: with a thousand dispatches in flight
 * the pools hold thousands of blocks, and a list walk per copy made the fake, not vyre_cuda,
 * the cost of every enqueue. */
static Alloc** sorted_allocs = NULL;
static size_t n_sorted = 0, cap_sorted = 0;

/* the index of the first allocation whose base is above p */
static size_t upper(const char* p) {
  size_t lo = 0, hi = n_sorted;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (sorted_allocs[mid]->base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int kind_matches(const Alloc* a, int kind) {
  return kind == 0 || a->kind == kind || (kind == KIND_DEVICE && a->kind == KIND_GLOBAL);
}

static int holds(const Alloc* a, const char* p, size_t n) {
  return p >= a->base && (size_t)(p - a->base) <= a->size && n <= a->size - (size_t)(p - a->base);
}

/* the allocation holding [p, p + n), or NULL */
static Alloc* find_range(const char* p, size_t n, int kind) {
  size_t i = upper(p);
  /* the last allocation starting at or below p; and the one before it, which an empty range at
   * its very end (n == 0) may name */
  for (size_t k = 0; k < 2 && i > k; k++) {
    Alloc* a = sorted_allocs[i - 1 - k];
    if (kind_matches(a, kind) && holds(a, p, n)) return a;
  }
  return NULL;
}

static Alloc* track(char* base, size_t size, int kind) {
  Alloc* a = (Alloc*)malloc(sizeof(Alloc));
  a->base = base;
  a->size = size;
  a->kind = kind;
  a->id = next_alloc_id++;
  a->next = allocs;
  allocs = a;
  if (n_sorted == cap_sorted) {
    cap_sorted = cap_sorted ? 2 * cap_sorted : 256;
    sorted_allocs = (Alloc**)realloc(sorted_allocs, cap_sorted * sizeof(Alloc*));
  }
  size_t i = upper(base);
  memmove(sorted_allocs + i + 1, sorted_allocs + i, (n_sorted - i) * sizeof(Alloc*));
  sorted_allocs[i] = a;
  n_sorted++;
  return a;
}

static int untrack(const char* base, int kind) {
  for (Alloc** pa = &allocs; *pa; pa = &(*pa)->next) {
    if ((*pa)->base == base && (*pa)->kind == kind) {
      Alloc* a = *pa;
      *pa = a->next;
      for (size_t i = upper(base); i > 0 && sorted_allocs[i - 1]->base == base; i--)
        if (sorted_allocs[i - 1] == a) {
          memmove(sorted_allocs + i - 1, sorted_allocs + i, (n_sorted - i) * sizeof(Alloc*));
          n_sorted--;
          break;
        }
      free(a);
      return 1;
    }
  }
  return 0;
}

/* The driver refuses (CUDA_ERROR_INVALID_VALUE) a copy whose host side starts in page-locked memory
 * (pinned or registered) and runs past that allocation's end, as measured on an H100 with driver
 * 13.0; one that starts in pageable memory and runs into page-locked memory is taken. A registered
 * array's last page may hold the start of a heap neighbour, so vyre_cuda's own copies of caller
 * memory must cut at the ends of page-locked ranges: doing so here is a violation. */
static int straddles_page_locked(const char* host, size_t n) {
  size_t i = upper(host);
  if (!n || i == 0) return 0;
  const Alloc* a = sorted_allocs[i - 1];
  if ((a->kind == KIND_HOST || a->kind == KIND_REGISTERED) && host < a->base + a->size)
    return n > a->size - (size_t)(host - a->base);
  return 0;
}

/* ------------------------------------------------------------------ fault injection */
typedef struct {
  char call[64];
  int countdown; /* 1: the next call fails */
  CUresult status;
  int sticky; /* keep failing once triggered */
} Injection;
static Injection injections[8];

static CUresult injected(const char* call) {
  for (int k = 0; k < 8; k++) {
    Injection* in = &injections[k];
    if (in->countdown > 0 && strcmp(in->call, call) == 0) {
      if (--in->countdown == 0) {
        CUresult st = in->status;
        if (in->sticky) in->countdown = 1;
        else in->call[0] = 0;
        return st;
      }
    }
  }
  return CUDA_SUCCESS;
}

/* Like the real driver, memory, stream, event, module and launch calls need a current context,
 * one that is still retained (a primary context whose last retain was released is gone). */
static int ctx_ok(void) {
  const struct Ctx* c = (const struct Ctx*)current_ctx;
  return c != NULL && c->refs > 0;
}

#define NEED_CTX()                            \
  do {                                        \
    if (!ctx_ok()) {                          \
      stats[S_NO_CONTEXT]++;                  \
      pthread_mutex_unlock(&lock);            \
      return CUDA_ERROR_INVALID_CONTEXT;      \
    }                                         \
  } while (0)

#define INJECT(name)                          \
  do {                                        \
    CUresult _st = injected(name);            \
    if (_st != CUDA_SUCCESS) {                \
      pthread_mutex_unlock(&lock);            \
      return _st;                             \
    }                                         \
  } while (0)

/* ------------------------------------------------------------------ test controls */
typedef int (*launch_hook_t)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared, void** params, int cooperative);
static launch_hook_t launch_hook = NULL;
static int occupancy_override = -1;

int fake_cuda_stats(long long* out, int n) {
  pthread_mutex_lock(&lock);
  for (int k = 0; k < n && k < N_STATS; k++) out[k] = stats[k];
  pthread_mutex_unlock(&lock);
  return N_STATS;
}

const char* fake_cuda_last_violation(void) { return last_violation; }

void fake_cuda_reset_counters(void) {
  pthread_mutex_lock(&lock);
  stats[S_LAUNCHES] = stats[S_COOP_LAUNCHES] = stats[S_HTOD] = stats[S_DTOH] = stats[S_MEMSETS] = 0;
  stats[S_HTOD_REGISTERED] = stats[S_DTOH_REGISTERED] = stats[S_EVENT_RECORDS] = 0;
  stats[S_VIOLATIONS] = stats[S_DEVICE_ALLOC_CALLS] = stats[S_HOST_ALLOC_CALLS] = 0;
  stats[S_STREAM_CREATES] = stats[S_EVENT_CREATES] = stats[S_SYNCS] = 0;
  stats[S_GRAPH_LAUNCHES] = stats[S_CAPTURED_NODES] = stats[S_EXEC_UPDATES] = 0;
  last_violation[0] = 0;
  pthread_mutex_unlock(&lock);
}

/* the countdown-th next call of `call` returns `status` (and every later one too when sticky) */
int fake_cuda_fail(const char* call, int countdown, int status, int sticky) {
  pthread_mutex_lock(&lock);
  for (int k = 0; k < 8; k++) {
    if (injections[k].countdown == 0 || strcmp(injections[k].call, call) == 0) {
      snprintf(injections[k].call, sizeof(injections[k].call), "%s", call);
      injections[k].countdown = countdown;
      injections[k].status = (CUresult)status;
      injections[k].sticky = sticky;
      pthread_mutex_unlock(&lock);
      return 0;
    }
  }
  pthread_mutex_unlock(&lock);
  return -1;
}

void fake_cuda_clear_failures(void) {
  pthread_mutex_lock(&lock);
  memset(injections, 0, sizeof(injections));
  pthread_mutex_unlock(&lock);
}

void fake_cuda_set_launch_hook(launch_hook_t hook) { launch_hook = hook; }
void fake_cuda_set_occupancy(int blocks_per_sm) { occupancy_override = blocks_per_sm; }

/* Extra host time spent in each cuLaunchKernel / cuGraphLaunch (microseconds), so a test can make
 * one path measurably slower than the other. */
static int launch_delay_us = 0, graph_launch_delay_us = 0;
void fake_cuda_set_launch_delays(int launch_us, int graph_launch_us) {
  launch_delay_us = launch_us;
  graph_launch_delay_us = graph_launch_us;
}
static void delay_us(int us) {
  if (us > 0) {
    struct timespec t = {us / 1000000, (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
  }
}

/* launch-width measurements: what cuFuncGetAttribute reports as a kernel's own thread limit, and
   the "device time" cuEventElapsedTime reports for a launch of a given block width (the last
   launch's; 0.001 ms when none is set) */
static int kernel_max_threads = 1024;
static int last_block_x = 0;
static struct { int block; float ms; } block_times[16];
void fake_cuda_set_kernel_max_threads(int n) { kernel_max_threads = n; }
int fake_cuda_set_block_time(int block, float ms) {
  for (int k = 0; k < 16; k++) {
    if (block_times[k].block == 0 || block_times[k].block == block) {
      block_times[k].block = block;
      block_times[k].ms = ms;
      return 0;
    }
  }
  return -1;
}

/* ------------------------------------------------------------------ a busy GPU, host functions */
typedef void (*CUhostFn)(void* data);
typedef struct HostCall { CUhostFn fn; void* data; struct HostCall* next; } HostCall;
static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static pthread_cond_t host_cv = PTHREAD_COND_INITIALIZER;   /* the hold changed, or a call came */
static HostCall *host_head = NULL, *host_tail = NULL;
static int held = 0, host_thread_running = 0;
enum { G_QUERIES, G_HOST_LAUNCHED, G_HOST_RAN, G_HOST_DROPPED, G_HOST_WAITING, N_GPU_COUNTS };
static long long gpu_counts[N_GPU_COUNTS];

/* the callback thread: runs host functions in launch order while the GPU is not held */
static void* host_thread(void* unused) {
  (void)unused;
  pthread_mutex_lock(&host_mu);
  for (;;) {
    while (held || host_head == NULL) pthread_cond_wait(&host_cv, &host_mu);
    HostCall* c = host_head;
    host_head = c->next;
    if (host_head == NULL) host_tail = NULL;
    gpu_counts[G_HOST_WAITING]--;
    pthread_mutex_unlock(&host_mu);
    c->fn(c->data); /* no fake lock held, as the driver holds none of the caller's */
    free(c);
    pthread_mutex_lock(&host_mu);
    gpu_counts[G_HOST_RAN]++;
  }
  return NULL;
}

/* a forked child has no callback thread (and the parent's may have held host_mu at the fork) */
static void host_after_fork_child(void) {
  pthread_mutex_init(&host_mu, NULL);
  pthread_cond_init(&host_cv, NULL);
  host_thread_running = 0;
  host_head = host_tail = NULL;
  gpu_counts[G_HOST_WAITING] = 0;
}
__attribute__((constructor)) static void host_at_fork(void) { pthread_atfork(NULL, NULL, host_after_fork_child); }

static CUresult queue_host_call(CUhostFn fn, void* data) {
  HostCall* c = (HostCall*)calloc(1, sizeof(HostCall));
  if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  c->fn = fn;
  c->data = data;
  pthread_mutex_lock(&host_mu);
  if (!host_thread_running) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, host_thread, NULL) != 0) {
      pthread_attr_destroy(&attr);
      pthread_mutex_unlock(&host_mu);
      free(c);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_attr_destroy(&attr);
    host_thread_running = 1;
  }
  if (host_tail) host_tail->next = c;
  else host_head = c;
  host_tail = c;
  gpu_counts[G_HOST_LAUNCHED]++;
  gpu_counts[G_HOST_WAITING]++;
  pthread_cond_broadcast(&host_cv);
  pthread_mutex_unlock(&host_mu);
  return CUDA_SUCCESS;
}

/* a completion query: counted; CUDA_ERROR_NOT_READY while the GPU is held */
static int busy_query(void) {
  pthread_mutex_lock(&host_mu);
  gpu_counts[G_QUERIES]++;
  int busy = held;
  pthread_mutex_unlock(&host_mu);
  return busy;
}

/* a synchronize waits while the GPU is held (30 s at most: a test that holds the GPU and then
 * waits for it on the same thread would otherwise hang) */
static void wait_not_held(void) {
  struct timespec limit;
  clock_gettime(CLOCK_REALTIME, &limit);
  limit.tv_sec += 30;
  pthread_mutex_lock(&host_mu);
  while (held) {
    if (pthread_cond_timedwait(&host_cv, &host_mu, &limit) != 0) {
      fprintf(stderr, "fake libcuda: a synchronize waited 30 s for fake_cuda_hold(0)\n");
      abort();
    }
  }
  pthread_mutex_unlock(&host_mu);
}

/* Test controls: hold the GPU busy (1) or release it (0); returns the previous setting */
int fake_cuda_hold(int on) {
  pthread_mutex_lock(&host_mu);
  int before = held;
  held = on ? 1 : 0;
  pthread_cond_broadcast(&host_cv);
  pthread_mutex_unlock(&host_mu);
  return before;
}

/* discard the host functions waiting now (never called); returns how many */
long long fake_cuda_drop_host_funcs(void) {
  pthread_mutex_lock(&host_mu);
  long long n = 0;
  while (host_head) {
    HostCall* c = host_head;
    host_head = c->next;
    free(c);
    n++;
  }
  host_tail = NULL;
  gpu_counts[G_HOST_DROPPED] += n;
  gpu_counts[G_HOST_WAITING] = 0;
  pthread_mutex_unlock(&host_mu);
  return n;
}

/* queries, host functions launched, run, dropped and waiting, in that order; returns the count */
int fake_cuda_gpu_counts(long long* out, int n) {
  pthread_mutex_lock(&host_mu);
  for (int k = 0; k < n && k < N_GPU_COUNTS; k++) out[k] = gpu_counts[k];
  pthread_mutex_unlock(&host_mu);
  return N_GPU_COUNTS;
}

/* ------------------------------------------------------------------ driver, devices */

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return n_devices() > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  *count = n_devices();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  if (ordinal < 0 || ordinal >= n_devices() || ordinal >= 8) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  snprintf(name, (size_t)len, "Fake H200 %d (vyre_cuda test driver)", (int)dev);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  snprintf(bus, (size_t)len, "0000:%02x:00.0", (int)dev + 1);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  (void)dev;
  *bytes = FAKE_TOTAL_MEM;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  (void)dev;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = FAKE_SM_COUNT; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = FAKE_DEFAULT_SHARED; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = FAKE_SHARED_OPTIN; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = FAKE_COPY_ENGINES; break;
    /* stream-ordered pools only where a test asks (FAKE_CUDA_MEMPOOLS=1): the default path is the block pool */
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = getenv("FAKE_CUDA_MEMPOOLS") != NULL; break;
    default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  pthread_mutex_lock(&lock);
  INJECT("cuDevicePrimaryCtxRetain");
  contexts[dev].device = dev;
  contexts[dev].refs++;
  stats[S_CTX_REFS]++;
  *ctx = (CUcontext)&contexts[dev];
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  pthread_mutex_lock(&lock);
  INJECT("cuDevicePrimaryCtxRelease");
  if (contexts[dev].refs <= 0) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  contexts[dev].refs--;
  stats[S_CTX_REFS]--;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  pthread_mutex_lock(&lock);
  INJECT("cuDevicePrimaryCtxGetState");
  *flags = 0;
  *active = contexts[dev].refs > 0;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* a primary context whose last retain was released is gone on the driver, and its handle with it:
   making it current again is a violation (the driver may fault on it) */
static void check_live_ctx(CUcontext ctx, const char* call) {
  for (int d = 0; d < 8; d++) {
    if (ctx == (CUcontext)&contexts[d] && contexts[d].refs <= 0) {
      char text[160];
      snprintf(text, sizeof(text), "%s of device %d's primary context after its last release", call, d);
      violation_text(text);
    }
  }
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  pthread_mutex_lock(&lock);
  INJECT("cuDevicePrimaryCtxReset");
  stats[S_CTX_REFS] -= contexts[dev].refs;
  contexts[dev].refs = 0;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  pthread_mutex_lock(&lock);
  INJECT("cuCtxSetCurrent");
  if (ctx != NULL) check_live_ctx(ctx, "cuCtxSetCurrent");
  pthread_mutex_unlock(&lock);
  current_ctx = ctx;
  return CUDA_SUCCESS;
}

#define CTX_STACK 16
static __thread CUcontext ctx_stack[CTX_STACK];
static __thread int ctx_depth = 0;

CUresult cuCtxPushCurrent(CUcontext ctx) {
  pthread_mutex_lock(&lock);
  INJECT("cuCtxPushCurrent");
  if (ctx != NULL) check_live_ctx(ctx, "cuCtxPushCurrent");
  pthread_mutex_unlock(&lock);
  if (ctx == NULL || ctx_depth >= CTX_STACK) return CUDA_ERROR_INVALID_VALUE;
  ctx_stack[ctx_depth++] = current_ctx;
  current_ctx = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = current_ctx;
  current_ctx = ctx_stack[--ctx_depth];
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = current_ctx;
  return CUDA_SUCCESS;
}

/* streams being captured now: as on the driver, a context synchronize is refused while any of
   its streams captures, whichever thread captures and in whatever capture mode, and the refusal
   invalidates every capture then open (the fake has one context per device and its tests run one
   device) */
static int captures_open = 0;
static int captures_not_global = 0; /* ... of them, those begun in thread-local or relaxed mode */
static unsigned long long sync_refusals = 0;

CUresult cuCtxSynchronize(void) {
  pthread_mutex_lock(&lock);
  INJECT("cuCtxSynchronize");
  NEED_CTX();
  if (captures_open > 0) {
    /* the real driver refuses only beside a capture in global mode: beside one in thread-local
       mode on another thread, an H100's driver crashed inside cuCtxSynchronize. Counted (and
       refused, as the fake's callers expect), so a test can tell a synchronize that raced one */
    if (captures_not_global > 0) stats[S_UNSAFE_SYNCS]++;
    sync_refusals++;
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  unsigned long long upto = op_seq; /* (what was enqueued before it began: DMA in flight) */
  pthread_mutex_unlock(&lock);
  wait_not_held();
  if (!lazy) {
    pthread_mutex_lock(&lock);
    seen_all(upto);
    pthread_mutex_unlock(&lock);
  }
  return lazy ? lazy_sync_all() : CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */
CUresult cuMemGetInfo(size_t* free_b, size_t* total_b) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemGetInfo");
  NEED_CTX();
  *total_b = FAKE_TOTAL_MEM;
  *free_b = FAKE_TOTAL_MEM - (size_t)stats[S_DEVICE_BYTES] - (1ull << 30);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static void* aligned(size_t n, unsigned char fill) {
  /* round up: aligned_alloc wants a multiple of the alignment */
  size_t rounded = (n + 255) & ~(size_t)255;
  void* p = aligned_alloc(256, rounded ? rounded : 256);
  if (p) memset(p, fill, rounded ? rounded : 256);
  return p;
}

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemAlloc");
  NEED_CTX();
  stats[S_DEVICE_ALLOC_CALLS]++;
  const char* limit = getenv("FAKE_CUDA_ALLOC_LIMIT");
  if (bytesize == 0 || (limit && bytesize > strtoull(limit, NULL, 0)) || bytesize > (1ull << 34)) {
    pthread_mutex_unlock(&lock);
    return bytesize == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* fresh device memory holds garbage, never zeros: a missed clear shows in the results */
  char* p = (char*)aligned(bytesize, 0xCD);
  if (!p) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  track(p, bytesize, KIND_DEVICE);
  stats[S_DEVICE_ALLOCS]++;
  stats[S_DEVICE_BYTES] += (long long)bytesize;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static CUresult mem_free(CUdeviceptr dptr);

CUresult cuMemFree(CUdeviceptr dptr) {
  if (lazy) lazy_run_all();
  return mem_free(dptr);
}

static CUresult mem_free(CUdeviceptr dptr) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemFree");
  NEED_CTX();
  Alloc* a = find_range((const char*)(uintptr_t)dptr, 0, KIND_DEVICE);
  if (!a || a->base != (char*)(uintptr_t)dptr || a->kind != KIND_DEVICE) {
    violation("cuMemFree of a pointer that is not a live allocation", dptr, 0);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  stats[S_DEVICE_ALLOCS]--;
  stats[S_DEVICE_BYTES] -= (long long)a->size;
  char* base = a->base;
  untrack(base, KIND_DEVICE);
  free(base);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  INJECT("cuMemHostAlloc");
  NEED_CTX();
  stats[S_HOST_ALLOC_CALLS]++;
  /* whole pages, as the driver maps them: no other allocation shares a page with it (a caller's
     cuMemHostRegister of a neighbour's span would be refused as overlapping otherwise) */
  size_t pages = (bytesize + 4095) & ~(size_t)4095;
  char* p = (char*)aligned_alloc(4096, pages ? pages : 4096);
  if (p) memset(p, 0xAB, pages ? pages : 4096);
  if (!p) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  track(p, bytesize, KIND_HOST);
  stats[S_HOST_ALLOCS]++;
  stats[S_HOST_BYTES] += (long long)bytesize;
  *pp = p;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* p) {
  if (lazy) lazy_run_all();
  pthread_mutex_lock(&lock);
  INJECT("cuMemFreeHost");
  NEED_CTX();
  Alloc* a = find_range((const char*)p, 0, KIND_HOST);
  if (!a || a->base != (char*)p) {
    violation("cuMemFreeHost of a pointer that is not a live allocation", (uintptr_t)p, 0);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  stats[S_HOST_ALLOCS]--;
  stats[S_HOST_BYTES] -= (long long)a->size;
  untrack((char*)p, KIND_HOST);
  free(p);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  INJECT("cuMemHostRegister");
  NEED_CTX();
  if (p == NULL || bytesize == 0) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* as the real driver: a range that overlaps page-locked memory in any byte is refused */
  for (const Alloc* a = allocs; a; a = a->next)
    if ((a->kind == KIND_REGISTERED || a->kind == KIND_HOST) && (char*)p < a->base + a->size &&
        a->base < (char*)p + bytesize) {
      pthread_mutex_unlock(&lock);
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  track((char*)p, bytesize, KIND_REGISTERED);
  stats[S_REGISTERED_BYTES] += bytesize;
  stats[S_REGISTERED]++;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* Host memory given back to the allocator while a registration still covers a whole page of it
 * (tests/fakecuda/free_check.c calls this from its free() wrapper): the registration outlived its
 * memory. On the GPU the driver keeps the old pages pinned under that address, so the next
 * allocation there is read and written by DMA through the stale registration (a wrong result).
 * trylock, bounded: a free() made by this library under its own lock skips the check. */
int fake_cuda_check_free(const char* base, size_t n) {
  uintptr_t lo = ((uintptr_t)base + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)base + n) & ~(uintptr_t)4095;
  int found = 0, tries = 0;
  if (hi <= lo) return 0;
  while (pthread_mutex_trylock(&lock) != 0)
    if (++tries > 2000) return 0;
  for (const Alloc* a = allocs; a; a = a->next)
    if (a->kind == KIND_REGISTERED && (uintptr_t)a->base < hi && lo < (uintptr_t)a->base + a->size) {
      char text[256];
      snprintf(text, sizeof(text), "host memory [%p, +%zu) freed while registered range [%p, +%zu) covers it",
               (const void*)base, n, (const void*)a->base, a->size);
      violation_text(text);
      found = 1;
      break;
    }
  pthread_mutex_unlock(&lock);
  return found;
}

CUresult cuMemHostUnregister(void* p) {
  if (lazy) lazy_run_all();
  pthread_mutex_lock(&lock);
  INJECT("cuMemHostUnregister");
  NEED_CTX();
  size_t size = 0; /* (the range that starts at p: an adjacent one may end there) */
  for (const Alloc* r = allocs; r; r = r->next)
    if (r->kind == KIND_REGISTERED && r->base == (const char*)p) size = r->size;
  if (!lazy && size) unregister_check((const char*)p, size);
  if (!untrack((const char*)p, KIND_REGISTERED)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  stats[S_REGISTERED]--;
  stats[S_REGISTERED_BYTES] -= size;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* Unknown (pageable) pointers succeed with zeroed attributes, as with the real driver. */
CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  pthread_mutex_lock(&lock);
  INJECT("cuPointerGetAttributes");
  const Alloc* a = find_range((const char*)(uintptr_t)ptr, 1, 0);
  for (unsigned int k = 0; k < n; k++) {
    switch (attrs[k]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int*)data[k] = !a ? 0u : (a->kind == KIND_HOST || a->kind == KIND_REGISTERED) ? CU_MEMORYTYPE_HOST
                                                                                           : CU_MEMORYTYPE_DEVICE;
        break;
      case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long*)data[k] = a ? a->id : 0ull; break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr*)data[k] = a ? (CUdeviceptr)(uintptr_t)a->base : 0; break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t*)data[k] = a ? a->size : 0; break;
      case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data[k] = a ? (CUcontext)&contexts[0] : NULL; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void**)data[k] = a ? (void*)(uintptr_t)ptr : NULL; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      case CU_POINTER_ATTRIBUTE_MAPPED: *(int*)data[k] = a ? (attrs[k] == CU_POINTER_ATTRIBUTE_MAPPED) : 0; break;
      default:
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* Stream-ordered pool: allocations are ordinary fake device memory, freed at once. */
typedef struct { int magic; size_t used; size_t threshold; } Pool;
#define POOL_MAGIC 0x9001

CUresult cuMemPoolCreate(CUmemoryPool* pool, const void* props) {
  (void)props;
  pthread_mutex_lock(&lock);
  INJECT("cuMemPoolCreate");
  NEED_CTX();
  Pool* p = (Pool*)calloc(1, sizeof(Pool));
  p->magic = POOL_MAGIC;
  stats[S_POOLS]++;
  *pool = (CUmemoryPool)p;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemPoolDestroy");
  NEED_CTX();
  Pool* p = (Pool*)pool;
  if (!p || p->magic != POOL_MAGIC) {
    pthread_mutex_unlock(&lock);
    return bad_handle(); /* destroyed twice */
  }
  p->magic = 0; /* kept (not freed), so a later use of the handle is seen as one */
  stats[S_POOLS]--;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static int pool_attr_is_u64(CUmemPool_attribute attr) {
  return attr >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemPoolSetAttribute");
  Pool* p = (Pool*)pool;
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) p->threshold = (size_t)*(unsigned long long*)value;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemPoolGetAttribute");
  Pool* p = (Pool*)pool;
  if (pool_attr_is_u64(attr))
    *(unsigned long long*)value = attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD ? p->threshold : p->used;
  else
    *(int*)value = 1;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  (void)keep;
  if (!pool || ((Pool*)pool)->magic != POOL_MAGIC) return bad_handle(); /* a destroyed pool */
  pthread_mutex_lock(&lock);
  INJECT("cuMemPoolTrimTo");
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream s) {
  (void)s;
  if (!pool || ((Pool*)pool)->magic != POOL_MAGIC) return bad_handle(); /* a destroyed pool */
  CUresult st = cuMemAlloc(dptr, bytesize);
  if (st == CUDA_SUCCESS) {
    pthread_mutex_lock(&lock);
    ((Pool*)pool)->used += bytesize;
    pthread_mutex_unlock(&lock);
  }
  return st;
}

/* The pool the memory came from is not recorded: a free from a pool only releases the memory
 * (in lazy mode once the stream's work ran; work of other streams still reading it is a bug that
 * shows as a violation when it runs). */
static void lazy_run_stream(CUstream s);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
  if (lazy) lazy_run_stream(s);
  return mem_free(dptr);
}

/* ------------------------------------------------------------------ streams and events */
typedef struct { int magic; } Handle;
struct Graph;
typedef struct { int magic; struct Graph* capture; int capture_invalid; unsigned long long refusals_at_begin; int capture_mode; } Stream;
#define STREAM_MAGIC 0x5157
#define EVENT_MAGIC 0x4556
#define GRAPH_MAGIC 0x4752
#define EXEC_MAGIC 0x4558
#define MAX_NODE_ARGS 257

/* ------------------------------------------------------------------ graphs (recorded work) */
enum { NODE_KERNEL = 1, NODE_MEMSET32 = 2 };
typedef struct Node {
  int kind;
  void* function;
  unsigned grid[3], block[3], shared;
  int cooperative, n_args;
  unsigned long long args[MAX_NODE_ARGS]; /* kernel arguments by value (all u64 in vyre's ABI) */
  CUdeviceptr dst;                        /* memset */
  unsigned value;
  size_t count;
} Node;
typedef struct Graph { int magic; int n, cap; Node* nodes; } Graph; /* also an exec (EXEC_MAGIC) */

static Node* add_node(Graph* g) {
  if (g->n == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 16;
    g->nodes = (Node*)realloc(g->nodes, (size_t)g->cap * sizeof(Node));
  }
  Node* node = &g->nodes[g->n++];
  memset(node, 0, sizeof(*node));
  stats[S_CAPTURED_NODES]++;
  return node;
}

static Graph* new_graph(int magic) {
  Graph* g = (Graph*)calloc(1, sizeof(Graph));
  g->magic = magic;
  stats[magic == GRAPH_MAGIC ? S_GRAPHS : S_GRAPH_EXECS]++;
  return g;
}

static void free_graph(Graph* g) {
  stats[g->magic == GRAPH_MAGIC ? S_GRAPHS : S_GRAPH_EXECS]--;
  g->magic = 0;
  free(g->nodes);
  free(g);
}

static CUresult record_memset32(Graph* g, CUdeviceptr dst, unsigned value, size_t n) {
  Node* node = add_node(g);
  node->kind = NODE_MEMSET32;
  node->dst = dst;
  node->value = value;
  node->count = n;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ lazy mode: the queues */
enum { OP_HTOD = 1, OP_DTOH, OP_DTOD, OP_MEMSET8, OP_MEMSET32, OP_KERNELS, OP_WAIT };
typedef struct Op {
  int kind;
  char* dst;          /* copies and memsets */
  const char* src;
  size_t n;           /* bytes (memset32: words) */
  int dst_kind, src_kind; /* the allocation kinds checked again when it runs (0: pageable host) */
  unsigned value;
  char* snapshot;     /* a pageable source, read at enqueue */
  Node* nodes;        /* OP_KERNELS: one launch, or a graph's nodes, by value */
  int n_nodes;
  CUstream wait_stream; /* OP_WAIT: run this stream (queue serial) up to mark first */
  unsigned long long wait_serial, wait_mark;
  struct Op* next;
} Op;

/* one stream's queue; serial tells a queue from a later one of a stream at the same address */
typedef struct Queue {
  CUstream stream;
  unsigned long long serial, enqueued, done;
  int running;     /* one of its ops runs now (a wait inside it runs other streams) */
  CUresult error;  /* the first asynchronous error not yet reported */
  Op *head, *tail;
  struct Queue* next;
} Queue;
static Queue* queues = NULL;
static unsigned long long next_queue_serial = 1;
static long long lazy_queued = 0; /* ops in all queues (fake_cuda_lazy_pending) */

/* caller holds lock */
static Queue* find_queue(CUstream s, unsigned long long serial, int create) {
  for (Queue* q = queues; q; q = q->next)
    if (q->stream == s && (serial == 0 || q->serial == serial)) return q;
  if (!create) return NULL;
  Queue* q = (Queue*)calloc(1, sizeof(Queue));
  q->stream = s;
  q->serial = next_queue_serial++;
  q->next = queues;
  queues = q;
  return q;
}

static void free_op(Op* op) {
  free(op->snapshot);
  free(op->nodes);
  free(op);
}

/* caller holds lock: a new op at the end of s's queue */
static Op* enqueue(CUstream s, int kind) {
  Queue* q = find_queue(s, 0, 1);
  Op* op = (Op*)calloc(1, sizeof(Op));
  op->kind = kind;
  if (q->tail) q->tail->next = op;
  else q->head = op;
  q->tail = op;
  q->enqueued++;
  lazy_queued++;
  return op;
}

/* caller holds lock: the page-locked allocation kind holding [p, p + n), 0 for pageable memory */
static int host_kind(const char* p, size_t n) {
  if (find_range(p, n, KIND_HOST)) return KIND_HOST;
  if (find_range(p, n, KIND_REGISTERED)) return KIND_REGISTERED;
  return 0;
}

/* caller holds lock: queue a copy; a pageable host source is read now */
static void enqueue_copy(CUstream s, int kind, char* dst, const char* src, size_t n) {
  Op* op = enqueue(s, kind);
  op->dst = dst;
  op->src = src;
  op->n = n;
  op->dst_kind = kind == OP_DTOH ? host_kind(dst, n) : KIND_DEVICE;
  op->src_kind = kind == OP_HTOD ? host_kind(src, n) : KIND_DEVICE;
  if (kind == OP_HTOD && op->src_kind == 0) {
    op->snapshot = (char*)malloc(n ? n : 1);
    memcpy(op->snapshot, src, n);
  }
}

/* caller holds lock: remove a destroyed stream's (drained) queue */
static void drop_queue(CUstream s) {
  for (Queue** pq = &queues; *pq; pq = &(*pq)->next) {
    if ((*pq)->stream == s) {
      Queue* q = *pq;
      *pq = q->next;
      for (Op* op = q->head; op;) {
        Op* next = op->next;
        free_op(op);
        lazy_queued--;
        op = next;
      }
      free(q);
      return;
    }
  }
}

CUresult cuStreamCreate(CUstream* s, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  INJECT("cuStreamCreate");
  NEED_CTX();
  Stream* h = (Stream*)calloc(1, sizeof(Stream));
  h->magic = STREAM_MAGIC;
  stats[S_STREAMS]++;
  stats[S_STREAM_CREATES]++;
  *s = (CUstream)h;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are valid handles; the fake runs all work at once */
static int is_stream(CUstream s) {
  return (uintptr_t)s == 1 || (uintptr_t)s == 2 || (s != NULL && ((Handle*)s)->magic == STREAM_MAGIC);
}
static int capturing(CUstream s) { return is_stream(s) && (uintptr_t)s > 2 && ((Stream*)s)->capture != NULL; }

/* Work the fake cannot record in a graph, on a capturing stream: the capture is invalidated (as
 * the real driver does for unsupported operations), so a test sees work that leaked into it. */
#define NO_CAPTURE(s)                                 \
  do {                                                \
    if (capturing(s)) {                               \
      ((Stream*)(s))->capture_invalid = 1;            \
      pthread_mutex_unlock(&lock);                    \
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;   \
    }                                                 \
  } while (0)

/* lazy mode: run s's whole queue, or up to mark of the queue with that serial (0: the live one);
 * then take its asynchronous error when take_error */
static CUresult lazy_run(CUstream s, unsigned long long serial, unsigned long long mark, int take_error);
#define ALL_OPS (~0ull)

CUresult cuStreamDestroy(CUstream s) {
  if (lazy) lazy_run(s, 0, ALL_OPS, 0);
  pthread_mutex_lock(&lock);
  INJECT("cuStreamDestroy");
  NEED_CTX();
  if (!is_stream(s)) {
    pthread_mutex_unlock(&lock);
    return bad_handle();
  }
  drop_queue(s);
  if (capturing(s)) {  /* (the driver ends a capture with its stream) */
    free_graph(((Stream*)s)->capture);
    captures_open--;
    if (((Stream*)s)->capture_mode != 0) captures_not_global--;
  }
  ((Handle*)s)->magic = 0;
  free(s);
  stats[S_STREAMS]--;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static void stream_seen(CUstream s, unsigned long long upto) {
  pthread_mutex_lock(&lock);
  seen_upto(s, upto);
  pthread_mutex_unlock(&lock);
}

CUresult cuStreamSynchronize(CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuStreamSynchronize");
  NEED_CTX();
  NO_CAPTURE(s);
  stats[S_SYNCS]++;
  int ok = is_stream(s);
  unsigned long long upto = op_seq;
  pthread_mutex_unlock(&lock);
  if (ok) wait_not_held();
  if (ok && !lazy) stream_seen(s, upto);
  if (ok && lazy) return lazy_run(s, 0, ALL_OPS, 1);
  return ok ? CUDA_SUCCESS : bad_handle();
}

CUresult cuStreamQuery(CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuStreamQuery");
  NEED_CTX();
  NO_CAPTURE(s);
  int ok = is_stream(s);
  unsigned long long upto = op_seq;
  pthread_mutex_unlock(&lock);
  if (ok && busy_query()) return CUDA_ERROR_NOT_READY;
  if (ok && !lazy) stream_seen(s, upto);
  if (ok && lazy) return lazy_run(s, 0, ALL_OPS, 1);
  return ok ? CUDA_SUCCESS : bad_handle();
}

/* lazy mode: where the last cuEventRecord put the event (recorded == 0: never, or in eager mode) */
typedef struct { int magic; int recorded; CUstream stream; unsigned long long serial, mark; CUstream fs; unsigned long long fseq; } Event;
/* (fs, fseq: the stream and op_seq of its last record, in both modes: DMA in flight) */

CUresult cuEventCreate(CUevent* e, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  INJECT("cuEventCreate");
  NEED_CTX();
  Event* h = (Event*)calloc(1, sizeof(Event));
  h->magic = EVENT_MAGIC;
  stats[S_EVENTS]++;
  stats[S_EVENT_CREATES]++;
  *e = (CUevent)h;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static int is_event(CUevent e) { return e != NULL && ((Handle*)e)->magic == EVENT_MAGIC; }

CUresult cuEventDestroy(CUevent e) {
  pthread_mutex_lock(&lock);
  INJECT("cuEventDestroy");
  NEED_CTX();
  if (!is_event(e)) {
    pthread_mutex_unlock(&lock);
    return bad_handle();
  }
  ((Handle*)e)->magic = 0;
  free(e);
  stats[S_EVENTS]--;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* lazy mode: run the stream e was recorded on up to its mark (success for an unrecorded event) */
static CUresult lazy_run_event(CUevent e, int take_error) {
  pthread_mutex_lock(&lock);
  Event copy = *(Event*)e;
  pthread_mutex_unlock(&lock);
  return copy.recorded ? lazy_run(copy.stream, copy.serial, copy.mark, take_error) : CUDA_SUCCESS;
}

static void event_seen(CUevent e) {
  pthread_mutex_lock(&lock);
  if (is_event(e) && ((Event*)e)->fseq) seen_upto(((Event*)e)->fs, ((Event*)e)->fseq);
  pthread_mutex_unlock(&lock);
}

/* busy: what a held GPU does to the call (a query answers NOT_READY, a synchronize waits) */
#define EVENT_CALL(name, label, busy)                                     \
  CUresult name(CUevent e) {                                              \
    pthread_mutex_lock(&lock);                                            \
    INJECT(label);                                                        \
    NEED_CTX();                                                           \
    int ok = is_event(e);                                                 \
    pthread_mutex_unlock(&lock);                                          \
    if (ok && (busy)) return CUDA_ERROR_NOT_READY;                        \
    if (ok && !lazy) event_seen(e);                                       \
    if (ok && lazy) return lazy_run_event(e, 1);                          \
    return ok ? CUDA_SUCCESS : bad_handle();                 \
  }
EVENT_CALL(cuEventQuery, "cuEventQuery", busy_query())
EVENT_CALL(cuEventSynchronize, "cuEventSynchronize", (wait_not_held(), 0))

CUresult cuEventRecord(CUevent e, CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuEventRecord");
  NEED_CTX();
  NO_CAPTURE(s);
  int ok = is_event(e) && is_stream(s);
  if (ok) {
    Event* ev = (Event*)e;
    stats[S_EVENT_RECORDS]++;
    ev->fs = s;
    ev->fseq = ++op_seq;
    ev->recorded = lazy;
    if (lazy) {
      Queue* q = find_queue(s, 0, 1);
      ev->stream = s;
      ev->serial = q->serial;
      ev->mark = q->enqueued;
    }
  }
  pthread_mutex_unlock(&lock);
  return ok ? CUDA_SUCCESS : bad_handle();
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  INJECT("cuStreamWaitEvent");
  NEED_CTX();
  NO_CAPTURE(s);
  int ok = is_event(e) && is_stream(s);
  if (ok) stats[S_STREAM_WAITS]++;
  Event* ev = (Event*)e;
  if (ok && !lazy && ev->fseq) {
    if (n_joins == MAX_JOINS) n_joins = 0; /* (forgets: never a false violation) */
    joins[n_joins++] = (Join){s, ++op_seq, ev->fs, ev->fseq};
  }
  if (ok && lazy && ev->recorded) {
    Op* op = enqueue(s, OP_WAIT);
    op->wait_stream = ev->stream;
    op->wait_serial = ev->serial;
    op->wait_mark = ev->mark;
  }
  pthread_mutex_unlock(&lock);
  return ok ? CUDA_SUCCESS : bad_handle();
}

/* the function runs on the callback thread once the work queued before it is done (lazy mode
 * runs that work now), and after fake_cuda_hold(0) when the GPU is held */
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  pthread_mutex_lock(&lock);
  INJECT("cuLaunchHostFunc");
  NEED_CTX();
  NO_CAPTURE(s);
  int ok = is_stream(s) && fn != NULL;
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_VALUE;
  if (lazy) lazy_run(s, 0, ALL_OPS, 0);
  return queue_host_call(fn, data);
}

CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  pthread_mutex_lock(&lock);
  INJECT("cuEventElapsedTime");
  NEED_CTX();
  int ok = is_event(a) && is_event(b);
  pthread_mutex_unlock(&lock);
  if (ok && lazy) {
    lazy_run_event(a, 0);
    lazy_run_event(b, 0);
  }
  *ms = 0.001f;
  for (int k = 0; k < 16 && block_times[k].block; k++)
    if (block_times[k].block == last_block_x) *ms = block_times[k].ms;
  return ok ? CUDA_SUCCESS : bad_handle();
}

/* ------------------------------------------------------------------ copies and clears */
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemcpyHtoDAsync");
  NEED_CTX();
  NO_CAPTURE(s);
  if (straddles_page_locked((const char*)src, n)) {
    violation("cuMemcpyHtoDAsync host range runs past the end of page-locked memory", (CUdeviceptr)(uintptr_t)src, n);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  stats[S_HTOD]++;
  if (find_range((const char*)src, n, KIND_REGISTERED)) stats[S_HTOD_REGISTERED]++;
  op_seq++;
  if (is_stream(s)) in_flight((const char*)src, n, s);
  if (!is_stream(s) || !find_range((const char*)(uintptr_t)dst, n, KIND_DEVICE)) {
    if (is_stream(s)) violation("cuMemcpyHtoDAsync destination", dst, n);
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_INVALID_VALUE : bad_handle();
  }
  int deferred = lazy;
  if (deferred) enqueue_copy(s, OP_HTOD, (char*)(uintptr_t)dst, (const char*)src, n);
  pthread_mutex_unlock(&lock);
  if (!deferred) memcpy((void*)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemcpyDtoHAsync");
  NEED_CTX();
  NO_CAPTURE(s);
  if (straddles_page_locked((const char*)dst, n)) {
    violation("cuMemcpyDtoHAsync host range runs past the end of page-locked memory", (CUdeviceptr)(uintptr_t)dst, n);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  stats[S_DTOH]++;
  if (find_range((const char*)dst, n, KIND_REGISTERED)) stats[S_DTOH_REGISTERED]++;
  op_seq++;
  if (is_stream(s)) in_flight((const char*)dst, n, s);
  if (!is_stream(s) || !find_range((const char*)(uintptr_t)src, n, KIND_DEVICE)) {
    if (is_stream(s)) violation("cuMemcpyDtoHAsync source", src, n);
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_INVALID_VALUE : bad_handle();
  }
  int deferred = lazy;
  if (deferred) enqueue_copy(s, OP_DTOH, (char*)dst, (const char*)(uintptr_t)src, n);
  pthread_mutex_unlock(&lock);
  if (!deferred) memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemcpyDtoDAsync");
  NEED_CTX();
  stats[S_DTOD]++;
  if (!is_stream(s) || !find_range((const char*)(uintptr_t)dst, n, KIND_DEVICE) ||
      !find_range((const char*)(uintptr_t)src, n, KIND_DEVICE)) {
    if (is_stream(s)) violation("cuMemcpyDtoDAsync source or destination", dst, n);
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_INVALID_VALUE : bad_handle();
  }
  int deferred = lazy && !capturing(s);
  if (deferred) enqueue_copy(s, OP_DTOD, (char*)(uintptr_t)dst, (const char*)(uintptr_t)src, n);
  pthread_mutex_unlock(&lock);
  if (!deferred) memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  if (lazy) lazy_run_all();
  pthread_mutex_lock(&lock);
  INJECT("cuMemcpyDtoH");
  NEED_CTX();
  if (straddles_page_locked((const char*)dst, n)) {
    violation("cuMemcpyDtoH host range runs past the end of page-locked memory", (CUdeviceptr)(uintptr_t)dst, n);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!find_range((const char*)(uintptr_t)src, n, KIND_DEVICE)) {
    violation("cuMemcpyDtoH source", src, n);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_unlock(&lock);
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemsetD8Async");
  NEED_CTX();
  NO_CAPTURE(s);
  stats[S_MEMSETS]++;
  if (!is_stream(s) || !find_range((const char*)(uintptr_t)dst, n, KIND_DEVICE)) {
    if (is_stream(s)) violation("cuMemsetD8Async", dst, n);
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_INVALID_VALUE : bad_handle();
  }
  int deferred = lazy;
  if (deferred) {
    Op* op = enqueue(s, OP_MEMSET8);
    op->dst = (char*)(uintptr_t)dst;
    op->n = n;
    op->value = value;
    op->dst_kind = KIND_DEVICE;
  }
  pthread_mutex_unlock(&lock);
  if (!deferred) memset((void*)(uintptr_t)dst, value, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s) {
  pthread_mutex_lock(&lock);
  INJECT("cuMemsetD32Async");
  NEED_CTX();
  if (capturing(s)) {
    CUresult rst = record_memset32(((Stream*)s)->capture, dst, value, n);
    pthread_mutex_unlock(&lock);
    return rst;
  }
  stats[S_MEMSETS]++;
  if (!is_stream(s) || (dst & 3) || !find_range((const char*)(uintptr_t)dst, 4 * n, KIND_DEVICE)) {
    if (is_stream(s)) violation("cuMemsetD32Async", dst, 4 * n);
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_INVALID_VALUE : bad_handle();
  }
  int deferred = lazy;
  if (deferred) {
    Op* op = enqueue(s, OP_MEMSET32);
    op->dst = (char*)(uintptr_t)dst;
    op->n = n;
    op->value = value;
    op->dst_kind = KIND_DEVICE;
  }
  pthread_mutex_unlock(&lock);
  if (!deferred)
    for (size_t k = 0; k < n; k++) ((unsigned int*)(uintptr_t)dst)[k] = value;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ modules and launches */
typedef struct Module {
  char* image; /* a copy: PTX text, or the ELF bytes of a cubin */
  size_t size;
  unsigned int* barrier; /* the _vyre_grid_barrier global, when the image defines it */
  int unloaded;          /* kept (not freed) after cuModuleUnload, so a later launch of one of its
                            functions is seen and counted as a violation instead of reading freed memory */
} Module;

typedef struct Function {
  Module* module;
  char name[128];
  int max_dynamic_shared;
  int arg_count; /* u64 kernel arguments (fake_cuda_set_arg_count); 0: unknown, not capturable */
} Function;

/* 0: a cooperative launch on a capturing stream fails, as on a driver without cooperative nodes */
static int capture_cooperative = 1;
void fake_cuda_set_capture_cooperative(int on) { capture_cooperative = on; }

void fake_cuda_set_arg_count(void* f, int n) {
  pthread_mutex_lock(&lock);
  ((Function*)f)->arg_count = n;
  pthread_mutex_unlock(&lock);
}

static size_t image_size(const unsigned char* p) {
  if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) {
    uint64_t shoff, phoff;
    uint16_t shentsize, shnum, phentsize, phnum;
    memcpy(&phoff, p + 0x20, 8);
    memcpy(&shoff, p + 0x28, 8);
    memcpy(&phentsize, p + 0x36, 2);
    memcpy(&phnum, p + 0x38, 2);
    memcpy(&shentsize, p + 0x3A, 2);
    memcpy(&shnum, p + 0x3C, 2);
    size_t a = (size_t)shoff + (size_t)shentsize * shnum, b = (size_t)phoff + (size_t)phentsize * phnum;
    return a > b ? a : b;
  }
  return strlen((const char*)p) + 1;
}

static int contains(const Module* m, const char* needle) {
  size_t n = strlen(needle);
  if (n == 0 || n > m->size) return 0;
  for (size_t k = 0; k + n <= m->size; k++)
    if (memcmp(m->image + k, needle, n) == 0) return 1;
  return 0;
}

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int n, CUjit_option* options, void** values) {
  pthread_mutex_lock(&lock);
  INJECT("cuModuleLoadDataEx");
  NEED_CTX();
  Module* m = (Module*)calloc(1, sizeof(Module));
  m->size = image_size((const unsigned char*)image);
  m->image = (char*)malloc(m->size);
  memcpy(m->image, image, m->size);
  int elf = m->size >= 4 && memcmp(m->image, "\x7f" "ELF", 4) == 0;
  if (!elf && !contains(m, ".version")) {
    for (unsigned k = 0; k < n; k++)
      if (options[k] == CU_JIT_ERROR_LOG_BUFFER)
        snprintf((char*)values[k], 128, "ptxas fatal   : fake libcuda: not PTX (no .version directive)");
    free(m->image);
    free(m);
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_PTX;
  }
  if (contains(m, "_vyre_grid_barrier")) {
    m->barrier = (unsigned int*)aligned(16, 0xCD);
    track((char*)m->barrier, 16, KIND_GLOBAL);
  }
  stats[S_MODULES]++;
  *module = (CUmodule)m;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return cuModuleLoadDataEx(module, image, 0, NULL, NULL);
}

CUresult cuModuleUnload(CUmodule module) {
  if (lazy) lazy_run_all();
  pthread_mutex_lock(&lock);
  INJECT("cuModuleUnload");
  NEED_CTX();
  Module* m = (Module*)module;
  if (m->unloaded) {
    violation_text("cuModuleUnload of a module already unloaded");
    pthread_mutex_unlock(&lock);
    return bad_handle();
  }
  if (m->barrier) {
    untrack((char*)m->barrier, KIND_GLOBAL);
    free(m->barrier);
    m->barrier = NULL;
  }
  free(m->image);
  m->image = NULL;
  m->size = 0;
  m->unloaded = 1;
  stats[S_MODULES]--;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule module, const char* name) {
  pthread_mutex_lock(&lock);
  INJECT("cuModuleGetFunction");
  NEED_CTX();
  Module* m = (Module*)module;
  if (!contains(m, name)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_NOT_FOUND;
  }
  /* functions live as long as the process: the backend keeps their handles with the module */
  Function* fn = (Function*)calloc(1, sizeof(Function));
  fn->module = m;
  snprintf(fn->name, sizeof(fn->name), "%s", name);
  fn->max_dynamic_shared = FAKE_DEFAULT_SHARED;
  *f = (CUfunction)fn;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUmodule module, const char* name) {
  Module* m = (Module*)module;
  if (strcmp(name, "_vyre_grid_barrier") != 0 || !m->barrier) return CUDA_ERROR_NOT_FOUND;
  *dptr = (CUdeviceptr)(uintptr_t)m->barrier;
  *bytes = 4;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attrib, int value) {
  pthread_mutex_lock(&lock);
  INJECT("cuFuncSetAttribute");
  NEED_CTX();
  pthread_mutex_unlock(&lock);
  if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_SUCCESS;
  if (value < 0 || value > FAKE_SHARED_OPTIN) return CUDA_ERROR_INVALID_VALUE;
  ((Function*)f)->max_dynamic_shared = value;
  return CUDA_SUCCESS;
}

static int occupancy(int threads, size_t shared) {
  if (occupancy_override >= 0) return occupancy_override;
  if (threads <= 0 || threads > 1024) return 0;
  int blocks = 2048 / threads;
  if (blocks > 32) blocks = 32;
  if (shared) {
    size_t by_shared = FAKE_SHARED_PER_SM / (shared + 1024); /* 1 KiB reserved per block */
    if ((size_t)blocks > by_shared) blocks = (int)by_shared;
  }
  return blocks;
}

CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attrib, CUfunction f) {
  pthread_mutex_lock(&lock);
  INJECT("cuFuncGetAttribute");
  NEED_CTX();
  pthread_mutex_unlock(&lock);
  (void)f;
  if (attrib != CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) return CUDA_ERROR_NOT_SUPPORTED;
  *value = kernel_max_threads;
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int threads, size_t shared) {
  pthread_mutex_lock(&lock);
  INJECT("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  NEED_CTX();
  pthread_mutex_unlock(&lock);
  (void)f;
  *n = occupancy(threads, shared);
  return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shared, CUstream s, void** params, int cooperative, int count) {
  (void)params; /* the hook reads them */
  Function* fn = (Function*)f;
  unsigned long long threads = (unsigned long long)bx * by * bz;
  if (!is_stream(s)) return bad_handle();
  if (fn->module->unloaded) {
    violation_text("launch of a function of an unloaded module");
    return bad_handle();
  }
  if (!gx || !gy || !gz || !threads || threads > 1024 || bx > 1024 || by > 1024 || bz > 64 || gy > 65535 ||
      gz > 65535 || gx > 2147483647u)
    return CUDA_ERROR_INVALID_VALUE;
  if ((int)shared > fn->max_dynamic_shared) return CUDA_ERROR_INVALID_VALUE;
  if (cooperative &&
      (unsigned long long)gx * gy * gz > (unsigned long long)occupancy((int)threads, shared) * FAKE_SM_COUNT)
    return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  if (!count) return CUDA_SUCCESS;
  stats[S_LAUNCHES]++;
  if (cooperative) stats[S_COOP_LAUNCHES]++;
  return CUDA_SUCCESS;
}

/* a kernel node: the launch with its arguments' values (the function's arg_count of them) */
static void fill_kernel_node(Node* node, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared, void** params, int cooperative) {
  Function* fn = (Function*)f;
  node->kind = NODE_KERNEL;
  node->function = f;
  node->grid[0] = gx, node->grid[1] = gy, node->grid[2] = gz;
  node->block[0] = bx, node->block[1] = by, node->block[2] = bz;
  node->shared = shared;
  node->cooperative = cooperative;
  node->n_args = fn->arg_count < MAX_NODE_ARGS ? fn->arg_count : MAX_NODE_ARGS;
  for (int k = 0; k < node->n_args; k++) memcpy(&node->args[k], params[k], 8);
}

/* a launch on a capturing stream: checked like a launch, recorded with its arguments' values */
static CUresult record_launch(CUstream s, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shared, void** params, int cooperative) {
  Stream* st = (Stream*)s;
  Function* fn = (Function*)f;
  CUresult check = launch(f, gx, gy, gz, bx, by, bz, shared, s, params, cooperative, 0);
  if (check == CUDA_SUCCESS && fn->arg_count <= 0) check = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (check == CUDA_SUCCESS && cooperative && !capture_cooperative) check = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (check != CUDA_SUCCESS) {
    st->capture_invalid = 1;
    return check;
  }
  fill_kernel_node(add_node(st->capture), f, gx, gy, gz, bx, by, bz, shared, params, cooperative);
  return CUDA_SUCCESS;
}

/* Runs kernel and memset nodes in order, calling the launch hook without the lock. eager: a graph
 * launch of eager mode, which checks and counts each node now; lazy ops were checked and counted
 * at enqueue (a memset's range is checked again: memory freed meanwhile is a violation). */
static CUresult run_nodes(const Node* nodes, int n, CUstream s, int eager) {
  for (int k = 0; k < n; k++) {
    const Node* node = &nodes[k];
    CUresult st = CUDA_SUCCESS;
    if (node->kind == NODE_MEMSET32) {
      pthread_mutex_lock(&lock);
      if (eager) stats[S_MEMSETS]++;
      if ((node->dst & 3) || !find_range((const char*)(uintptr_t)node->dst, 4 * node->count, KIND_DEVICE)) {
        violation("graph memset node", node->dst, 4 * node->count);
        st = CUDA_ERROR_INVALID_VALUE;
      } else {
        for (size_t j = 0; j < node->count; j++) ((unsigned int*)(uintptr_t)node->dst)[j] = node->value;
      }
      pthread_mutex_unlock(&lock);
    } else {
      void* argp[MAX_NODE_ARGS];
      unsigned long long args[MAX_NODE_ARGS];
      memcpy(args, node->args, (size_t)node->n_args * 8); /* the hook gets pointers, as from a caller */
      for (int j = 0; j < node->n_args; j++) argp[j] = &args[j];
      pthread_mutex_lock(&lock);
      if (eager)
        st = launch(node->function, node->grid[0], node->grid[1], node->grid[2], node->block[0], node->block[1],
                    node->block[2], node->shared, s, argp, node->cooperative, 1);
      launch_hook_t hook = launch_hook;
      pthread_mutex_unlock(&lock);
      if (st == CUDA_SUCCESS && hook)
        st = (CUresult)hook(node->function, node->grid[0], node->grid[1], node->grid[2], node->block[0],
                            node->block[1], node->block[2], node->shared, argp, node->cooperative);
    }
    if (st != CUDA_SUCCESS) return st;
  }
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ lazy mode: enqueue and run */
/* caller holds lock: a launch checked and counted as in eager mode, queued with its arguments'
 * values. *now: the function's argument count is unknown, so its arguments cannot be copied: the
 * caller runs the stream's queue, then the launch, before returning (a legal, earlier schedule). */
static CUresult lazy_launch(CUstream s, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared, void** params, int cooperative, int* now) {
  Function* fn = (Function*)f;
  CUresult st = launch(f, gx, gy, gz, bx, by, bz, shared, s, params, cooperative, 1);
  *now = st == CUDA_SUCCESS && fn->arg_count <= 0;
  if (st != CUDA_SUCCESS || *now) return st;
  Op* op = enqueue(s, OP_KERNELS);
  op->nodes = (Node*)calloc(1, sizeof(Node));
  op->n_nodes = 1;
  fill_kernel_node(op->nodes, f, gx, gy, gz, bx, by, bz, shared, params, cooperative);
  return CUDA_SUCCESS;
}

/* caller holds lock: a graph launch, its nodes checked and counted now and queued by value (a
 * later cuGraphExecUpdate or cuGraphExecDestroy does not change work already launched) */
static CUresult lazy_graph_launch(const Graph* e, CUstream s) {
  for (int k = 0; k < e->n; k++) {
    const Node* node = &e->nodes[k];
    CUresult st = CUDA_SUCCESS;
    if (node->kind == NODE_MEMSET32) {
      stats[S_MEMSETS]++;
      if ((node->dst & 3) || !find_range((const char*)(uintptr_t)node->dst, 4 * node->count, KIND_DEVICE)) {
        violation("graph memset node", node->dst, 4 * node->count);
        st = CUDA_ERROR_INVALID_VALUE;
      }
    } else {
      void* argp[MAX_NODE_ARGS];
      st = launch(node->function, node->grid[0], node->grid[1], node->grid[2], node->block[0], node->block[1],
                  node->block[2], node->shared, s, argp, node->cooperative, 1);
    }
    if (st != CUDA_SUCCESS) return st;
  }
  Op* op = enqueue(s, OP_KERNELS);
  op->nodes = (Node*)malloc((size_t)(e->n ? e->n : 1) * sizeof(Node));
  memcpy(op->nodes, e->nodes, (size_t)e->n * sizeof(Node));
  op->n_nodes = e->n;
  return CUDA_SUCCESS;
}

static const char* OP_NAMES[] = {"", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync",
                                 "cuMemsetD8Async", "cuMemsetD32Async"};

/* one queued op of stream s, without the lock */
static CUresult run_op(const Op* op, CUstream s) {
  if (op->kind == OP_WAIT) {
    lazy_run(op->wait_stream, op->wait_serial, op->wait_mark, 0);
    return CUDA_SUCCESS;
  }
  if (op->kind == OP_KERNELS) return run_nodes(op->nodes, op->n_nodes, s, 0);
  size_t bytes = op->kind == OP_MEMSET32 ? 4 * op->n : op->n;
  pthread_mutex_lock(&lock);
  int live = (op->dst_kind == 0 || find_range(op->dst, bytes, op->dst_kind)) &&
             (op->src == NULL || op->src_kind == 0 || find_range(op->src, bytes, op->src_kind));
  if (!live) {
    char what[128];
    snprintf(what, sizeof(what), "lazy %s, run after its memory was freed", OP_NAMES[op->kind]);
    violation(what, (unsigned long long)(uintptr_t)op->dst, bytes);
  }
  pthread_mutex_unlock(&lock);
  if (!live) return CUDA_ERROR_ILLEGAL_ADDRESS;
  switch (op->kind) {
    case OP_HTOD:
    case OP_DTOH:
    case OP_DTOD: memmove(op->dst, op->snapshot ? op->snapshot : op->src, op->n); break;
    case OP_MEMSET8: memset(op->dst, (int)op->value, op->n); break;
    default:
      for (size_t k = 0; k < op->n; k++) ((unsigned int*)op->dst)[k] = op->value;
      break;
  }
  return CUDA_SUCCESS;
}

/* serialises lazy execution; recursive: a wait op runs another stream from inside a run */
static pthread_mutex_t lazy_mu;
static pthread_once_t lazy_mu_once = PTHREAD_ONCE_INIT;
static void lazy_mu_init(void) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&lazy_mu, &attr);
  pthread_mutexattr_destroy(&attr);
}

/* Another thread runs queued work. It may be inside the launch hook, waiting for the GIL that this
 * thread's caller holds: a deadlock that lazy mode's one-thread rule avoids. Rather than hang a
 * test run, a wait this long ends the process with the reason. */
#define LAZY_WAIT_LIMIT_S 30
static void lazy_enter(void) {
  pthread_once(&lazy_mu_once, lazy_mu_init);
  struct timespec limit;
  clock_gettime(CLOCK_REALTIME, &limit);
  limit.tv_sec += LAZY_WAIT_LIMIT_S;
  if (pthread_mutex_timedlock(&lazy_mu, &limit) != 0) {
    fprintf(stderr, "fake libcuda: lazy mode: waited %d s for another thread's queued stream work (a launch "
                    "hook waiting for the GIL this thread holds?); lazy mode supports one thread calling the "
                    "driver\n", LAZY_WAIT_LIMIT_S);
    abort();
  }
}

static CUresult lazy_run(CUstream s, unsigned long long serial, unsigned long long mark, int take_error) {
  lazy_enter();
  for (;;) {
    pthread_mutex_lock(&lock);
    Queue* q = find_queue(s, serial, 0);
    if (!q || !q->head || q->done >= mark) {
      pthread_mutex_unlock(&lock);
      break;
    }
    if (q->running) { /* cannot happen with marks taken at call time; never loop on it */
      violation_text("lazy mode: a stream waits on work queued after the wait that runs it");
      pthread_mutex_unlock(&lock);
      break;
    }
    Op* op = q->head;
    q->head = op->next;
    if (!q->head) q->tail = NULL;
    q->running = 1;
    lazy_queued--;
    unsigned long long q_serial = q->serial;
    pthread_mutex_unlock(&lock);
    CUresult st = run_op(op, s);
    free_op(op);
    pthread_mutex_lock(&lock);
    q = find_queue(s, q_serial, 0);
    if (q) {
      q->running = 0;
      q->done++;
      if (st != CUDA_SUCCESS && q->error == CUDA_SUCCESS) q->error = st;
    }
    pthread_mutex_unlock(&lock);
  }
  CUresult error = CUDA_SUCCESS;
  if (take_error) {
    pthread_mutex_lock(&lock);
    Queue* q = find_queue(s, serial, 0);
    if (q) {
      error = q->error;
      q->error = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
  }
  pthread_mutex_unlock(&lazy_mu);
  return error;
}

static void lazy_run_stream(CUstream s) { lazy_run(s, 0, ALL_OPS, 0); }

static void lazy_run_all(void) {
  pthread_mutex_lock(&lock);
  int n = 0;
  for (Queue* q = queues; q; q = q->next) n++;
  CUstream* streams = (CUstream*)malloc((size_t)(n ? n : 1) * sizeof(CUstream));
  unsigned long long* serials = (unsigned long long*)malloc((size_t)(n ? n : 1) * sizeof(unsigned long long));
  n = 0;
  for (Queue* q = queues; q; q = q->next, n++) streams[n] = q->stream, serials[n] = q->serial;
  pthread_mutex_unlock(&lock);
  for (int k = 0; k < n; k++) lazy_run(streams[k], serials[k], ALL_OPS, 0);
  free(streams);
  free(serials);
}

static CUresult lazy_sync_all(void) {
  lazy_run_all();
  CUresult error = CUDA_SUCCESS;
  pthread_mutex_lock(&lock);
  for (Queue* q = queues; q; q = q->next) {
    if (error == CUDA_SUCCESS) error = q->error;
    q->error = CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&lock);
  return error;
}

/* Test controls: lazy mode on or off (returns the previous setting; turning it off runs every
 * queue first and drops their unreported errors), and how many ops wait in the queues now. */
int fake_cuda_set_lazy(int on) {
  pthread_mutex_lock(&lock);
  int before = lazy;
  pthread_mutex_unlock(&lock);
  if (before && !on) lazy_sync_all();
  pthread_mutex_lock(&lock);
  lazy = on ? 1 : 0;
  pthread_mutex_unlock(&lock);
  return before;
}

__attribute__((constructor)) static void lazy_from_environment(void) {
  const char* v = getenv("FAKE_CUDA_LAZY");
  lazy = v != NULL && atoi(v) != 0;
}

long long fake_cuda_lazy_pending(void) {
  pthread_mutex_lock(&lock);
  long long n = lazy_queued;
  pthread_mutex_unlock(&lock);
  return n;
}

/* invalidated by work the fake cannot record, or by a context synchronize refused meanwhile */
static int capture_broken(const Stream* st) {
  return st->capture_invalid || st->refusals_at_begin != sync_refusals;
}

CUresult cuStreamBeginCapture(CUstream s, int mode) {
  pthread_mutex_lock(&lock);
  INJECT("cuStreamBeginCapture");
  NEED_CTX();
  if (!is_stream(s) || capturing(s)) {
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_ILLEGAL_STATE : bad_handle();
  }
  ((Stream*)s)->capture = new_graph(GRAPH_MAGIC);
  ((Stream*)s)->capture_invalid = 0;
  ((Stream*)s)->refusals_at_begin = sync_refusals;
  ((Stream*)s)->capture_mode = mode; /* 0 global, 1 thread-local, 2 relaxed */
  captures_open++;
  if (mode != 0) captures_not_global++;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, void** graph) {
  pthread_mutex_lock(&lock);
  NEED_CTX();
  *graph = NULL;
  if (!capturing(s)) {
    pthread_mutex_unlock(&lock);
    return is_stream(s) ? CUDA_ERROR_ILLEGAL_STATE : bad_handle();
  }
  Stream* st = (Stream*)s;
  Graph* g = st->capture;
  st->capture = NULL;
  captures_open--;
  if (st->capture_mode != 0) captures_not_global--;
  CUresult injected_status = injected("cuStreamEndCapture");
  if (capture_broken(st) || injected_status != CUDA_SUCCESS) {
    free_graph(g);
    pthread_mutex_unlock(&lock);
    return injected_status != CUDA_SUCCESS ? injected_status : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = g;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream s, int* status) {
  pthread_mutex_lock(&lock);
  NEED_CTX();
  *status = capturing(s) ? (capture_broken((Stream*)s) ? 2 : 1) : 0;
  pthread_mutex_unlock(&lock);
  return is_stream(s) ? CUDA_SUCCESS : bad_handle();
}

static int is_graph(void* g, int magic) { return g != NULL && ((Graph*)g)->magic == magic; }

CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  (void)flags;
  pthread_mutex_lock(&lock);
  INJECT("cuGraphInstantiateWithFlags");
  NEED_CTX();
  if (!is_graph(graph, GRAPH_MAGIC)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  Graph* g = (Graph*)graph;
  Graph* e = new_graph(EXEC_MAGIC);
  e->n = e->cap = g->n;
  e->nodes = (Node*)malloc((size_t)(g->n ? g->n : 1) * sizeof(Node));
  memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof(Node));
  *exec = e;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* the same topology (node kinds, functions, cooperative flags): take the new parameters */
CUresult cuGraphExecUpdate(void* exec, void* graph, void* info) {
  (void)info;
  pthread_mutex_lock(&lock);
  INJECT("cuGraphExecUpdate");
  NEED_CTX();
  if (!is_graph(exec, EXEC_MAGIC) || !is_graph(graph, GRAPH_MAGIC)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  Graph* e = (Graph*)exec;
  Graph* g = (Graph*)graph;
  int same = e->n == g->n;
  for (int k = 0; same && k < g->n; k++)
    same = e->nodes[k].kind == g->nodes[k].kind && e->nodes[k].function == g->nodes[k].function &&
           e->nodes[k].cooperative == g->nodes[k].cooperative;
  if (!same) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof(Node));
  stats[S_EXEC_UPDATES]++;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* runs the nodes in order, synchronously, like every stream operation of eager mode */
CUresult cuGraphLaunch(void* exec, CUstream s) {
  delay_us(graph_launch_delay_us);
  pthread_mutex_lock(&lock);
  INJECT("cuGraphLaunch");
  NEED_CTX();
  NO_CAPTURE(s);
  if (!is_graph(exec, EXEC_MAGIC) || !is_stream(s)) {
    pthread_mutex_unlock(&lock);
    return bad_handle();
  }
  Graph* e = (Graph*)exec;
  stats[S_GRAPH_LAUNCHES]++;
  if (lazy) {
    CUresult rst = lazy_graph_launch(e, s);
    pthread_mutex_unlock(&lock);
    return rst;
  }
  pthread_mutex_unlock(&lock);
  return run_nodes(e->nodes, e->n, s, 1);
}

CUresult cuGraphDestroy(void* graph) {
  pthread_mutex_lock(&lock);
  if (!is_graph(graph, GRAPH_MAGIC)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  free_graph((Graph*)graph);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(void* exec) {
  pthread_mutex_lock(&lock);
  if (!is_graph(exec, EXEC_MAGIC)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  free_graph((Graph*)exec);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void** params, void** extra) {
  (void)extra;
  delay_us(launch_delay_us);
  pthread_mutex_lock(&lock);
  INJECT("cuLaunchKernel");
  NEED_CTX();
  if (capturing(s)) {
    CUresult rst = record_launch(s, f, gx, gy, gz, bx, by, bz, shared, params, 0);
    pthread_mutex_unlock(&lock);
    return rst;
  }
  if (lazy) {
    int now;
    CUresult rst = lazy_launch(s, f, gx, gy, gz, bx, by, bz, shared, params, 0, &now);
    last_block_x = (int)bx;
    launch_hook_t hook = launch_hook;
    pthread_mutex_unlock(&lock);
    if (!now) return rst;
    lazy_run_stream(s);
    return hook ? (CUresult)hook(f, gx, gy, gz, bx, by, bz, shared, params, 0) : CUDA_SUCCESS;
  }
  CUresult st = launch(f, gx, gy, gz, bx, by, bz, shared, s, params, 0, 1);
  last_block_x = (int)bx;
  launch_hook_t hook = launch_hook;
  pthread_mutex_unlock(&lock);
  if (st == CUDA_SUCCESS && hook) st = (CUresult)hook(f, gx, gy, gz, bx, by, bz, shared, params, 0);
  return st;
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared, CUstream s, void** params) {
  pthread_mutex_lock(&lock);
  INJECT("cuLaunchCooperativeKernel");
  NEED_CTX();
  if (capturing(s)) {
    CUresult rst = record_launch(s, f, gx, gy, gz, bx, by, bz, shared, params, 1);
    pthread_mutex_unlock(&lock);
    return rst;
  }
  if (lazy) {
    int now;
    CUresult rst = lazy_launch(s, f, gx, gy, gz, bx, by, bz, shared, params, 1, &now);
    launch_hook_t hook = launch_hook;
    pthread_mutex_unlock(&lock);
    if (!now) return rst;
    lazy_run_stream(s);
    return hook ? (CUresult)hook(f, gx, gy, gz, bx, by, bz, shared, params, 1) : CUDA_SUCCESS;
  }
  CUresult st = launch(f, gx, gy, gz, bx, by, bz, shared, s, params, 1, 1);
  launch_hook_t hook = launch_hook;
  pthread_mutex_unlock(&lock);
  if (st == CUDA_SUCCESS && hook) st = (CUresult)hook(f, gx, gy, gz, bx, by, bz, shared, params, 1);
  return st;
}

/* ------------------------------------------------------------------ error names */
static const struct { CUresult status; const char* name; const char* text; } ERRORS[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     "too many blocks in cooperative launch"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
     "the graph update was not performed because it included changes which violated constraints"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult cuGetErrorName(CUresult status, const char** name) {
  for (size_t k = 0; k < sizeof(ERRORS) / sizeof(ERRORS[0]); k++)
    if (ERRORS[k].status == status) {
      *name = ERRORS[k].name;
      return CUDA_SUCCESS;
    }
  *name = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult status, const char** text) {
  for (size_t k = 0; k < sizeof(ERRORS) / sizeof(ERRORS[0]); k++)
    if (ERRORS[k].status == status) {
      *text = ERRORS[k].text;
      return CUDA_SUCCESS;
    }
  *text = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

/* NVRTC looks this up (dlsym) in whatever libcuda.so.1 is loaded; the fake has no export tables */
CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  (void)id;
  *table = NULL;
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------ the entry-point table */
#define ENTRY(fn) {#fn, (void*)fn}
static const struct { const char* name; void* fn; } TABLE[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet),
    ENTRY(cuDeviceGetName), ENTRY(cuDeviceGetPCIBusId), ENTRY(cuDeviceTotalMem), ENTRY(cuDeviceGetAttribute),
    ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuDevicePrimaryCtxRelease), ENTRY(cuDevicePrimaryCtxReset), ENTRY(cuDevicePrimaryCtxGetState),
    ENTRY(cuCtxSetCurrent), ENTRY(cuCtxGetCurrent), ENTRY(cuCtxSynchronize), ENTRY(cuMemGetInfo),
    ENTRY(cuMemAlloc), ENTRY(cuMemFree), ENTRY(cuMemHostAlloc), ENTRY(cuMemFreeHost), ENTRY(cuStreamCreate),
    ENTRY(cuStreamDestroy), ENTRY(cuStreamSynchronize), ENTRY(cuStreamQuery), ENTRY(cuEventCreate),
    ENTRY(cuEventDestroy), ENTRY(cuEventQuery), ENTRY(cuEventSynchronize), ENTRY(cuEventRecord),
    ENTRY(cuEventElapsedTime), ENTRY(cuMemcpyHtoDAsync), ENTRY(cuMemcpyDtoHAsync), ENTRY(cuMemsetD8Async),
    ENTRY(cuMemsetD32Async), ENTRY(cuModuleLoadDataEx), ENTRY(cuModuleUnload), ENTRY(cuModuleGetFunction),
    ENTRY(cuModuleGetGlobal), ENTRY(cuFuncSetAttribute), ENTRY(cuFuncGetAttribute), ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessor),
    ENTRY(cuLaunchKernel), ENTRY(cuLaunchCooperativeKernel), ENTRY(cuGetErrorName), ENTRY(cuGetErrorString),
    ENTRY(cuGetExportTable), ENTRY(cuCtxPushCurrent), ENTRY(cuCtxPopCurrent), ENTRY(cuMemHostRegister),
    ENTRY(cuMemHostUnregister), ENTRY(cuPointerGetAttributes), ENTRY(cuMemPoolCreate), ENTRY(cuMemPoolDestroy),
    ENTRY(cuMemPoolSetAttribute), ENTRY(cuMemPoolGetAttribute), ENTRY(cuMemPoolTrimTo),
    ENTRY(cuMemAllocFromPoolAsync), ENTRY(cuMemFreeAsync), ENTRY(cuStreamWaitEvent), ENTRY(cuModuleLoadData),
    ENTRY(cuMemcpyDtoDAsync), ENTRY(cuMemcpyDtoH), ENTRY(cuLaunchHostFunc),
    ENTRY(cuStreamBeginCapture), {"cuStreamBeginCapture_v2", (void*)cuStreamBeginCapture}, ENTRY(cuStreamEndCapture),
    ENTRY(cuStreamIsCapturing), ENTRY(cuGraphInstantiateWithFlags),
    {"cuGraphInstantiate", (void*)cuGraphInstantiateWithFlags}, ENTRY(cuGraphExecUpdate),
    {"cuGraphExecUpdate_v2", (void*)cuGraphExecUpdate}, ENTRY(cuGraphLaunch), ENTRY(cuGraphDestroy),
    ENTRY(cuGraphExecDestroy),
};

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status) {
  (void)version;
  (void)flags;
  for (size_t k = 0; k < sizeof(TABLE) / sizeof(TABLE[0]); k++) {
    if (strcmp(TABLE[k].name, symbol) == 0) {
      *pfn = TABLE[k].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

/* At process exit (after the interpreter has finalized and run its Py_AtExit functions), write
 * the allocations still live to the file FAKE_CUDA_EXIT_REPORT names, as compute-sanitizer's leak
 * check would list them: "host_allocs host_bytes device_allocs device_bytes". */
__attribute__((destructor)) static void fake_exit_report(void) {
  const char* path = getenv("FAKE_CUDA_EXIT_REPORT");
  if (!path || !*path) return;
  FILE* f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "%lld %lld %lld %lld\n", stats[S_HOST_ALLOCS], stats[S_HOST_BYTES], stats[S_DEVICE_ALLOCS],
          stats[S_DEVICE_BYTES]);
  fclose(f);
}
