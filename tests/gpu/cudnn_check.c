/* cudnn_check.c — whether cuDNN has engines for the attention's graphs
 * (kernels/cuda/attention_cudnn.cu), asked without a GPU: cuDNN builds
 * its plans for a described device (kcuda_attention_cudnn_check), here an
 * H200's (sm_90, 132 SMs, as CUDA reports one), for GPT-2 124M's shapes
 * (bf16, B=16, T=1024, 12 heads of 64; the backward deterministic and
 * not), fp16, a Llama's grouped-query heads of 128, and a short T.
 * Built by make CUDA=1 where the toolkit has cuDNN's headers (as
 * cudnn_values), run by tests/run.sh's gpu section and by
 * tests/gpu/run.sh on the GPU machine's cuDNN. Prints `ok N - shape` per
 * shape and `# N passed, N failed`; exits 0 when every one built, and
 * with one line `SKIP cudnn: ...` where no cuDNN loads.
 *   build/cudnn_check [DEVICE_JSON_FILE]
 */
#include <stdio.h>
#include <stdlib.h>

#include "kcuda.h"

/* An H200 SXM's properties, in cuDNN's device-properties JSON (the keys
 * its from_json reads; the values cudaGetDeviceProperties gives). */
static const char h200[] =
    "{\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],\"regsPerBlock\":65536,"
    "\"multiProcessorCount\":132,\"warpSize\":32,\"maxSharedMemoryPerBlock\":49152,"
    "\"maxSharedMemoryPerBlockOptin\":232448,\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,"
    "\"maxCtasPerSM\":32,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":9013,"
    "\"isTccDriver\":0,\"supportCoopLaunch\":1,\"totalGlobalMem\":150754820096,\"smClockRateKHz\":1980000,"
    "\"memClockRateKHz\":3201000,\"l2CacheSize\":62914560,\"cudaDeviceId\":0,\"deviceVer\":900,"
    "\"driverVer\":13000,\"deviceName\":\"NVIDIA H200\"}";

int main(int argc, char **argv)
{
    const char *dev = h200;
    static char buf[1 << 14];
    if (argc > 1) {
        FILE *f = fopen(argv[1], "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (!f || n == 0) {
            fprintf(stderr, "cudnn_check: cannot read %s\n", argv[1]);
            return 2;
        }
        fclose(f);
        buf[n] = '\0';
        dev = buf;
    }
    static const struct {
        kcuda_dtype dt;
        int B, T, H, KV, d, det;
        const char *name;
    } shapes[] = {
        {KCUDA_BF16, 16, 1024, 12, 12, 64, 1, "GPT-2 124M, bf16, B=16 T=1024 H=12 d=64, deterministic"},
        {KCUDA_BF16, 16, 1024, 12, 12, 64, 0, "GPT-2 124M, bf16, dq's sums in any order"},
        {KCUDA_F16, 16, 1024, 12, 12, 64, 1, "GPT-2 124M, fp16"},
        {KCUDA_BF16, 4, 2048, 32, 8, 128, 1, "Llama, bf16, B=4 T=2048 H=32 KV=8 d=128"},
        {KCUDA_BF16, 2, 64, 4, 4, 32, 1, "gpt-tiny-like, bf16, B=2 T=64 H=4 d=32"},
    };
    int passed = 0, failed = 0, n = (int)(sizeof shapes / sizeof shapes[0]);
    for (int i = 0; i < n; i++) {
        char why[512];
        long long ws[2];
        int r = kcuda_attention_cudnn_check(dev, shapes[i].dt, shapes[i].B, shapes[i].T, shapes[i].H, shapes[i].KV,
                                            shapes[i].d, shapes[i].det, ws, why, sizeof why);
        if (r < 0) {
            printf("SKIP cudnn: %s\n", why);
            return 0;
        }
        if (r)
            printf("ok %d - %s (workspace: forward %lld bytes, backward %lld)\n", i + 1, shapes[i].name, ws[0], ws[1]);
        else
            printf("not ok %d - %s: %s\n", i + 1, shapes[i].name, why);
        if (r)
            passed++;
        else
            failed++;
    }
    printf("# %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
