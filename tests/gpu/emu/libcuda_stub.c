/* libcuda_stub.c (CPU emulation, tests/gpu/emu): built as libcuda.so.1
 * beside the emulated gpu_tests (and found through its RUNPATH), so that
 * kcuda_available()'s dlopen("libcuda.so.1") finds "a driver" and goes on
 * to ask the (emulated) runtime for devices. It holds nothing else: the
 * emulation never calls the driver API. */
int emu_libcuda_stub = 1;
