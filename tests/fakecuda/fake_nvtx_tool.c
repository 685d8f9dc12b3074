/* A minimal NVTX tool, loaded the way Nsight Systems loads its own: the NVTX header of the traced
 * library dlopens $NVTX_INJECTION64_PATH and calls InitializeInjectionNvtx2, which installs our
 * callbacks for the domain range calls. Each call is appended to $VYRE_FAKE_NVTX_LOG as one line
 * ("domain NAME", "push NAME", "pop", "start ID NAME", "end ID"), so a CPU test sees exactly the
 * ranges a profiler would. */
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static FILE* out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long next_id;
static int depth;

static const char* message(const nvtxEventAttributes_t* a) {
  return a && a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii ? a->message.ascii : "?";
}

static void line(const char* kind, unsigned long long id, const char* text) {
  pthread_mutex_lock(&lock);
  if (out) {
    if (id)
      fprintf(out, "%s %llu %s\n", kind, id, text ? text : "");
    else
      fprintf(out, "%s %s\n", kind, text ? text : "");
    fflush(out);
  }
  pthread_mutex_unlock(&lock);
}

static nvtxDomainHandle_t domain_create(const char* name) {
  line("domain", 0, name);
  return (nvtxDomainHandle_t)(void*)&out;
}

static int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  (void)d;
  line("push", 0, message(a));
  return depth++;
}

static int pop(nvtxDomainHandle_t d) {
  (void)d;
  line("pop", 0, "");
  return --depth;
}

static nvtxRangeId_t start(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  (void)d;
  unsigned long long id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
  line("start", id, message(a));
  return id;
}

static void end(nvtxDomainHandle_t d, nvtxRangeId_t id) {
  (void)d;
  line("end", id, "");
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const NvtxExportTableCallbacks* callbacks = (const NvtxExportTableCallbacks*)get_table(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = 0;
  unsigned int size = 0;
  const char* path = getenv("VYRE_FAKE_NVTX_LOG");
  if (!callbacks || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) return 0;
  if (size < NVTX_CBID_CORE2_DomainCreateA) return 0;
  out = path ? fopen(path, "a") : NULL;
  *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
  *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
  *table[NVTX_CBID_CORE2_DomainRangeStartEx] = (NvtxFunctionPointer)start;
  *table[NVTX_CBID_CORE2_DomainRangeEnd] = (NvtxFunctionPointer)end;
  return 1;
}
