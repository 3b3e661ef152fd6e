/* test_cuda_abi.c — ferry declares the few CUDA driver and cuFile types it
 * uses itself (src/cuda/cuda.h, cufile.h: nothing links CUDA). Here, where the
 * toolkit's headers are installed, those declarations are checked against
 * them: struct sizes and field offsets, enum values. Without the headers the
 * test says it skipped. */
#include "check.h"
#include <stddef.h>
#include <stdint.h>

#if defined(__has_include)
#if __has_include(<cuda.h>)
#define HAVE_CUDA_H 1
#endif
#if __has_include(<cufile.h>)
#define HAVE_CUFILE_H 1
#endif
#if __has_include(<nvjpeg.h>)        /* the nvidia-nvjpeg wheel's include/ (Makefile: NVJPEG_INC) */
#define HAVE_NVJPEG_H 1
#endif
#if __has_include(<nvcomp/zstd.h>)   /* the nvidia-libnvcomp wheel's include/ (Makefile: ABI_INC) */
#define HAVE_NVCOMP_H 1
#endif
#endif

#ifdef HAVE_CUDA_H
#include <cuda.h>
#ifdef HAVE_CUFILE_H
#include <cufile.h>
#endif
/* ferry's header next to the toolkit's: its typedef names renamed (the
 * struct tags are the same incomplete types in both) */
#define CUresult f_CUresult
#define CUdevice f_CUdevice
#define CUcontext f_CUcontext
#define CUstream f_CUstream
#define CUevent f_CUevent
#define CUmodule f_CUmodule
#define CUfunction f_CUfunction
#define CUdeviceptr f_CUdeviceptr
#include "cuda/cuda.h"
#include "cuda/cufile.h"
#include "cuda/nvcomp.h"
#include "cuda/nvjpeg.h"
#ifdef HAVE_NVJPEG_H
#include <nvjpeg.h>
#endif
#ifdef HAVE_NVCOMP_H
#include <nvcomp/deflate.h>
#include <nvcomp/lz4.h>
#include <nvcomp/version.h>
#include <nvcomp/zstd.h>
#endif
#undef CUresult
#undef CUdevice
#undef CUcontext
#undef CUstream
#undef CUevent
#undef CUmodule
#undef CUfunction
#undef CUdeviceptr

typedef struct CUstream_st *CUstream_st_ptr_;
#define SAME_FIELD(a, fa, b, fb) CHECK(offsetof(a, fa) == offsetof(b, fb) && sizeof(((a *)0)->fa) == sizeof(((b *)0)->fb))

/* nvJPEG's single-image API as src/cuda/nvjpeg.h declares it */
static void test_nvjpeg_types(void) {
#ifdef HAVE_NVJPEG_H
    CHECK(sizeof(nvj_status) == sizeof(nvjpegStatus_t));
    CHECK(sizeof(nvj_image) == sizeof(nvjpegImage_t));
    SAME_FIELD(nvj_image, channel, nvjpegImage_t, channel);
    SAME_FIELD(nvj_image, pitch, nvjpegImage_t, pitch);
    CHECK(sizeof(nvj_handle) == sizeof(nvjpegHandle_t) && sizeof(nvj_state) == sizeof(nvjpegJpegState_t));
    CHECK_EQ_I(NVJ_MAX_COMPONENT, NVJPEG_MAX_COMPONENT);
    CHECK_EQ_I(NVJ_OUTPUT_RGBI, NVJPEG_OUTPUT_RGBI);
    CHECK_EQ_I(NVJ_PROP_MAJOR, MAJOR_VERSION);
    CHECK_EQ_I(NVJ_PROP_MINOR, MINOR_VERSION);
    CHECK_EQ_I(NVJ_BAD_JPEG, NVJPEG_STATUS_BAD_JPEG);
    CHECK_EQ_I(NVJ_NOT_SUPPORTED, NVJPEG_STATUS_JPEG_NOT_SUPPORTED);
    CHECK_EQ_I(NVJ_ALLOC, NVJPEG_STATUS_ALLOCATOR_FAILURE);
    CHECK_EQ_I(NVJ_IMPL, NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED);
    CHECK_EQ_I(NVJ_INCOMPLETE, NVJPEG_STATUS_INCOMPLETE_BITSTREAM);
#else
    printf("  skipped: no nvjpeg.h (pip install nvidia-nvjpeg)\n");
#endif
}

