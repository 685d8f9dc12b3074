/* A preload for test children that may crash (LD_PRELOAD): on a fatal signal it prints the C stack
 * of the faulting thread to stderr, then lets the signal end the process as before.
 *
 * Python's faulthandler (-X faulthandler), installed after this library's constructor, runs first:
 * it prints every thread's Python stack, then restores this handler and raises the signal again.
 * The frames print as `module(+offset)` (or `module(symbol+offset)`); scripts/gpu-check turns the
 * offsets into function names with addr2line while the build they came from is still there.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static const int FATAL[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static void on_fatal(int sig) {
  static const char head[] = "\nC stack of the faulting thread (segv_trace):\n";
  void* frames[64];
  int n = backtrace(frames, 64);
  ssize_t ignored = write(2, head, sizeof head - 1);
  (void)ignored;
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  /* backtrace() loads the unwinder on its first call, which is not safe in a signal handler */
  void* warm[1];
  backtrace(warm, 1);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  sa.sa_flags = SA_NODEFER;
  for (size_t i = 0; i < sizeof FATAL / sizeof FATAL[0]; i++) sigaction(FATAL[i], &sa, NULL);
}
