/* Included (no guard: once per kernel header, each with exact_float_end.h after its code) by
   the kernel headers whose float arithmetic must round as written: GCC and clang may not fuse a
   multiply and an add into an FMA the source does not spell out (onnxruntime's kernels, whose
   bits these reproduce, round each step on its own). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
