// The one pause between two polls of a spin, for every spinning loop of the core (the copy
// threads, the await notifier's spin, the waits): the CPU's spin hint, which lets a sibling
// hyperthread run and saves power, else a yield to the scheduler.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
static inline void vyre_cpu_relax(void) { __builtin_ia32_pause(); }
#elif defined(__aarch64__)
static inline void vyre_cpu_relax(void) { __asm__ __volatile__("yield"); }
#else
#include <sched.h>
static inline void vyre_cpu_relax(void) { sched_yield(); }
#endif
