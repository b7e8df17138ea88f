/* library_types.h (CPU emulation, tests/gpu/emu): the data types the CUDA
 * libraries name (cudaDataType_t), with CUDA's values. */
#ifndef EMU_LIBRARY_TYPES_H
#define EMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

#endif
