/* The tight floor of vyre_cuda.profile in a process of its own: the same driver calls as
 * Floor.tight (vyre_cuda/profile/_floor.pyx), with no Python in the process, so that the profile can
 * check that its in-process floor is not slowed by the interpreter around it.
 *
 * Usage: standalone_floor LIBCUDA IMAGE NBYTES DEVICE
 *   LIBCUDA  the driver library to load (the one the profile's process loaded)
 *   IMAGE    a file holding the compiled vecadd (cubin, fatbin or PTX) of the profile's floor
 *   NBYTES   bytes per buffer (a multiple of 4)
 *   DEVICE   the CUDA device ordinal
 *
 * It sets up once (the primary context, the module, a non-blocking stream, an event without timing,
 * the two inputs next to each other in one page-locked allocation and one device allocation, the
 * output), prints "ready", then answers commands on stdin, one a line:
 *   run COUNT WARMUP  for each wait (spin: cuEventRecord + a cuEventQuery loop; event: cuEventRecord
 *                     + cuEventSynchronize; stream: cuStreamSynchronize), WARMUP untimed then COUNT
 *                     timed round trips of one cuMemcpyHtoDAsync of both inputs, cuLaunchKernel and
 *                     one cuMemcpyDtoHAsync, then the same three calls captured once as a graph and
 *                     replayed with cuGraphLaunch; each output is checked against a + b. It prints a
 *                     line "SERIES ns ns ..." per series (spin, event, stream, graph.spin, graph.event,
 *                     graph.stream), "skip graph REASON" instead of the graph lines when the capture
 *                     fails, then "done".
 *   quit              (or end of input) frees everything and exits 0.
 * Any failure prints "error REASON" and exits 1.
 *
 * The driver is loaded with dlopen and every entry point resolved through cuGetProcAddress_v2 (as
 * cuda-bindings does), so building needs only a C compiler: no CUDA headers, no libcuda.so link.
 * The clock is clock_gettime(CLOCK_MONOTONIC), the in-process floor's.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The driver types and constants used here, as cuda.h defines them (a stable ABI). */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUgraph;
typedef void* CUgraphExec;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_READY = 600 };
enum { CU_STREAM_NON_BLOCKING = 1, CU_EVENT_DISABLE_TIMING = 2, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };
#define BLOCK 256       /* threads per block: the floor's */
#define ALIGN 256       /* the inputs' stride rounds up to this, as the floor's staging does */
#define API_VERSION 12000 /* the entry points' signatures as of CUDA 12.0 */

static struct {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned int);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  /* resolved by its 11.4+ name: "cuGraphInstantiate" may resolve to the 5-argument form */
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
} cu;

/* the names, in the order of the struct's members */
static const char* const NAMES[] = {
    "cuInit", "cuGetErrorName", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
    "cuCtxSetCurrent", "cuModuleLoadData", "cuModuleGetFunction", "cuModuleUnload", "cuMemAlloc", "cuMemFree",
    "cuMemHostAlloc", "cuMemFreeHost", "cuStreamCreate", "cuStreamDestroy", "cuStreamSynchronize", "cuEventCreate",
    "cuEventDestroy", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync", "cuLaunchKernel", "cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
    "cuGraphLaunch", "cuGraphDestroy", "cuGraphExecDestroy",
};

/* load_driver fills the struct as an array of pointers */
_Static_assert(sizeof(cu) == sizeof(NAMES) / sizeof(NAMES[0]) * sizeof(void*), "one name per entry point");

static void fail(const char* what, const char* detail) {
  printf("error %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  fflush(stdout);
  exit(1);
}

static const char* status_name(CUresult st, char* buf, size_t len) {
  const char* name = NULL;
  if (cu.cuGetErrorName == NULL || cu.cuGetErrorName(st, &name) != CUDA_SUCCESS || name == NULL) {
    snprintf(buf, len, "CUresult %d", st);
    return buf;
  }
  snprintf(buf, len, "%s", name);
  return buf;
}

static void check(CUresult st, const char* call) {
  if (st != CUDA_SUCCESS) {
    char buf[96];
    char text[192];
    snprintf(text, sizeof(text), "%s returned %s", call, status_name(st, buf, sizeof(buf)));
    fail("driver call failed", text);
  }
}
#define CHECK(call, args) check(cu.call args, #call)

static unsigned long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void load_driver(const char* path) {
  typedef CUresult (*proc_t)(const char*, void**, int, cuuint64_t, int*);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) fail("cannot load the CUDA driver", dlerror());
  proc_t get = (proc_t)dlsym(lib, "cuGetProcAddress_v2");
  if (get == NULL) fail("the CUDA driver has no cuGetProcAddress_v2 (older than CUDA 12.0)", path);
  void** slots = (void**)&cu;
  for (size_t k = 0; k < sizeof(NAMES) / sizeof(NAMES[0]); k++) {
    int found = 0;
    if (get(NAMES[k], &slots[k], API_VERSION, 0, &found) != CUDA_SUCCESS || slots[k] == NULL)
      fail("the CUDA driver lacks an entry point", NAMES[k]);
  }
}

