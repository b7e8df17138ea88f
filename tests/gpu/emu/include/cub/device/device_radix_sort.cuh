/* cub/device/device_radix_sort.cuh (CPU emulation, tests/gpu/emu):
 * cub::DeviceRadixSort::SortPairs, as CUB documents it: the first call with
 * d_temp_storage == NULL only sets temp_storage_bytes; the second sorts
 * the keys, ascending over bits [begin_bit, end_bit) of their radix
 * representation (signed integers and floats ordered as numbers), STABLY
 * (equal keys keep their input order), the values moved with them. The
 * inputs are left as they are; the output ranges must not overlap the
 * inputs (a documented precondition: the emulator refuses it with
 * cudaErrorInvalidValue), and every range must be device memory (else a
 * sticky cudaErrorIllegalAddress, as a faulting kernel gives). The
 * temporary storage is used (as the sort's staging area), so a short one
 * shows under AddressSanitizer. */
#ifndef EMU_CUB_DEVICE_RADIX_SORT_CUH
#define EMU_CUB_DEVICE_RADIX_SORT_CUH

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */
#include <string.h> /* memcpy */

#include <algorithm>   /* std::stable_sort */
#include <type_traits> /* std::is_integral */
#include <vector>      /* std::vector */

#include "../../cuda_runtime.h"

namespace emu {
/* The sort's calls into the runtime (runtime.cpp, exec.cpp). */
cudaError_t cub_enter(cudaStream_t stream);
bool cub_device(const void *p, size_t bytes, const char *what);
bool cub_disjoint(const void *a, size_t an, const void *b, size_t bn, const char *what);

/* The unsigned radix image of a key: the numbers' order. */
template <class K> inline uint64_t radix_bits(K k)
{
    uint64_t u = 0;
    memcpy(&u, &k, sizeof k);
    const uint64_t top = (uint64_t)1 << (8 * sizeof(K) - 1);
    if (std::is_floating_point<K>::value)
        return (u & top) ? (~u & ((top << 1) - 1)) : (u | top);
    if (std::is_signed<K>::value)
        return u ^ top;
    return u;
}
} /* namespace emu */

namespace cub {

struct DeviceRadixSort {
    template <typename KeyT, typename ValueT, typename NumItemsT>
    static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes,
                                 const KeyT *d_keys_in, KeyT *d_keys_out,
                                 const ValueT *d_values_in, ValueT *d_values_out,
                                 NumItemsT num_items, int begin_bit = 0,
                                 int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0)
    {
        static_assert(std::is_arithmetic<KeyT>::value, "radix sort keys are numbers");
        const size_t n = num_items > 0 ? (size_t)num_items : 0;
        const size_t need = 512 + n * (sizeof(KeyT) + sizeof(ValueT));
        if (!d_temp_storage) {
            temp_storage_bytes = need;
            return cudaSuccess;
        }
        cudaError_t e = ::emu::cub_enter(stream);
        if (e != cudaSuccess)
            return e;
        if (num_items < 0 || begin_bit < 0 || end_bit > (int)(8 * sizeof(KeyT)) ||
            begin_bit > end_bit || temp_storage_bytes < need)
            return cudaErrorInvalidValue;
        if (n == 0)
            return cudaSuccess;
        const size_t kb = n * sizeof(KeyT), vb = n * sizeof(ValueT);
        if (!::emu::cub_disjoint(d_keys_in, kb, d_keys_out, kb, "keys in and out") ||
            !::emu::cub_disjoint(d_values_in, vb, d_values_out, vb, "values in and out") ||
            !::emu::cub_disjoint(d_keys_out, kb, d_values_out, vb, "keys and values out") ||
            !::emu::cub_disjoint(d_temp_storage, need, d_keys_out, kb, "temp and keys out") ||
            !::emu::cub_disjoint(d_temp_storage, need, d_values_out, vb, "temp and values out"))
            return cudaErrorInvalidValue;
        if (!::emu::cub_device(d_keys_in, kb, "d_keys_in") ||
            !::emu::cub_device(d_keys_out, kb, "d_keys_out") ||
            !::emu::cub_device(d_values_in, vb, "d_values_in") ||
            !::emu::cub_device(d_values_out, vb, "d_values_out") ||
            !::emu::cub_device(d_temp_storage, need, "d_temp_storage"))
            return cudaSuccess; /* the fault shows at the next call */
        /* in the stream's order: stage the inputs in the temporary storage, then sort */
        ::emu::stream_run(stream, [=] { sort(d_temp_storage, d_keys_in, d_keys_out, d_values_in,
                                             d_values_out, n, begin_bit, end_bit); });
        return cudaSuccess;
    }

  private:
    template <typename KeyT, typename ValueT>
    static void sort(void *d_temp_storage, const KeyT *d_keys_in, KeyT *d_keys_out,
                     const ValueT *d_values_in, ValueT *d_values_out, size_t n, int begin_bit,
                     int end_bit)
    {
        const size_t kb = n * sizeof(KeyT), vb = n * sizeof(ValueT);
        char *t = static_cast<char *>(d_temp_storage);
        t += (256 - (uintptr_t)t % 256) % 256;
        KeyT *keys = reinterpret_cast<KeyT *>(t);
        ValueT *vals = reinterpret_cast<ValueT *>(t + (kb + 255) / 256 * 256);
        memcpy(keys, d_keys_in, kb);
        memcpy(vals, d_values_in, vb);
        const uint64_t digits = end_bit - begin_bit >= 64
                                    ? ~(uint64_t)0
                                    : (((uint64_t)1 << (end_bit - begin_bit)) - 1);
        std::vector<uint64_t> digit(n);
        std::vector<size_t> order(n);
        for (size_t i = 0; i < n; i++) {
            digit[i] = (::emu::radix_bits(keys[i]) >> begin_bit) & digits;
            order[i] = i;
        }
        std::stable_sort(order.begin(), order.end(),
                         [&digit](size_t a, size_t b) { return digit[a] < digit[b]; });
        for (size_t i = 0; i < n; i++) {
            memcpy(d_keys_out + i, keys + order[i], sizeof(KeyT));
            memcpy(d_values_out + i, vals + order[i], sizeof(ValueT));
        }
    }
};

} /* namespace cub */

#endif