static void test_driver_types(void) {
    CHECK(sizeof(f_CUdeviceptr) == sizeof(CUdeviceptr));
    CHECK(sizeof(f_CUresult) == sizeof(CUresult));
    CHECK(sizeof(f_CUdevice) == sizeof(CUdevice));
    CHECK(sizeof(ferry_cu_memcpy2d) == sizeof(CUDA_MEMCPY2D));
    SAME_FIELD(ferry_cu_memcpy2d, srcXInBytes, CUDA_MEMCPY2D, srcXInBytes);
    SAME_FIELD(ferry_cu_memcpy2d, srcY, CUDA_MEMCPY2D, srcY);
    SAME_FIELD(ferry_cu_memcpy2d, srcMemoryType, CUDA_MEMCPY2D, srcMemoryType);
    SAME_FIELD(ferry_cu_memcpy2d, srcHost, CUDA_MEMCPY2D, srcHost);
    SAME_FIELD(ferry_cu_memcpy2d, srcDevice, CUDA_MEMCPY2D, srcDevice);
    SAME_FIELD(ferry_cu_memcpy2d, srcPitch, CUDA_MEMCPY2D, srcPitch);
    SAME_FIELD(ferry_cu_memcpy2d, dstXInBytes, CUDA_MEMCPY2D, dstXInBytes);
    SAME_FIELD(ferry_cu_memcpy2d, dstY, CUDA_MEMCPY2D, dstY);
    SAME_FIELD(ferry_cu_memcpy2d, dstMemoryType, CUDA_MEMCPY2D, dstMemoryType);
    SAME_FIELD(ferry_cu_memcpy2d, dstHost, CUDA_MEMCPY2D, dstHost);
    SAME_FIELD(ferry_cu_memcpy2d, dstDevice, CUDA_MEMCPY2D, dstDevice);
    SAME_FIELD(ferry_cu_memcpy2d, dstPitch, CUDA_MEMCPY2D, dstPitch);
    SAME_FIELD(ferry_cu_memcpy2d, WidthInBytes, CUDA_MEMCPY2D, WidthInBytes);
    SAME_FIELD(ferry_cu_memcpy2d, Height, CUDA_MEMCPY2D, Height);
}