static char* read_image(const char* path) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) fail("cannot open the kernel image", path);
  if (fseek(f, 0, SEEK_END) != 0) fail("cannot read the kernel image", path);
  long size = ftell(f);
  rewind(f);
  if (size <= 0) fail("the kernel image is empty", path);
  char* data = (char*)calloc((size_t)size + 1, 1); /* NUL-terminated: PTX needs it */
  if (data == NULL || fread(data, 1, (size_t)size, f) != (size_t)size) fail("cannot read the kernel image", path);
  fclose(f);
  return data;
}

enum { WAIT_SPIN, WAIT_EVENT, WAIT_STREAM, N_WAITS };
static const char* const WAIT_NAMES[N_WAITS] = {"spin", "event", "stream"};

static struct {
  CUfunction func;
  CUstream stream;
  CUevent event;
  CUgraphExec exec;
  CUdeviceptr d_in, d_b, d_out;
  char *pinned, *h_in, *h_b, *h_out;
  size_t nbytes, in_span;
  unsigned n, grid;
  void* args[4];
} F;

static void issue(void) {
  CHECK(cuMemcpyHtoDAsync, (F.d_in, F.h_in, F.in_span, F.stream));
  CHECK(cuLaunchKernel, (F.func, F.grid, 1, 1, BLOCK, 1, 1, 0, F.stream, F.args, NULL));
  CHECK(cuMemcpyDtoHAsync, (F.h_out, F.d_out, F.nbytes, F.stream));
}

static void wait_for(int wait) {
  if (wait == WAIT_STREAM) {
    CHECK(cuStreamSynchronize, (F.stream));
    return;
  }
  CHECK(cuEventRecord, (F.event, F.stream));
  if (wait == WAIT_EVENT) {
    CHECK(cuEventSynchronize, (F.event));
    return;
  }
  CUresult st = cu.cuEventQuery(F.event);
  while (st == CUDA_ERROR_NOT_READY) st = cu.cuEventQuery(F.event);
  check(st, "cuEventQuery");
}

