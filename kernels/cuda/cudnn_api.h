/* cudnn_api.h — internal to kernels/cuda: the part of cuDNN 9's backend
 * ("graph") API that attention_cudnn.cu calls, declared here rather than
 * taken from cudnn_graph.h, so that libmesh builds where the toolkit has
 * no cuDNN headers and does not link cuDNN: attention_cudnn.cu loads the
 * library at its first use (dlopen) and takes these entry points from it.
 * The values are cuDNN 9's (cudnn_graph_v9.h, stable across 9.x: the
 * backend API's enums only grow); tests/gpu/cudnn_values.c checks each one
 * against the real header wherever the toolkit has it (make CUDA=1 test).
 * The CPU emulation's cuDNN (tests/gpu/emu/cudnn.cpp) implements them.
 */
#ifndef MESH_CUDNN_API_H
#define MESH_CUDNN_API_H

#include <stddef.h> /* defines: size_t */
#include <stdint.h> /* defines: int64_t */

/* cudnnStatus_t, cudnnHandle_t, cudnnBackendDescriptor_t */
typedef int kcdnn_status;
typedef void *kcdnn_handle;
typedef void *kcdnn_desc;

enum {
    KCDNN_STATUS_SUCCESS = 0,
    KCDNN_STATUS_NOT_SUPPORTED = 3000,
    KCDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER = 5001
};

/* cudnnBackendDescriptorType_t */
enum {
    KCDNN_POINTWISE_DESCRIPTOR = 0,
    KCDNN_ENGINECFG_DESCRIPTOR = 3,
    KCDNN_ENGINEHEUR_DESCRIPTOR = 4,
    KCDNN_EXECUTION_PLAN_DESCRIPTOR = 5,
    KCDNN_OPERATION_POINTWISE_DESCRIPTOR = 13,
    KCDNN_OPERATIONGRAPH_DESCRIPTOR = 15,
    KCDNN_VARIANT_PACK_DESCRIPTOR = 16,
    KCDNN_TENSOR_DESCRIPTOR = 17,
    KCDNN_MATMUL_DESCRIPTOR = 18,
    KCDNN_OPERATION_MATMUL_DESCRIPTOR = 19,
    KCDNN_REDUCTION_DESCRIPTOR = 21,
    KCDNN_OPERATION_REDUCTION_DESCRIPTOR = 22,
    KCDNN_OPERATION_RESHAPE_DESCRIPTOR = 31,
    KCDNN_DEVICEPROP_DESCRIPTOR = 38
};

/* cudnnBackendAttributeName_t */
enum {
    KCDNN_ATTR_POINTWISE_MODE = 0,
    KCDNN_ATTR_POINTWISE_MATH_PREC = 1,
    KCDNN_ATTR_POINTWISE_AXIS = 9,
    KCDNN_ATTR_ENGINEHEUR_MODE = 200,
    KCDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
    KCDNN_ATTR_ENGINEHEUR_RESULTS = 202,
    KCDNN_ATTR_ENGINEHEUR_DEVICEPROP = 204,
    KCDNN_ATTR_ENGINECFG_WORKSPACE_SIZE = 303,
    KCDNN_ATTR_EXECUTION_PLAN_HANDLE = 400,
    KCDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    KCDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    KCDNN_ATTR_EXECUTION_PLAN_DEVICEPROP = 407,
    KCDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR = 750,
    KCDNN_ATTR_OPERATION_POINTWISE_XDESC = 751,
    KCDNN_ATTR_OPERATION_POINTWISE_BDESC = 752,
    KCDNN_ATTR_OPERATION_POINTWISE_YDESC = 753,
    KCDNN_ATTR_OPERATION_POINTWISE_ALPHA1 = 754,
    KCDNN_ATTR_OPERATION_POINTWISE_ALPHA2 = 755,
    KCDNN_ATTR_OPERATION_POINTWISE_TDESC = 758,
    KCDNN_ATTR_OPERATIONGRAPH_HANDLE = 800,
    KCDNN_ATTR_OPERATIONGRAPH_OPS = 801,
    KCDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900,
    KCDNN_ATTR_TENSOR_DATA_TYPE = 901,
    KCDNN_ATTR_TENSOR_DIMENSIONS = 902,
    KCDNN_ATTR_TENSOR_STRIDES = 903,
    KCDNN_ATTR_TENSOR_UNIQUE_ID = 906,
    KCDNN_ATTR_TENSOR_IS_VIRTUAL = 907,
    KCDNN_ATTR_TENSOR_IS_BY_VALUE = 908,
    KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000,
    KCDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
    KCDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003,
    KCDNN_ATTR_MATMUL_COMP_TYPE = 1500,
    KCDNN_ATTR_OPERATION_MATMUL_ADESC = 1520,
    KCDNN_ATTR_OPERATION_MATMUL_BDESC = 1521,
    KCDNN_ATTR_OPERATION_MATMUL_CDESC = 1522,
    KCDNN_ATTR_OPERATION_MATMUL_DESC = 1523,
    KCDNN_ATTR_REDUCTION_OPERATOR = 1600,
    KCDNN_ATTR_REDUCTION_COMP_TYPE = 1601,
    KCDNN_ATTR_OPERATION_REDUCTION_XDESC = 1610,
    KCDNN_ATTR_OPERATION_REDUCTION_YDESC = 1611,
    KCDNN_ATTR_OPERATION_REDUCTION_DESC = 1612,
    KCDNN_ATTR_OPERATION_RESHAPE_XDESC = 2200,
    KCDNN_ATTR_OPERATION_RESHAPE_YDESC = 2201,
    KCDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION = 2702
};

