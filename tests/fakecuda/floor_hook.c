/* The floor's vecadd for the fake CUDA driver in a process without Python (the standalone floor of
 * vyre_cuda/profile/standalone_floor.c): preloaded (LD_PRELOAD), it loads the fake libcuda.so.1 the
 * process will load too and sets its launch hook, which computes out = a + b from the floor's
 * arguments (three device pointers, then the element count), or a - b when FLOOR_HOOK_WRONG is set,
 * so that a test sees the process check its output. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

typedef int (*hook_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void**, int);
static int wrong;

static int vecadd(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shared, void** params, int cooperative) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)cooperative;
  const float* a = (const float*)(uintptr_t)*(const unsigned long long*)params[0];
  const float* b = (const float*)(uintptr_t)*(const unsigned long long*)params[1];
  float* out = (float*)(uintptr_t)*(const unsigned long long*)params[2];
  unsigned n = *(const unsigned*)params[3];
  for (unsigned i = 0; i < n; i++) out[i] = wrong ? a[i] - b[i] : a[i] + b[i];
  return 0;
}

__attribute__((constructor)) static void install(void) {
  wrong = getenv("FLOOR_HOOK_WRONG") != NULL;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) return;
  void (*set)(hook_t) = (void (*)(hook_t))dlsym(lib, "fake_cuda_set_launch_hook");
  if (set != NULL) set(vecadd);
}