/* the round trip as a graph, captured once; 0 on success, else the reason in why */
static int capture(char* why, size_t len) {
  if (F.exec != NULL) return 0;
  const char* call = "cuStreamBeginCapture";
  CUgraph graph = NULL;
  CUresult st = cu.cuStreamBeginCapture(F.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (st == CUDA_SUCCESS) {
    call = "cuMemcpyHtoDAsync";
    st = cu.cuMemcpyHtoDAsync(F.d_in, F.h_in, F.in_span, F.stream);
    if (st == CUDA_SUCCESS) {
      call = "cuLaunchKernel";
      st = cu.cuLaunchKernel(F.func, F.grid, 1, 1, BLOCK, 1, 1, 0, F.stream, F.args, NULL);
    }
    if (st == CUDA_SUCCESS) {
      call = "cuMemcpyDtoHAsync";
      st = cu.cuMemcpyDtoHAsync(F.h_out, F.d_out, F.nbytes, F.stream);
    }
    CUresult ended = cu.cuStreamEndCapture(F.stream, &graph); /* always: the stream leaves capture mode */
    if (st == CUDA_SUCCESS && ended != CUDA_SUCCESS) {
      st = ended;
      call = "cuStreamEndCapture";
    }
    if (st == CUDA_SUCCESS) {
      call = "cuGraphInstantiate";
      st = cu.cuGraphInstantiate(&F.exec, graph, 0);
    }
    if (graph != NULL) cu.cuGraphDestroy(graph);
  }
  if (st != CUDA_SUCCESS) {
    char buf[96];
    F.exec = NULL;
    snprintf(why, len, "%s returned %s", call, status_name(st, buf, sizeof(buf)));
    return 1;
  }
  return 0;
}

/* warmup + count round trips; prints the timed ones; checks the output against a + b */
static void series(const char* name, int wait, int graph, long count, long warmup, unsigned long long* ns) {
  memset(F.h_out, 0, F.nbytes);
  for (long i = 0; i < warmup + count; i++) {
    unsigned long long t0 = now_ns();
    if (graph) CHECK(cuGraphLaunch, (F.exec, F.stream));
    else issue();
    wait_for(wait);
    if (i >= warmup) ns[i - warmup] = now_ns() - t0;
  }
  const float* a = (const float*)F.h_in;
  const float* b = (const float*)F.h_b;
  const float* out = (const float*)F.h_out;
  for (unsigned i = 0; i < F.n; i++) {
    float want = a[i] + b[i];
    if (out[i] != want) {
      char text[160];
      snprintf(text, sizeof(text), "series %s: out[%u] = %g, a + b = %g", name, i, (double)out[i], (double)want);
      fail("wrong result", text);
    }
  }
  printf("%s", name);
  for (long i = 0; i < count; i++) printf(" %llu", ns[i]);
  printf("\n");
}

static void run(long count, long warmup) {
  unsigned long long* ns = (unsigned long long*)malloc((size_t)(count > 0 ? count : 1) * sizeof(*ns));
  if (ns == NULL) fail("out of host memory", NULL);
  char name[32];
  for (int w = 0; w < N_WAITS; w++) series(WAIT_NAMES[w], w, 0, count, warmup, ns);
  char why[256];
  if (capture(why, sizeof(why)) != 0) {
    printf("skip graph %s\n", why);
  } else {
    for (int w = 0; w < N_WAITS; w++) {
      snprintf(name, sizeof(name), "graph.%s", WAIT_NAMES[w]);
      series(name, w, 1, count, warmup, ns);
    }
  }
  printf("done\n");
  fflush(stdout);
  free(ns);
}

int main(int argc, char** argv) {
  if (argc != 5) fail("usage: standalone_floor LIBCUDA IMAGE NBYTES DEVICE", NULL);
  long long nbytes = atoll(argv[3]);
  int ordinal = atoi(argv[4]);
  if (nbytes <= 0 || nbytes % 4 != 0 || nbytes / 4 > 0x7FFFFFFFll) fail("NBYTES must be a positive multiple of 4", argv[3]);
  load_driver(argv[1]);
  char* image = read_image(argv[2]);

  CUdevice dev;
  CUcontext ctx;
  CUmodule module;
  CHECK(cuInit, (0));
  CHECK(cuDeviceGet, (&dev, ordinal));
  CHECK(cuDevicePrimaryCtxRetain, (&ctx, dev));
  CHECK(cuCtxSetCurrent, (ctx));
  CHECK(cuModuleLoadData, (&module, image));
  CHECK(cuModuleGetFunction, (&F.func, module, "vecadd"));
  free(image);

  F.nbytes = (size_t)nbytes;
  F.n = (unsigned)(nbytes / 4);
  F.grid = (F.n + BLOCK - 1) / BLOCK;
  size_t stride = (F.nbytes + ALIGN - 1) / ALIGN * ALIGN;
  F.in_span = stride + F.nbytes;
  CHECK(cuMemAlloc, (&F.d_in, 2 * stride));
  F.d_b = F.d_in + stride;
  CHECK(cuMemAlloc, (&F.d_out, F.nbytes));
  CHECK(cuMemHostAlloc, ((void**)&F.pinned, 3 * stride, 0));
  F.h_in = F.pinned;
  F.h_b = F.pinned + stride;
  F.h_out = F.pinned + 2 * stride;
  CHECK(cuStreamCreate, (&F.stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate, (&F.event, CU_EVENT_DISABLE_TIMING));
  F.args[0] = &F.d_in;
  F.args[1] = &F.d_b;
  F.args[2] = &F.d_out;
  F.args[3] = &F.n;
  unsigned long long state = 0x9E3779B97F4A7C15ull; /* inputs in [0, 1), as the profile draws them */
  for (unsigned i = 0; i < F.n; i++) {
    for (int k = 0; k < 2; k++) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      ((float*)(k ? F.h_b : F.h_in))[i] = (float)(state >> 40) / (float)(1 << 24);
    }
  }
  printf("ready\n");
  fflush(stdout);

  char line[256];
  while (fgets(line, sizeof(line), stdin) != NULL) {
    long count = 0, warmup = 0;
    if (strncmp(line, "quit", 4) == 0) break;
    if (sscanf(line, "run %ld %ld", &count, &warmup) != 2 || count < 0 || warmup < 0) fail("unknown command", line);
    run(count, warmup);
  }
  CHECK(cuStreamSynchronize, (F.stream));
  if (F.exec != NULL) CHECK(cuGraphExecDestroy, (F.exec));
  CHECK(cuEventDestroy, (F.event));
  CHECK(cuStreamDestroy, (F.stream));
  CHECK(cuMemFreeHost, (F.pinned));
  CHECK(cuMemFree, (F.d_out));
  CHECK(cuMemFree, (F.d_in));
  CHECK(cuModuleUnload, (module));
  CHECK(cuDevicePrimaryCtxRelease, (dev));
  return 0;
}