/* cudnnBackendAttributeType_t */
enum {
    KCDNN_TYPE_HANDLE = 0,
    KCDNN_TYPE_DATA_TYPE = 1,
    KCDNN_TYPE_BOOLEAN = 2, /* a C bool */
    KCDNN_TYPE_INT64 = 3,
    KCDNN_TYPE_FLOAT = 4,
    KCDNN_TYPE_VOID_PTR = 6,
    KCDNN_TYPE_HEUR_MODE = 8,
    KCDNN_TYPE_POINTWISE_MODE = 14,
    KCDNN_TYPE_BACKEND_DESCRIPTOR = 15,
    KCDNN_TYPE_REDUCTION_OPERATOR_TYPE = 18,
    KCDNN_TYPE_CHAR = 24
};

/* cudnnDataType_t */
enum {
    KCDNN_DATA_FLOAT = 0,
    KCDNN_DATA_HALF = 2,
    KCDNN_DATA_INT32 = 4,
    KCDNN_DATA_BFLOAT16 = 9,
    KCDNN_DATA_BOOLEAN = 11
};

/* cudnnPointwiseMode_t */
enum {
    KCDNN_POINTWISE_ADD = 0,
    KCDNN_POINTWISE_MUL = 1,
    KCDNN_POINTWISE_DIV = 6,
    KCDNN_POINTWISE_SUB = 9,
    KCDNN_POINTWISE_EXP = 13,
    KCDNN_POINTWISE_LOG = 15,
    KCDNN_POINTWISE_IDENTITY = 21,
    KCDNN_POINTWISE_CMP_GE = 303,
    KCDNN_POINTWISE_GEN_INDEX = 501,
    KCDNN_POINTWISE_BINARY_SELECT = 601
};

/* cudnnReduceTensorOp_t, cudnnBackendHeurMode_t */
enum {
    KCDNN_REDUCE_TENSOR_ADD = 0,
    KCDNN_REDUCE_TENSOR_MAX = 3,
    KCDNN_HEUR_MODE_A = 3
};

/* The entry points, as the library exports them (names in kcdnn_names). */
typedef struct kcdnn_api {
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(kcdnn_status);
    void (*GetLastErrorString)(char *message, size_t max_size);
    kcdnn_status (*Create)(kcdnn_handle *);
    kcdnn_status (*Destroy)(kcdnn_handle);
    kcdnn_status (*SetStream)(kcdnn_handle, void *stream);
    kcdnn_status (*BackendCreateDescriptor)(int type, kcdnn_desc *);
    kcdnn_status (*BackendDestroyDescriptor)(kcdnn_desc);
    kcdnn_status (*BackendFinalize)(kcdnn_desc);
    kcdnn_status (*BackendSetAttribute)(kcdnn_desc, int name, int type, int64_t count,
                                        const void *values);
    kcdnn_status (*BackendGetAttribute)(kcdnn_desc, int name, int type, int64_t requested,
                                        int64_t *count, void *values);
    kcdnn_status (*BackendExecute)(kcdnn_handle, kcdnn_desc plan, kcdnn_desc pack);
} kcdnn_api;

/* The exported names of kcdnn_api's members, in order. */
#define KCDNN_NAMES                                                            \
    "cudnnGetVersion", "cudnnGetErrorString", "cudnnGetLastErrorString",       \
        "cudnnCreate", "cudnnDestroy", "cudnnSetStream",                       \
        "cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor",       \
        "cudnnBackendFinalize", "cudnnBackendSetAttribute",                    \
        "cudnnBackendGetAttribute", "cudnnBackendExecute"

#endif
