// The real type of the typed sources.
//
// attograd computes in float32 (training) and float64 (gradient checks) with
// the same code. Rather than writing every kernel twice, the typed sources
// (listed by name in CMakeLists.txt, AG_TYPED_SOURCES) are compiled twice:
// once as-is (real = float) and once with AG_REAL_F64 defined (real = double).
// Names that must differ between the two builds go through R():  R(agi_gemm) is agi_gemm_f32 in one
// build and agi_gemm_f64 in the other.
//
// Code that does not depend on the real type (an op's public constructor:
// shape checks and choosing the f32 or f64 op) must exist once; it sits
// between `#if AG_ONCE` and `#endif`, which the float build compiles and the
// double build skips.
#ifndef ATTOGRAD_REAL_H
#define ATTOGRAD_REAL_H

#include <math.h>

#ifdef AG_REAL_F64
typedef double real;
#define R(name) name##_f64
#define AG_ONCE 0
#define AG_REAL_DTYPE AG_F64
#else
typedef float real;
#define R(name) name##_f32
#define AG_ONCE 1
#define AG_REAL_DTYPE AG_F32
#endif

// The libm function of the matching precision (expf for float, exp for double).
static inline real r_exp(real x) { return _Generic(x, float: expf, default: exp)(x); }
static inline real r_log(real x) { return _Generic(x, float: logf, default: log)(x); }
static inline real r_sqrt(real x) { return _Generic(x, float: sqrtf, default: sqrt)(x); }
static inline real r_tanh(real x) { return _Generic(x, float: tanhf, default: tanh)(x); }
static inline real r_erf(real x) { return _Generic(x, float: erff, default: erf)(x); }
static inline real r_fabs(real x) { return _Generic(x, float: fabsf, default: fabs)(x); }

#endif
