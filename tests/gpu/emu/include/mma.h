/* mma.h (CPU emulation, tests/gpu/emu): nvcuda::wmma for the 16x16x16
 * shape with __nv_bfloat16 or __half inputs and float accumulators.
 *
 * As on the GPU, a fragment belongs to one thread and holds part of the
 * tile: here element (r, c) (row-major index e = 16 r + c) is held by lane
 * e % 32 at x[e / 32]; CUDA leaves the layout unspecified, so code that
 * relies on one is wrong on both. load_matrix_sync, store_matrix_sync and
 * mma_sync are warp-synchronous: all 32 threads of the warp must call them
 * with the same pointer, leading dimension and layout; the pointer must be
 * 256-bit (32-byte) aligned and the leading dimension a multiple of 16
 * bytes (8 elements of 2 bytes, 4 floats), else the kernel stops with
 * cudaErrorMisalignedAddress. Each thread then loads or stores its own
 * elements, so ThreadSanitizer checks that the kernel ordered them with
 * __syncwarp (the WMMA calls themselves order no memory). mma_sync
 * computes d = a b + c in fp32, the products exact, summed in k order
 * (the tensor cores' internal order and rounding are not emulated).
 */
#ifndef EMU_MMA_H
#define EMU_MMA_H

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};

enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class T> struct elem;
template <> struct elem<float> {
    static constexpr int id = ::emu::ELEM_F32;
};
template <> struct elem<__nv_bfloat16> {
    static constexpr int id = ::emu::ELEM_BF16;
};
template <> struct elem<__half> {
    static constexpr int id = ::emu::ELEM_F16;
};
template <class Use> struct use;
template <> struct use<matrix_a> {
    static constexpr int id = 0;
};
template <> struct use<matrix_b> {
    static constexpr int id = 1;
};
template <> struct use<accumulator> {
    static constexpr int id = 2;
};
} /* namespace detail */

template <class Use, int m, int n, int k, class T, class Layout = void>
class fragment {
    static_assert(m == 16 && n == 16 && k == 16,
                  "emu: only the 16x16x16 WMMA shape is emulated");
    static_assert(std::is_same<Use, accumulator>::value
                      ? std::is_same<T, float>::value &&
                            std::is_same<Layout, void>::value
                      : (std::is_same<T, __nv_bfloat16>::value ||
                         std::is_same<T, __half>::value) &&
                            (std::is_same<Layout, row_major>::value ||
                             std::is_same<Layout, col_major>::value),
                  "emu: a matrix_a/matrix_b fragment of __nv_bfloat16 or "
                  "__half with a row_major/col_major layout, or a float "
                  "accumulator");

  public:
    static constexpr int num_elements = 8;
    T x[num_elements];
};

namespace detail {
/* Checks (all lanes alike, alignment) in the emulator, then the lane's
 * own elements: logical (r, c) of the 16 x 16 tile at p[r ldm + c]
 * (row-major) or p[c ldm + r] (column-major). */
template <class T>
inline void load(T *x, const T *p, unsigned ldm, int col, int use)
{
    ::emu::WarpOp op = {};
    op.kind = ::emu::OP_WMMA_LOAD;
    op.mask = 0xffffffffu;
    op.ptr = p;
    op.ldm = ldm;
    op.layout = col;
    op.elem = elem<T>::id;
    op.use = use;
    ::emu::warp_op(&op);
    unsigned lane = ::emu::self().lane;
    for (int i = 0; i < 8; i++) {
        unsigned e = lane + 32u * (unsigned)i, r = e / 16, c = e % 16;
        x[i] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}

template <class T>
inline void store(T *p, const T *x, unsigned ldm, int col)
{
    ::emu::WarpOp op = {};
    op.kind = ::emu::OP_WMMA_STORE;
    op.mask = 0xffffffffu;
    op.ptr = p;
    op.ldm = ldm;
    op.layout = col;
    op.elem = elem<T>::id;
    op.use = 2;
    ::emu::warp_op(&op);
    unsigned lane = ::emu::self().lane;
    for (int i = 0; i < 8; i++) {
        unsigned e = lane + 32u * (unsigned)i, r = e / 16, c = e % 16;
        if (col)
            p[(size_t)c * ldm + r] = x[i];
        else
            p[(size_t)r * ldm + c] = x[i];
    }
}
} /* namespace detail */

template <class Use, class T, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &a,
                             const T *mptr, unsigned ldm)
{
    static_assert(!std::is_same<Use, accumulator>::value,
                  "an accumulator load takes a layout_t");
    detail::load<T>(a.x, mptr, ldm, std::is_same<Layout, col_major>::value,
                    detail::use<Use>::id);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &a,
                             const float *mptr, unsigned ldm, layout_t layout)
{
    detail::load<float>(a.x, mptr, ldm, layout == mem_col_major, 2);
}

inline void store_matrix_sync(float *mptr,
                              const fragment<accumulator, 16, 16, 16, float> &a,
                              unsigned ldm, layout_t layout)
{
    detail::store<float>(mptr, a.x, ldm, layout == mem_col_major);
}

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &a,
                          const T &v)
{
    for (int i = 0; i < 8; i++)
        a.x[i] = v;
}

template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    ::emu::WarpOp op = {};
    op.kind = ::emu::OP_WMMA_MMA;
    op.mask = 0xffffffffu;
    op.elem = detail::elem<T>::id;
    op.d = d.x;
    op.a = a.x;
    op.b = b.x;
    op.c = c.x;
    ::emu::warp_op(&op);
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif
