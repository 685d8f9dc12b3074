# DLPack's ABI, from _dlpack.h: the managed tensors (legacy and versioned) and the C exchange API.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "_dlpack.h":
    ctypedef struct DLDevice "vyre_DLDevice":
        int32_t device_type
        int32_t device_id
    ctypedef struct DLDataType "vyre_DLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor "vyre_DLTensor":
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor "vyre_DLManagedTensor":
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept
    ctypedef struct DLPackVersion "vyre_DLPackVersion":
        uint32_t major
        uint32_t minor
    ctypedef struct DLManagedTensorVersioned "vyre_DLManagedTensorVersioned":
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept
        uint64_t flags
        DLTensor dl_tensor
    ctypedef struct DLPackExchangeAPIHeader "vyre_DLPackExchangeAPIHeader":
        DLPackVersion version
    ctypedef struct DLPackExchangeAPI "vyre_DLPackExchangeAPI":
        DLPackExchangeAPIHeader header
        int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out) noexcept
        int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_current_stream) noexcept


cdef enum:
    KDL_CPU = 1
    KDL_CUDA = 2
    KDL_CUDA_HOST = 3
    KDL_CUDA_MANAGED = 13
    DL_FLAG_READ_ONLY = 1
