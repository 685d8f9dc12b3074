/* DLPack's ABI (dlpack.h v1.x, stable), declared here so no DLPack header is needed to build:
 * the legacy and versioned managed tensors, and the C exchange API (DLPack 1.2+) through which a
 * producer type (torch.Tensor, cuda.core's StridedMemoryView) hands over a tensor without a
 * Python call. Names carry a vyre_ prefix so a real dlpack.h pulled in elsewhere cannot clash. */
#ifndef VYRE_CUDA_DLPACK_H
#define VYRE_CUDA_DLPACK_H
#include <stdint.h>

typedef struct { int32_t device_type; int32_t device_id; } vyre_DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } vyre_DLDataType;
typedef struct {
    void* data; vyre_DLDevice device; int32_t ndim; vyre_DLDataType dtype;
    int64_t* shape; int64_t* strides; uint64_t byte_offset;
} vyre_DLTensor;
typedef struct vyre_DLManagedTensor {
    vyre_DLTensor dl_tensor; void* manager_ctx; void (*deleter)(struct vyre_DLManagedTensor*);
} vyre_DLManagedTensor;
typedef struct { uint32_t major; uint32_t minor; } vyre_DLPackVersion;
typedef struct vyre_DLManagedTensorVersioned {
    vyre_DLPackVersion version; void* manager_ctx;
    void (*deleter)(struct vyre_DLManagedTensorVersioned*); uint64_t flags; vyre_DLTensor dl_tensor;
} vyre_DLManagedTensorVersioned;

/* The exchange API: a struct of function pointers behind a PyCapsule named
 * "dlpack_exchange_api", found on the producer's type as __dlpack_c_exchange_api__ (older
 * releases: __c_dlpack_exchange_api__). The *_no_sync calls do no stream ordering: the consumer
 * orders itself after current_work_stream. */
typedef struct vyre_DLPackExchangeAPIHeader {
    vyre_DLPackVersion version; struct vyre_DLPackExchangeAPIHeader* prev_api;
} vyre_DLPackExchangeAPIHeader;
typedef struct {
    vyre_DLPackExchangeAPIHeader header;
    void* managed_tensor_allocator;
    int (*managed_tensor_from_py_object_no_sync)(void* py_object, vyre_DLManagedTensorVersioned** out);
    void* managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void* py_object, vyre_DLTensor* out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_current_stream);
} vyre_DLPackExchangeAPI;

#endif