static void test_driver_constants(void) {
    CHECK_EQ_I(FERRY_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
    CHECK_EQ_I(FERRY_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
    CHECK_EQ_I(FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
    CHECK_EQ_I(FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
    CHECK_EQ_I(FERRY_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
    CHECK_EQ_I(FERRY_CU_EVENT_BLOCKING_SYNC, CU_EVENT_BLOCKING_SYNC);
    CHECK_EQ_I(FERRY_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
    CHECK_EQ_I(FERRY_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE);
    CHECK_EQ_I(FERRY_CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE);
    CHECK_EQ_I(FERRY_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
    /* ferry_job_stream_wait takes handles 0..2 for the default streams */
    CHECK((uintptr_t)CU_STREAM_LEGACY == 1 && (uintptr_t)CU_STREAM_PER_THREAD == 2);
}

static void test_cufile_types(void) {
#ifdef HAVE_CUFILE_H
    CHECK(sizeof(ferry_cufile_error) == sizeof(CUfileError_t));
    SAME_FIELD(ferry_cufile_error, err, CUfileError_t, err);
    SAME_FIELD(ferry_cufile_error, cu_err, CUfileError_t, cu_err);
    CHECK(sizeof(ferry_cufile_descr) == sizeof(CUfileDescr_t));
    SAME_FIELD(ferry_cufile_descr, type, CUfileDescr_t, type);
    SAME_FIELD(ferry_cufile_descr, handle, CUfileDescr_t, handle);
    SAME_FIELD(ferry_cufile_descr, fs_ops, CUfileDescr_t, fs_ops);
    CHECK_EQ_I(1, CU_FILE_HANDLE_TYPE_OPAQUE_FD);
    /* the texts ferry gives cuFile's codes belong to those codes */
    static const struct { int code; const char *text; } t[] = {
        {CU_FILE_DRIVER_NOT_INITIALIZED, "driver not initialized"}, {CU_FILE_DRIVER_INVALID_PROPS, "invalid driver property"},
        {CU_FILE_IO_NOT_SUPPORTED, "I/O not supported"}, {CU_FILE_CUDA_DRIVER_ERROR, "CUDA driver error"},
        {CU_FILE_CUDA_POINTER_RANGE_ERROR, "pointer range"}, {CU_FILE_CUDA_CONTEXT_MISMATCH, "context mismatch"},
        {CU_FILE_INVALID_FILE_TYPE, "invalid file type"}, {CU_FILE_INVALID_FILE_OPEN_FLAG, "open flag"},
        {CU_FILE_DIO_NOT_SET, "O_DIRECT"}, {CU_FILE_INVALID_VALUE, "invalid value"},
        {CU_FILE_MEMORY_ALREADY_REGISTERED, "already registered"}, {CU_FILE_MEMORY_NOT_REGISTERED, "memory not registered"},
        {CU_FILE_PERMISSION_DENIED, "permission denied"}, {CU_FILE_DRIVER_ALREADY_OPEN, "already open"},
        {CU_FILE_HANDLE_NOT_REGISTERED, "handle not registered"}, {CU_FILE_HANDLE_ALREADY_REGISTERED, "handle already"},
        {CU_FILE_DEVICE_NOT_FOUND, "device not found"}, {CU_FILE_INTERNAL_ERROR, "internal error"},
        {CU_FILE_GETNEWFD_FAILED, "file descriptor"}, {CU_FILE_NVFS_SETUP_ERROR, "nvidia-fs setup"},
        {CU_FILE_IO_DISABLED, "I/O disabled"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) CHECK_STR_CONTAINS(ferry_cufile_errstr(t[i].code), t[i].text);
#else
    printf("  cufile.h not found: cuFile types not checked\n");
#endif
}

/* nvCOMP's batched decompressors as src/cuda/nvcomp.h declares them: the
 * options structs (one 64-byte layout for all three), the alignment and
 * properties structs, the status codes, and each function's whole signature
 * (ferry's parameter list written with nvCOMP's own types must be the type
 * of nvCOMP's function). */
static void test_nvcomp_types(void) {
#ifdef HAVE_NVCOMP_H
    CHECK(sizeof(ferry_nvcomp_status_t) == sizeof(nvcompStatus_t));
    CHECK(sizeof(ferry_nvcomp_opts) == sizeof(nvcompBatchedZstdDecompressOpts_t));
    CHECK(sizeof(ferry_nvcomp_opts) == sizeof(nvcompBatchedLZ4DecompressOpts_t));
    CHECK(sizeof(ferry_nvcomp_opts) == sizeof(nvcompBatchedDeflateDecompressOpts_t));
    SAME_FIELD(ferry_nvcomp_opts, backend, nvcompBatchedZstdDecompressOpts_t, backend);
    SAME_FIELD(ferry_nvcomp_opts, backend, nvcompBatchedLZ4DecompressOpts_t, backend);
    SAME_FIELD(ferry_nvcomp_opts, backend, nvcompBatchedDeflateDecompressOpts_t, backend);
    /* ferry passes all-zero options: that must be each default */
    CHECK_EQ_I(NVCOMP_DECOMPRESS_BACKEND_DEFAULT, 0);
    CHECK_EQ_I(nvcompBatchedLZ4DecompressDefaultOpts.data_type, 0);
    CHECK_EQ_I(nvcompBatchedLZ4DecompressDefaultOpts.bitshuffle_mode, 0);
    CHECK_EQ_I(nvcompBatchedLZ4DecompressDefaultOpts.sort_before_hw_decompress, 0);
    CHECK_EQ_I(nvcompBatchedDeflateDecompressDefaultOpts.sort_before_hw_decompress, 0);
    CHECK(sizeof(ferry_nvcomp_align) == sizeof(nvcompAlignmentRequirements_t));
    SAME_FIELD(ferry_nvcomp_align, input, nvcompAlignmentRequirements_t, input);
    SAME_FIELD(ferry_nvcomp_align, output, nvcompAlignmentRequirements_t, output);
    SAME_FIELD(ferry_nvcomp_align, temp, nvcompAlignmentRequirements_t, temp);
    CHECK(sizeof(ferry_nvcomp_props) == sizeof(nvcompProperties_t));
    SAME_FIELD(ferry_nvcomp_props, version, nvcompProperties_t, version);
    SAME_FIELD(ferry_nvcomp_props, cudart_version, nvcompProperties_t, cudart_version);
    CHECK_EQ_I(FERRY_NVCOMP_SUCCESS, nvcompSuccess);
    CHECK_EQ_I(FERRY_NVCOMP_INVALID_VALUE, nvcompErrorInvalidValue);
    CHECK_EQ_I(FERRY_NVCOMP_NOT_SUPPORTED, nvcompErrorNotSupported);
    CHECK_EQ_I(FERRY_NVCOMP_CANNOT_DECOMPRESS, nvcompErrorCannotDecompress);
    CHECK_EQ_I(FERRY_NVCOMP_BAD_CHECKSUM, nvcompErrorBadChecksum);
    CHECK_EQ_I(FERRY_NVCOMP_OUTPUT_TOO_SMALL, nvcompErrorOutputBufferTooSmall);
    CHECK_EQ_I(FERRY_NVCOMP_ALIGNMENT, nvcompErrorAlignment);
    CHECK_EQ_I(FERRY_NVCOMP_CHUNK_TOO_LARGE, nvcompErrorChunkSizeTooLarge);
    CHECK_EQ_I(FERRY_NVCOMP_WRONG_INPUT_LENGTH, nvcompErrorWrongInputLength);
    CHECK_EQ_I(FERRY_NVCOMP_CUDA_ERROR, nvcompErrorCudaError);
    CHECK_EQ_I(FERRY_NVCOMP_INTERNAL, nvcompErrorInternal);
    CHECK_STR_CONTAINS(ferry_nvcomp_errstr(nvcompErrorCannotDecompress), "cannot decompress");
    /* the version arithmetic nvcomp.c undoes */
    CHECK_EQ_I(NVCOMP_VER, NVCOMP_VER_MAJOR * 1000 + NVCOMP_VER_MINOR * 100 + NVCOMP_VER_PATCH);
    CHECK(NVCOMP_VER_MAJOR == 5 || NVCOMP_VER_MAJOR == 6);
/* the temp-size query: 5.x GetTempSizeAsync; 6.x GetTempSize with a stream (nvcomp.h) */
#if NVCOMP_VER_MAJOR >= 6
#define TEMP_SIG(X) CHECK(__builtin_types_compatible_p(__typeof__(&nvcompBatched##X##DecompressGetTempSize), temp6_t));
#else
#define TEMP_SIG(X) CHECK(__builtin_types_compatible_p(__typeof__(&nvcompBatched##X##DecompressGetTempSizeAsync), temp_t))
#endif
#define SIGS(X, Opts) do { \
        typedef nvcompStatus_t (*temp_t)(size_t, size_t, Opts, size_t *, size_t); \
        typedef nvcompStatus_t (*temp6_t)(size_t, size_t, Opts, size_t *, size_t, cudaStream_t); \
        (void)(temp_t)0; (void)(temp6_t)0;   /* one of the two is checked, by version */ \
        typedef nvcompStatus_t (*dec_t)(const void *const *, const size_t *, const size_t *, size_t *, size_t, void *const, \
                                        size_t, void *const *, Opts, nvcompStatus_t *, cudaStream_t); \
        typedef nvcompStatus_t (*size_t_)(const void *const *, const size_t *, size_t *, size_t, cudaStream_t); \
        typedef nvcompStatus_t (*align_t)(Opts, nvcompAlignmentRequirements_t *); \
        TEMP_SIG(X); \
        CHECK(__builtin_types_compatible_p(__typeof__(&nvcompBatched##X##DecompressAsync), dec_t)); \
        CHECK(__builtin_types_compatible_p(__typeof__(&nvcompBatched##X##GetDecompressSizeAsync), size_t_)); \
        CHECK(__builtin_types_compatible_p(__typeof__(&nvcompBatched##X##DecompressGetRequiredAlignments), align_t)); \
    } while (0)
    SIGS(Zstd, nvcompBatchedZstdDecompressOpts_t);
    SIGS(LZ4, nvcompBatchedLZ4DecompressOpts_t);
    SIGS(Deflate, nvcompBatchedDeflateDecompressOpts_t);
#undef SIGS
    CHECK(sizeof(cudaStream_t) == sizeof(CUstream_st_ptr_));
    CHECK(__builtin_types_compatible_p(__typeof__(&nvcompGetProperties), nvcompStatus_t (*)(nvcompProperties_t *)));
    printf("  checked against nvCOMP %d.%d.%d headers\n", NVCOMP_VER_MAJOR, NVCOMP_VER_MINOR, NVCOMP_VER_PATCH);
#else
    printf("  nvcomp/zstd.h not found: nvCOMP declarations not checked\n");
#endif
}

int main(void) {
    RUN(test_nvcomp_types);
    RUN(test_nvjpeg_types);
    RUN(test_driver_types);
    RUN(test_driver_constants);
    RUN(test_cufile_types);
    return check_summary();
}
#else
int main(void) {
    printf("skipped: the CUDA toolkit's cuda.h is not installed\n");
    printf("0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#endif
