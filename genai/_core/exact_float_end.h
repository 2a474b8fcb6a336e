/* The end of a kernel header's exact_float_begin.h section. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
