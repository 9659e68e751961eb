// Host stand-in for cuda_fp16.h (tests/cuda_host: CUDA kernels run on the CPU).  Only what the
// kernels under test use: the type (its 16 bits) and the round-to-nearest conversions, through
// GCC's _Float16 (IEEE binary16, round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>

struct __half {
  uint16_t bits;
};

inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, 2);
  return (float)f;
}

inline __half __ushort_as_half(unsigned short b) { return __half{b}; }

inline __half __float2half_rn(float x) {
  const _Float16 f = (_Float16)x;
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}
