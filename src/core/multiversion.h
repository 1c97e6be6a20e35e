// Function multiversioning for the library's vectorisable loops, in the core so that the
// core's own passes over every gradient (the norm and its clipping) can use it as the
// kernels and ops do.
//
// AGI_HOT compiles a loop for AVX-512, for AVX2 and for the baseline, and the loader
// picks one at startup (function multiversioning); what such a loop calls must be
// inlined into each version (AGI_INLINE). Element by element the versions do the same
// IEEE operations in the same order (files using them are compiled without FMA
// contraction), so a result does not depend on the CPU. Not under ThreadSanitizer: the
// loader runs the clones' resolver before the sanitizer's runtime is up, and the
// instrumented resolver crashes. clang 14 gives a multiversioned function external
// linkage even when it is static, and names its entry `<name>.ifunc`, which a caller in
// another file cannot link to: such functions carry R() names and are called from a plain
// function in their own file.
#ifndef ATTOGRAD_MULTIVERSION_H
#define ATTOGRAD_MULTIVERSION_H

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AGI_NO_CLONES
#endif
#endif
#ifdef __SANITIZE_THREAD__
#define AGI_NO_CLONES
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && !defined(AGI_NO_CLONES)
#if __has_attribute(target_clones) && __has_attribute(always_inline)
#define AGI_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#define AGI_INLINE static inline __attribute__((always_inline))
#endif
#endif
#ifndef AGI_HOT
#define AGI_HOT
#define AGI_INLINE static inline
#endif

#endif
