// Host stand-in for cuda_fp16.h (tests only): __half as its bits, conversions through the
// compiler's IEEE binary16 type (_Float16: round to nearest even, like __float2half_rn).
#pragma once
#include <cstring>

struct __half {
  unsigned short bits;
};
inline __half __ushort_as_half(unsigned short u) { __half h; h.bits = u; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
inline __half __float2half_rn(float f) { _Float16 g = (_Float16)f; __half h; std::memcpy(&h.bits, &g, 2); return h; }
