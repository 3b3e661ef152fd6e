/*
 * ferry.h — move array data between files and GPU or host memory, fast.
 *
 * This header is the whole public C API and its manual. Everything is C11.
 *
 * Model
 * -----
 *  - A ferry_ctx is an engine: a thread pool, pinned staging buffers, CUDA
 *    streams, statistics. Create one per process (it is thread-safe).
 *  - A ferry_file is an open file (a buffered descriptor, an O_DIRECT one and a
 *    cuFile handle, each opened lazily and kept while the file is open).
 *  - A ferry_plan is a list of extents: "read LEN bytes at OFFSET of FILE,
 *    decode them, place the result at DST" (or, for writes, the other way).
 *    Formats (npy, safetensors, netCDF classic, Zarr) turn a selection into a
 *    plan; the engine runs plans. ferry_pread/ferry_pwrite are one-extent plans.
 *  - Small plain reads (up to 1 MiB; for device memory up to one staging
 *    buffer) are packed: cut into tasks by bytes, read back to back into one
 *    staging buffer and sent to the device in one copy per contiguous
 *    destination run (or one copy and one scatter kernel when the rows land
 *    in arbitrary order); into host memory, reads adjacent in a file are one
 *    preadv. Files named by path are kept open in the context (bounded by
 *    RLIMIT_NOFILE) and reopened when the path names another file, or its
 *    size or mtime changed.
 *  - Paths: `cufile` (GPUDirect Storage), `staged` (pread into pinned staging
 *    buffers, then host-to-device copies, overlapped), `host` (pread straight
 *    into host memory). Host memory always takes the host path; for device
 *    memory AUTO picks cufile where GDS really works, else staged, and a forced
 *    path (cufile or staged) that cannot run is an error, never a silent
 *    fallback; forcing `host` with device memory is FERRY_EPATH. Extents with
 *    codecs or placements always use staged for device memory: decoded on the
 *    CPU in staging, or — compressed chunks nvCOMP can take, per the decode
 *    policy (ferry_decode_policy, FERRY_DECODE) — read packed, copied, and
 *    decoded on the GPU. ferry_stats tells which ran.
 *  - CUDA (libcuda.so.1), cuFile (libcufile.so.0) and nvCOMP (libnvcomp.so.6
 *    or .5) are loaded at run time; nothing here links them. Without a GPU the
 *    host path still works.
 *
 * Errors
 * ------
 *  Functions return 0 (or a count) on success and a negative value on
 *  failure: either a ferry_status below or -errno from the operating system.
 *  ferry_strerror(code) names the code; ferry_errmsg(ctx) gives the message of
 *  the most recent failing ferry call made *by the calling thread*, naming the
 *  file, offset and variable involved. Messages are kept per thread, not per
 *  context: threads sharing one context never see each other's errors, and
 *  calls that take no context (ferry_plan_add, ferry_plan_layout, ...) leave
 *  their message in the same place (ctx may be NULL). The library never
 *  prints, never exits and never aborts on bad input.
 *
 * Memory
 * ------
 *  The caller owns all destination and source memory and keeps it alive until
 *  the call returns (blocking calls) or the job completes (asynchronous calls).
 *  ferry allocates only its own staging buffers.
 *
 * Lifetimes
 * ---------
 *  - Memory, files (ferry_file) and datasets a plan names: alive and open
 *    until every job running the plan has completed (ferry_job_wait or
 *    ferry_job_destroy returned); the plan itself may go once ferry_submit
 *    returns (it is copied), and ferry_plan_add copies each extent, its
 *    placement and its strings.
 *  - Strings ferry returns live as long as the object they came from (a
 *    file's path, a dataset's names and JSON), are static (ferry_strerror,
 *    names of formats and paths, CUDA status), or are the thread's error
 *    message (ferry_errmsg); each declaration below says which.
 *  - Destroy jobs and close datasets before ferry_ctx_destroy (it waits for
 *    the jobs); destroy(NULL) and close(NULL) are no-ops everywhere.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libferry.so exports is exactly what this header declares: the library
 * is built with -fvisibility=hidden, and FERRY_API_BEGIN / FERRY_API_END
 * (around every declaration below) give these names default visibility. A
 * function not declared here is internal, whatever its prefix (src/common.h
 * says how internal names are marked); `make test-c` checks `nm -D`. */
#if defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
#define FERRY_API_BEGIN _Pragma("GCC visibility push(default)")
#define FERRY_API_END _Pragma("GCC visibility pop")
#else
#define FERRY_API
#define FERRY_API_BEGIN
#define FERRY_API_END
#endif
FERRY_API_BEGIN

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"

/** The library's version string, e.g. "0.1.0". */
const char *ferry_version(void);

/* ------------------------------------------------------------------------- */
/* Status codes (all negative; -errno values are returned as they are)       */
/* ------------------------------------------------------------------------- */
typedef enum ferry_status {
    FERRY_OK = 0,
    FERRY_EINVAL = -10001,      /* bad argument */
    FERRY_ENOMEM = -10002,      /* allocation failed */
    FERRY_EIO = -10003,         /* I/O failed (message says where) */
    FERRY_ESHORT = -10004,      /* file ended before the bytes a plan needs */
    FERRY_EFORMAT = -10005,     /* malformed file (message: file, byte position) */
    FERRY_EUNSUPPORTED = -10006,/* valid but unsupported (codec, dtype, ...) */
    FERRY_ENOCUDA = -10007,     /* CUDA driver not available */
    FERRY_ECUDA = -10008,       /* a CUDA driver call failed */
    FERRY_ENOCUFILE = -10009,   /* cuFile not available / GDS cannot run */
    FERRY_ECUFILE = -10010,     /* a cuFile call failed */
    FERRY_ECODEC = -10011,      /* decompression failed: corrupt data */
    FERRY_ECHECKSUM = -10012,   /* checksum mismatch */
    FERRY_ENOTFOUND = -10013,   /* no such variable / tensor / array */
    FERRY_ETIMEDOUT = -10014,   /* ferry_job_wait timed out; the job goes on */
    FERRY_ECANCELED = -10015,   /* job canceled */
    FERRY_EPATH = -10016,       /* the forced path cannot serve this request */
    FERRY_ENOFORMAT = -10017    /* ferry_dataset_open: not a file or store of a known format */
} ferry_status;

/** A static, human-readable name for any return code (ferry_status or -errno). */
const char *ferry_strerror(int code);

/* ------------------------------------------------------------------------- */
/* Configuration                                                             */
/* ------------------------------------------------------------------------- */
typedef enum ferry_path {
    FERRY_PATH_AUTO = 0,
    FERRY_PATH_CUFILE = 1,
    FERRY_PATH_STAGED = 2,
    FERRY_PATH_HOST = 3,
    FERRY_PATH_COUNT_ = 4
} ferry_path;

/** "auto", "cufile", "staged", "host". */
const char *ferry_path_name(ferry_path p);
/** Parse a path name; returns FERRY_EINVAL for an unknown name. */
int ferry_path_parse(const char *name, ferry_path *out);

typedef enum ferry_direct {
    FERRY_DIRECT_AUTO = 0, /* O_DIRECT for cold, aligned, large ranges; buffered otherwise */
    FERRY_DIRECT_ON = 1,   /* O_DIRECT wherever alignment allows (buffered heads/tails) */
    FERRY_DIRECT_OFF = 2   /* never O_DIRECT */
} ferry_direct;

/** "auto", "on", "off". */
const char *ferry_direct_name(ferry_direct d);
/** Parse an O_DIRECT policy name (case-insensitive); FERRY_EINVAL for an unknown name. */
int ferry_direct_parse(const char *name, ferry_direct *out);

/** Sizes, everywhere ferry reads one (FERRY_* variables, `ferry bench --size`,
 *  the Python package): a byte count with an optional unit. K, M, G, T, P
 *  alone or with "iB" are binary (8M = 8MiB = 8·2^20: the FERRY_* variables'
 *  meaning); with "B" they are SI (5GB = 5·10^9, as Hugging Face's
 *  max_shard_size reads it). Case-insensitive, spaces allowed around the
 *  unit ("b" is bytes, never bits); a fraction must give whole bytes
 *  ("1.5K" = 1536). Returns 0, or FERRY_EINVAL for garbage or overflow. */
int ferry_size_parse(const char *s, uint64_t *out);

typedef struct ferry_config {
    int threads;          /* workers; 0: default (16, or the CPU count if larger)  [FERRY_THREADS] */
    size_t task_size;     /* bytes per task a worker takes; 0: 8 MiB                [FERRY_TASK_SIZE] */
    size_t staging_size;  /* bytes per pinned staging buffer; 0: 2 MiB              [FERRY_STAGING_SIZE] */
    int staging_count;    /* staging buffers per worker (>= 2); 0: 3                [FERRY_STAGING_COUNT] */
    ferry_path path;      /* default path                                          [FERRY_PATH] */
    ferry_direct direct;  /* O_DIRECT policy                                       [FERRY_DIRECT] */
    size_t small_io;      /* plans of at most this many bytes (and 4 tasks) run on the caller's thread;
                             0: staging_size                                     [FERRY_SMALL_IO] */
    int no_env;           /* nonzero: ignore FERRY_* environment variables */
    int decode;           /* ferry_decode_policy for compressed chunks         [FERRY_DECODE] */
} ferry_config;
/* NUMA (process-wide, not a field) [FERRY_NUMA=auto|off]: on a host with several NUMA nodes,
 * each pool worker moves, before its first pinned staging allocation, to the CPUs of the
 * node of the device it feeds and prefers that node's memory, when every GPU the process
 * holds a context on is on that node (a DDP rank); work run on the caller's thread never
 * moves the caller. One node: nothing happens. `ferry info` prints the topology;
 * docs/multigpu.md says more. */
/* Cold small records (read once per context, not a field) [FERRY_READAHEAD=auto|on|off]: auto
 * announces a packed task's records to the kernel (posix_fadvise WILLNEED) when its first
 * record is not in the page cache, on always, off never. Ignored with no_env.
 * Read-around windows [FERRY_READAROUND=size, 4M; a power of two from 64K; 0 off]: in a job
 * of 64 records or more, each announced range under a quarter of that size is widened to
 * the aligned windows of that size around it (what a memory-mapped reader's faults read
 * around its records): a shuffled cold epoch is read in large requests, and a window's
 * other records are cached when their turn comes. Files larger than a window count their
 * sizes once against half the machine's memory; once the files counted pass it (a data set
 * larger than the page cache) the context widens no more. Ignored with no_env (4M).
 * Warm small records [FERRY_MAP_MAX=size, 64K; 0 off]: when a packed task's first record
 * is in the page cache (auto's check), its records (a run of adjacent ones in all) of up to
 * that many bytes are copied out of a read-only mapping of their file, made once per open
 * file when the page cache holds all of it (checked again each second until then), instead
 * of one pread each; a fault on the mapping (the file truncated under it) is
 * caught and the record read with pread, which reports it. Ignored with no_env (64K).
 * Experiments for small records (read from the environment, ignored with no_env; the
 * defaults stay until the GPU machine's numbers move them): [FERRY_PACK_MIN] least bytes
 * of a task of packed records (64K); [FERRY_SPIN_US] microseconds an idle worker watches
 * the queue before it sleeps (0, at most 1000). */

/** Where compressed chunks are decoded (FERRY_DECODE=auto|gpu|cpu).
 *  CPU: ferry's own decoders on the worker threads, then a copy to the device.
 *  GPU: chunks bound for device memory whose codec nvCOMP decodes (zstd, LZ4,
 *       zlib/raw deflate; gzip stays on the CPU: its CRC-32 has no GPU kernel
 *       here, docs/decoding.md has the table) are read packed into pinned staging, copied
 *       once per batch and decoded by one batched nvCOMP call; filters
 *       (byteswap) run on the GPU. Every chunk bound for device memory that
 *       the CPU decodes instead (a codec nvCOMP does not take, such as gzip; a
 *       framing or a chunk nvCOMP cannot decode) is counted in
 *       ferry_stats.gpu_cpu_fallbacks; `ferry info --codecs` prints which codec
 *       goes where. Forcing GPU when
 *       nvCOMP is not loaded is FERRY_EPATH (ferry_nvcomp_status says why).
 *  AUTO: the GPU only for device destinations and only for codecs where it
 *       measured faster than the CPU (see docs/decoding.md); for
 *       deflate both decoders take chunks from one queue, the GPU only what
 *       it finishes before the CPU would (a short load: the CPU alone).
 *       Host destinations always decode on the CPU. */
typedef enum ferry_decode {
    FERRY_DECODE_AUTO = 0,
    FERRY_DECODE_GPU = 1,
    FERRY_DECODE_CPU = 2
} ferry_decode_policy;
/** "auto", "gpu", "cpu". */
const char *ferry_decode_policy_name(ferry_decode_policy d);
/** Parse a decode policy name; FERRY_EINVAL for an unknown name. */
int ferry_decode_policy_parse(const char *name, ferry_decode_policy *out);

/** Fill *cfg with defaults (all zero means "default"). */
void ferry_config_init(ferry_config *cfg);

/* ------------------------------------------------------------------------- */
/* Context                                                                    */
/* ------------------------------------------------------------------------- */
typedef struct ferry_ctx ferry_ctx;

/** Create an engine. cfg may be NULL (defaults). A context belongs to the
 *  process that created it: after fork(), the child must create its own
 *  (submitting on an inherited one fails with FERRY_EINVAL; destroying one is a
 *  no-op in the child). Unless cfg->no_env, the
 *  FERRY_* variables named in ferry_config override the struct's fields
 *  (sizes accept K/M/G suffixes). Workers and staging are created lazily. */
int ferry_ctx_create(ferry_ctx **out, const ferry_config *cfg);
/** Free the engine. Destroy every job (ferry_job_destroy) and close every
 *  dataset first: this waits until no job of the context exists. NULL is a no-op. */
void ferry_ctx_destroy(ferry_ctx *ctx);
/** The effective configuration (defaults resolved, environment applied). */
void ferry_ctx_config(const ferry_ctx *ctx, ferry_config *out);
/** Message of the calling thread's most recent failing ferry call, on any
 *  context or none ("" if none): per thread, not per context (ctx is not
 *  used and may be NULL). The string lives in thread-local storage, valid
 *  until the thread's next failing call; a successful call leaves it as is. */
const char *ferry_errmsg(const ferry_ctx *ctx);

/** Number of CUDA devices (0 when the driver is absent); never fails. */
int ferry_cuda_device_count(ferry_ctx *ctx);
/** Why CUDA or cuFile is unavailable, or "" when it is available (a static
 *  string: valid for the life of the process). */
const char *ferry_cuda_status(ferry_ctx *ctx);
const char *ferry_cufile_status(ferry_ctx *ctx);
/** Where the GPU kernels (byteswap) come from: "embedded fatbin" (nvcc ran at
 *  build time: `make`, or `pip install .` with nvcc found), "NVRTC" (no
 *  fatbin: src/cuda/kernels.cu compiled at run time by libnvrtc, found through
 *  $FERRY_NVRTC, ferry_nvrtc_search_dir or the loader's path; the first call compiles it, once per
 *  process) or "none" (device data is then byteswapped on the CPU, in host
 *  staging, before the copy). FERRY_KERNELS=nvrtc or =none overrides the
 *  choice (for tests of the NVRTC path and for bisecting). A static string. */
const char *ferry_kernels_source(void);
/** "" when the kernels are available, else why NVRTC could not compile them. */
const char *ferry_kernels_status(void);
/** 1 when the kernel image loads on CUDA device `device` (loading it once,
 *  with that device's primary context borrowed and the caller's restored),
 *  0 when there is none, no CUDA, or the driver refuses it (e.g. PTX newer
 *  than the driver): then that device's byteswaps run on the CPU. */
int ferry_kernels_ready(int device);
/** The PTX libnvrtc makes of src/cuda/kernels.cu (compute_75; the driver
 *  JITs it for the device), whether or not a fatbin is embedded: NULL when
 *  libnvrtc is missing or fails, and ferry_nvrtc_status() says why ("" when
 *  it worked). Compiled on the first call, once per process (thread-safe); the
 *  string lives until exit. */
const char *ferry_nvrtc_ptx(void);
const char *ferry_nvrtc_status(void);
/** A directory holding libnvrtc.so.13 / .so.12 (the lib folder of the CUDA
 *  wheels torch brings; the Python package passes it, instead of setting
 *  FERRY_NVRTC in the user's environment) to try after $FERRY_NVRTC and before
 *  the loader's path. Effective only before NVRTC is first loaded. */
void ferry_nvrtc_search_dir(const char *dir);
/** nvCOMP (GPU decompression, dlopen'ed on first use): "loaded nvCOMP 5.3.0
 *  from /path/libnvcomp.so.5", or why it is not used. Never fails. */
const char *ferry_nvcomp_status(ferry_ctx *ctx);
/** A directory holding libnvcomp.so.6 / .so.5 (the nvidia-libnvcomp wheel's
 *  lib64; the Python package passes it) to try after FERRY_NVCOMP and before
 *  the system paths. Effective only before nvCOMP is first loaded. */
void ferry_nvcomp_search_dir(const char *dir);

/* ------------------------------------------------------------------------- */
/* Memory descriptors                                                         */
/* ------------------------------------------------------------------------- */
typedef enum ferry_mem { FERRY_MEM_HOST = 0, FERRY_MEM_CUDA = 1 } ferry_mem;

typedef struct ferry_buf {
    ferry_mem kind;
    int device;      /* CUDA device ordinal (FERRY_MEM_CUDA) */
    void *ptr;       /* host pointer, or CUdeviceptr cast to a pointer */
    size_t size;     /* bytes available at ptr */
} ferry_buf;

static inline ferry_buf ferry_host_buf(void *ptr, size_t size) {
    ferry_buf b; b.kind = FERRY_MEM_HOST; b.device = -1; b.ptr = ptr; b.size = size; return b;
}
static inline ferry_buf ferry_cuda_buf(int device, uintptr_t dptr, size_t size) {
    ferry_buf b; b.kind = FERRY_MEM_CUDA; b.device = device; b.ptr = (void *)dptr; b.size = size; return b;
}

/* ------------------------------------------------------------------------- */
/* Memory helpers (tests, benchmarks, the Python module)                      */
/* ------------------------------------------------------------------------- */
/** A CUDA buffer with device < 0 means "the device that owns ptr": ferry looks
 *  it up (cuPointerGetAttribute) when the buffer is used. */
int ferry_cuda_malloc(ferry_ctx *ctx, int device, size_t size, uintptr_t *out);
int ferry_cuda_free(ferry_ctx *ctx, uintptr_t dptr);
/** The device ordinal owning a CUDA pointer, or a negative code (also for host pointers). */
int ferry_cuda_device_of(ferry_ctx *ctx, uintptr_t ptr);
/** Synchronous copy of n bytes between any two buffers (host or device). */
int ferry_memcpy(ferry_ctx *ctx, ferry_buf dst, ferry_buf src, size_t n);
/** Page-locked host memory (cuMemHostAlloc when CUDA is present, else page-aligned malloc). */
int ferry_pinned_alloc(ferry_ctx *ctx, size_t size, void **out);
void ferry_pinned_free(ferry_ctx *ctx, void *ptr);

/** Host memory for arrays that ferry fills: from 2 MiB on, a 2 MiB-aligned
 *  anonymous mapping advised for transparent huge pages and left untouched (the
 *  workers that fill it fault its pages in, in parallel); below that, 4 KiB
 *  aligned. Contents are zero for mappings, undefined otherwise. Plain 4 KiB
 *  pages where THP is off. Free with ferry_host_free and the same size. */
int ferry_host_alloc(ferry_ctx *ctx, size_t size, void **out);
void ferry_host_free(ferry_ctx *ctx, void *ptr, size_t size);

/** CRC-32C (Castagnoli; the checksum of Zarr v3's crc32c codec and of
 *  ferry.checkpoint). Start with crc = 0; pass the previous result to continue.
 *  Uses the SSE4.2 instruction where the CPU has it. */
uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t n);

/* ------------------------------------------------------------------------- */
/* Files                                                                      */
/* ------------------------------------------------------------------------- */
typedef struct ferry_file ferry_file;

enum {
    FERRY_READ = 1,
    FERRY_WRITE = 2,      /* open for writing (with FERRY_READ: both) */
    FERRY_CREATE = 4,     /* create if missing (mode 0644) */
    FERRY_TRUNC = 8,      /* truncate to zero on open */
    FERRY_ANY_FILE = 16   /* also open FIFOs, devices and sockets (they may block
                             or have no size); without it they are FERRY_EINVAL */
};

/** Open path. Errors: -ENOENT, -EACCES, -EISDIR (directories are refused),
 *  FERRY_EINVAL for a FIFO, device or socket unless flags has FERRY_ANY_FILE
 *  (a FIFO would block a read forever), ...
 *
 *  URLs. path may be a URL, read like a file (FERRY_READ only; FERRY_WRITE is
 *  FERRY_EUNSUPPORTED: ferry_object_write in ferry_experimental.h writes s3://
 *  and gs:// objects whole):
 *   - file:///abs/path (host empty or "localhost"; %XX decoded): the local file.
 *   - http://host[:port]/path?query, https://...: sent as written.
 *   - s3://BUCKET/KEY: the key is encoded by ferry. Endpoint: AWS_ENDPOINT_URL_S3,
 *     AWS_ENDPOINT_URL, or endpoint_url of the profile in ~/.aws/config
 *     (AWS_CONFIG_FILE), else https://s3.REGION.amazonaws.com. Region: AWS_REGION,
 *     AWS_DEFAULT_REGION, the profile's region, else us-east-1. Virtual-hosted
 *     style (BUCKET.s3.REGION.amazonaws.com) on AWS for DNS-safe bucket names,
 *     path style (ENDPOINT/BUCKET/KEY) for custom endpoints and dotted names;
 *     FERRY_S3_ADDRESSING=path|virtual|auto forces one. Credentials:
 *     AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the
 *     AWS_PROFILE (default "default") section of ~/.aws/credentials
 *     (AWS_SHARED_CREDENTIALS_FILE), else none: unsigned requests (public
 *     buckets). Requests are signed with AWS Signature Version 4.
 *   - gs://BUCKET/KEY: https://storage.googleapis.com/BUCKET/KEY (or
 *     STORAGE_EMULATOR_HOST), anonymous; with GS_ACCESS_KEY_ID and
 *     GS_SECRET_ACCESS_KEY (HMAC keys) signed for its S3-compatible API.
 *  Options set on ctx (ferry_ctx_set_remote_option, ferry_experimental.h:
 *  endpoint, region, addressing, keys or anonymous, a CA bundle) come before
 *  these variables. ferry_dataset_open also takes the URL of a Zarr store (the
 *  prefix of its objects; listed where it has no consolidated metadata).
 *  Other schemes are FERRY_EUNSUPPORTED naming the scheme; so is every URL but
 *  file:// in a ferry built without libcurl.
 *  Opening a remote object costs one request: a GET of its first 64 KiB,
 *  which gives its size and version (ETag, else Last-Modified) and serves
 *  reads of those bytes (headers) without another request. Every later read
 *  is conditional on that version (If-Match): an object replaced while it is
 *  open is an error naming the URL ("changed since it was opened"), never a
 *  mix of two versions. A read is split into range requests run side by side;
 *  timeouts, dropped connections, 5xx, 429, S3 SlowDown and short bodies are
 *  retried with backoff, within bounds; errors name the URL, the byte range,
 *  the HTTP status and the server's message. Remote files take no O_DIRECT
 *  and no GDS: device destinations go through the staged path. Knobs (read at
 *  each open, checked by ferry_ctx_create):
 *   FERRY_REMOTE_REQUEST_SIZE   bytes per range request (8M; 4K to 4G)
 *   FERRY_REMOTE_CONNECTIONS    requests in flight in the process (64)
 *   FERRY_REMOTE_RETRIES        retries of one request (10)
 *   FERRY_REMOTE_RETRY_SECONDS  time after which a read retries no more (60)
 *   FERRY_REMOTE_STALL_SECONDS  a request that moves under 1 KiB/s this long
 *                               is ended and retried (30; the connect timeout
 *                               is this, at most 10) */
int ferry_file_open(ferry_ctx *ctx, const char *path, int flags, ferry_file **out);
/** Close (waits for nothing: do not close a file a running job uses). NULL: no-op. */
int ferry_file_close(ferry_file *f);
/** Current size in bytes (fstat), or a negative code. A remote object: its
 *  size when opened (the version every read is pinned to). */
int64_t ferry_file_size(ferry_file *f);
/** The path given to ferry_file_open; valid until ferry_file_close. */
const char *ferry_file_path(const ferry_file *f);
/** fsync the file. */
int ferry_file_sync(ferry_file *f);
/** Set the file's length (ftruncate). */
int ferry_file_truncate(ferry_file *f, uint64_t size);
/** Bytes of [offset, offset+len) resident in the page cache (cachestat or
 *  mincore); 0 for a remote object. */
int64_t ferry_file_cached(ferry_file *f, uint64_t offset, uint64_t len);

/* flags for ferry_pread / ferry_pwrite / ferry_submit */
enum {
    FERRY_SYNC = 1u << 0,      /* writes: fsync every written file before completing */
    FERRY_NO_DIRECT = 1u << 1, /* never use O_DIRECT for this request */
    /* reads that will be made again (a dataset's next epoch): under the O_DIRECT
     * policy AUTO and the path AUTO they go through the page cache — no
     * O_DIRECT, no GDS — so that the next epoch finds them in memory, as long
     * as the files such jobs read fit in half the machine's memory (each
     * file's size counted once per context). A data set larger than that would
     * evict itself before it comes round again; from then on the context's
     * REREAD jobs read as any other. ferry_npy_batch_submit takes it too. */
    FERRY_REREAD = 1u << 4
};

/** Read len bytes at offset into dst (dst.size >= len). Blocks until the data
 *  is in dst (for device memory: the copies have completed). Returns bytes
 *  read, fewer than len only when the file ends first (like pread). */
int64_t ferry_pread(ferry_file *f, ferry_buf dst, uint64_t offset, size_t len, unsigned flags);
/** Write len bytes of src at offset. Returns len or a negative code. */
int64_t ferry_pwrite(ferry_file *f, ferry_buf src, uint64_t offset, size_t len, unsigned flags);

/* ------------------------------------------------------------------------- */
/* Plans                                                                      */
/* ------------------------------------------------------------------------- */
#define FERRY_MAX_DIMS 16
#define FERRY_MAX_CODECS 6

/** Decoding steps applied, in order, to the bytes read for one extent. */
typedef enum ferry_codec_id {
    FERRY_CODEC_NONE = 0,
    FERRY_CODEC_ZLIB = 1,       /* zlib stream (RFC 1950)                       */
    FERRY_CODEC_GZIP = 2,       /* gzip member(s) (RFC 1952)                    */
    FERRY_CODEC_ZSTD = 3,       /* zstd frame(s)                                */
    FERRY_CODEC_LZ4 = 4,        /* numcodecs LZ4: u32 LE size + LZ4 block       */
    FERRY_CODEC_BLOSC = 5,      /* blosc v1 frame (any inner codec it names)    */
    FERRY_CODEC_SHUFFLE = 6,    /* byte unshuffle, param = element size         */
    FERRY_CODEC_CRC32C = 7,     /* strip and verify a trailing u32 LE CRC32C    */
    FERRY_CODEC_FLETCHER32 = 8, /* strip and verify HDF5's trailing fletcher32  */
    FERRY_CODEC_BYTESWAP = 9,   /* reverse each param-byte element (1,2,4,8,16) */
    FERRY_CODEC_H5LZ4 = 10,     /* HDF5's lz4 filter (32004): u64 BE size, u32 BE
                                   block size, then u32 BE-sized LZ4 blocks      */
    FERRY_CODEC_BITSHUFFLE = 11 /* HDF5's bitshuffle filter (32008); param: the
                                   element size | compression << 24 (0 none,
                                   2 lz4, 3 zstd: the filter's cd_values[4])     */
} ferry_codec_id;

/** "none", "zlib", "gzip", "zstd", "lz4", "blosc", "shuffle", "crc32c",
 *  "fletcher32", "byteswap"; "unknown" for an id out of range. */
const char *ferry_codec_name(ferry_codec_id id);
/** Parse a codec name (also "deflate" for zlib); FERRY_EINVAL if unknown. */
int ferry_codec_parse(const char *name, ferry_codec_id *out);

typedef struct ferry_codec {
    uint32_t id;      /* ferry_codec_id */
    uint32_t param;   /* element size for SHUFFLE / BYTESWAP; else 0 */
} ferry_codec;

/** The codec of an HDF5 filter (as the HDF5 parser and the Python package's
 *  netCDF-4 chunk tables use it): deflate (1) zlib, shuffle (2) shuffle with the
 *  element size in cd_values[0] (else itemsize), fletcher32 (3), blosc (32001),
 *  zstd (32015). FERRY_EUNSUPPORTED, naming the filter id, for any other. */
int ferry_codec_of_hdf5_filter(uint32_t filter_id, const uint32_t *cd_values, size_t ncd, uint32_t itemsize,
                               ferry_codec *out);

/** A strided placement: copy an N-d box out of the decoded bytes into dst.
 *  Element (i0..in-1) of the box comes from
 *      decoded + src_offset + sum(i_k * src_stride[k])
 *  and goes to
 *      dst.ptr + dst_offset + sum(i_k * dst_stride[k]).
 *  Strides are in bytes; each copied element is `itemsize` bytes. */
typedef struct ferry_place {
    int ndim;
    uint32_t itemsize;
    uint64_t count[FERRY_MAX_DIMS];
    int64_t src_stride[FERRY_MAX_DIMS];
    int64_t dst_stride[FERRY_MAX_DIMS];
    uint64_t src_offset;
} ferry_place;

typedef enum ferry_extent_kind {
    FERRY_EXTENT_READ = 0,   /* file -> (decode) -> dst                    */
    FERRY_EXTENT_FILL = 1,   /* repeat `fill` (itemsize bytes) into dst     */
    FERRY_EXTENT_WRITE = 2   /* src (= dst field) -> file, no codecs        */
} ferry_extent_kind;

typedef struct ferry_extent {
    ferry_extent_kind kind;
    ferry_file *file;        /* READ / WRITE: an open file, or NULL and ... */
    const char *path;        /* ... a path the engine opens read-only for the job
                                (through its open-file cache; for stores of many
                                chunk files). ferry_plan_add copies the string. */
    uint64_t offset;         /* byte offset in the file */
    uint64_t length;         /* bytes in the file (encoded length for READ) */
    int ncodecs;
    ferry_codec codecs[FERRY_MAX_CODECS];
    uint64_t decoded_size;   /* bytes after decoding; = length when ncodecs == 0 */
    ferry_buf dst;           /* destination (READ/FILL) or source (WRITE) memory */
    uint64_t dst_offset;     /* byte offset into dst */
    const ferry_place *place;/* NULL: decoded bytes go contiguously to dst+dst_offset */
    uint8_t fill[16];        /* FILL: the element value, `place->itemsize` bytes
                                repeated over the placement's box; without a
                                placement, fill[0] repeated over `length` bytes
                                at dst_offset                                    */
    const char *label;       /* optional: variable name used in error messages  */
    unsigned flags;          /* FERRY_EXTENT_* below                             */
    const char *root;        /* FERRY_EXTENT_NOFOLLOW: the directory a symlinked file
                                must resolve under (see below); ferry_plan_add copies it */
    uint64_t file_size;      /* READ by path: nonzero, the file must hold exactly this
                                many bytes, else the read fails with FERRY_EFORMAT
                                naming the file (an uncompressed Zarr chunk read
                                without a stat at plan time); 0: not checked     */
} ferry_extent;

enum {
    /* READ by path with a placement: a file that does not exist is not an
     * error; the placement's box is filled with `fill` (place->itemsize <= 16)
     * instead. Zarr's absent chunks: no stat per chunk while the plan is built. */
    FERRY_EXTENT_MISSING_FILLS = 1u << 0,
    /* READ by path: the engine opens the file with O_NOFOLLOW and reads it
     * only if it is a regular file (a FIFO or device fails at once with
     * FERRY_EINVAL, it never blocks). When the file itself is a symlink it is
     * followed only if `root` is set (an absolute path without symlinks, as
     * realpath(3) gives) and the link resolves under root; otherwise the read
     * fails with -EACCES ("outside the store") or, root NULL, -ELOOP, naming
     * the file. A dangling link counts as absent (MISSING_FILLS fills it).
     * The directories on the way are the planner's to check: Zarr resolves
     * each once per plan, so its chunk files need no stat at plan time. */
    FERRY_EXTENT_NOFOLLOW = 1u << 1
};

typedef struct ferry_plan ferry_plan;

int ferry_plan_create(ferry_plan **out);
void ferry_plan_destroy(ferry_plan *plan);
/** Append a copy of *e (and of *e->place); the caller may reuse both. */
int ferry_plan_add(ferry_plan *plan, const ferry_extent *e);
/** Convenience: append a plain read of len bytes at offset into dst+dst_offset. */
int ferry_plan_read(ferry_plan *plan, ferry_file *f, uint64_t offset, uint64_t len,
                    ferry_buf dst, uint64_t dst_offset);
/** Convenience: append a plain write of len bytes from src+src_offset at offset. */
int ferry_plan_write(ferry_plan *plan, ferry_file *f, uint64_t offset, uint64_t len,
                     ferry_buf src, uint64_t src_offset);
size_t ferry_plan_count(const ferry_plan *plan);
/** Total bytes the plan reads from or writes to files. */
uint64_t ferry_plan_file_bytes(const ferry_plan *plan);
/** Remove all extents (keep the allocation), and the streams of ferry_plan_wait_stream. */
void ferry_plan_clear(ferry_plan *plan);

#define FERRY_MAX_WAIT_STREAMS 8
/** Make every job submitted from this plan wait for a caller's CUDA stream
 *  before it touches any of the plan's memory: a read does not write into a
 *  buffer the stream still uses, a write does not read a buffer before the
 *  stream has produced it (device memory, or pinned host memory a
 *  device-to-host copy on the stream fills).
 *  - What is waited for: the work queued on `stream` before ferry_submit.
 *    ferry_submit records an event on the stream (on the calling thread, in
 *    the stream's context); work queued after it returns is not waited for.
 *    Each submit of the plan records a new event.
 *  - How: the job's worker threads wait for the event (cuEventSynchronize)
 *    before the job's first task; ferry_submit itself does not wait (a job
 *    with streams to wait for never runs on the caller's thread), nor does
 *    any other job. ferry_job_cancel does not cut the wait short.
 *  - stream: a CUstream; NULL or CU_STREAM_LEGACY (0x1): the legacy default
 *    stream; CU_STREAM_PER_THREAD (0x2): the submitting thread's per-thread
 *    default stream. `device` is the device whose primary context a default
 *    stream is taken in; -1: the context current on the submitting thread,
 *    else that of the device of the plan's first device buffer. A stream of
 *    its own is taken in its own context (cuStreamGetCtx), whatever `device`.
 *  - Lifetimes: the stream need only live until ferry_submit returns; its
 *    context until the job completes.
 *  - At most FERRY_MAX_WAIT_STREAMS distinct (device, stream) pairs per plan
 *    (FERRY_EINVAL beyond; the same pair again is one). ferry_submit fails
 *    with FERRY_ENOCUDA without a CUDA driver and FERRY_EINVAL / FERRY_ECUDA
 *    when the event cannot be recorded (not a stream, no context). */
int ferry_plan_wait_stream(ferry_plan *plan, int device, void *stream);

/* ------------------------------------------------------------------------- */
/* Running plans                                                              */
/* ------------------------------------------------------------------------- */
typedef struct ferry_job ferry_job;

typedef struct ferry_run_opts {
    ferry_path path;   /* FERRY_PATH_AUTO: the context's path */
    int threads;       /* 0: the context's; else at most this many workers */
    unsigned flags;    /* FERRY_SYNC, FERRY_NO_DIRECT, FERRY_REREAD; any other bit: FERRY_EINVAL */
    int decode;        /* ferry_decode_policy; FERRY_DECODE_AUTO: the context's policy */
} ferry_run_opts;

/** Start running plan; returns at once. The plan is copied: it may be
 *  destroyed after this returns. Memory it names must live until the job
 *  completes. Device data is complete, and ordered before any work later
 *  enqueued on a stream made to wait with ferry_job_stream_wait. opts may be NULL. */
int ferry_submit(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts, ferry_job **out);
/** Run plan and wait: ferry_submit + ferry_job_wait + ferry_job_destroy.
 *  Returns the bytes moved to or from files, or a negative code. */
int64_t ferry_run(ferry_ctx *ctx, const ferry_plan *plan, const ferry_run_opts *opts);
/** The decoded bytes one job should hold when plans like `plan` are run one
 *  job after another (a dataset's batches, each read while the one before is
 *  consumed), so that the decoders keep their rate: 0 when any size does —
 *  nothing in it would be decoded on the GPU under `decode` (a
 *  ferry_decode_policy; FERRY_DECODE_AUTO: the context's), or only by codecs
 *  that run at their rate in a job of a few chunks. nvCOMP's deflate and zstd
 *  do not (deflate decodes one chunk per thread block, so only thousands of
 *  chunks at once fill the GPU; zstd's jobs of a few hundred chunks ran at
 *  0.6-0.7 of its rate; docs/decoding.md): a caller
 *  merges that many bytes' worth of such plans into one and keeps two such
 *  jobs in the engine at once (a third waits to be submitted: they would
 *  share the workers), besides the one being consumed. At most the share of
 *  the destination device's memory free at the call (a model may hold the
 *  rest) that leaves half of it free with those three jobs and their decode
 *  buffers (zstd: 1/26; deflate: 1/18).
 *  The plan is only inspected, not run. ferry_plan_budget
 *  (ferry_experimental.h) is the rule a dataset should ask instead: it counts
 *  every device byte the stream holds (destinations, call slots) against the
 *  free memory less what the caller keeps, and says how many jobs to keep
 *  in the engine. */
uint64_t ferry_plan_job_bytes(ferry_ctx *ctx, const ferry_plan *plan, int decode);

/** Wait up to timeout_ns (negative: forever). Returns bytes moved, or
 *  FERRY_ETIMEDOUT, or the job's error (its message via ferry_errmsg). */
int64_t ferry_job_wait(ferry_job *job, int64_t timeout_ns);
/** 1 when complete (successfully or not), 0 while running. */
int ferry_job_done(ferry_job *job);
/** Make CUDA stream `stream` (a CUstream; NULL: the legacy default stream)
 *  wait on the job's completion without blocking the host: enqueues a wait on
 *  an event recorded once all of the job's device work is enqueued. May block
 *  until the job's reads are issued (not until the copies finish). */
int ferry_job_stream_wait(ferry_job *job, void *stream);
/** Which path served the job's device/host extents (the last one used). */
ferry_path ferry_job_path(ferry_job *job);
/** Request cancellation; pending tasks are skipped and the job fails with FERRY_ECANCELED. */
void ferry_job_cancel(ferry_job *job);
/** Wait for completion, then free. NULL: no-op. */
void ferry_job_destroy(ferry_job *job);

/* ------------------------------------------------------------------------- */
/* Statistics: which path ran, how much, how long                            */
/* ------------------------------------------------------------------------- */
typedef struct ferry_path_stats {
    uint64_t bytes;     /* file bytes moved by this path */
    uint64_t ops;       /* extents (or tasks) served */
    double seconds;     /* wall time of jobs while they used this path */
} ferry_path_stats;

typedef struct ferry_stats {
    ferry_path_stats path[FERRY_PATH_COUNT_];   /* indexed by ferry_path; [0] unused */
    uint64_t direct_bytes;    /* read or written with O_DIRECT */
    uint64_t buffered_bytes;  /* read or written through the page cache */
    uint64_t decoded_bytes;   /* bytes produced by codecs */
    uint64_t fallbacks;       /* AUTO chose staged because cuFile could not run */
    uint64_t jobs;
    uint64_t gpu_decoded_bytes;   /* bytes produced by nvCOMP on the GPU */
    uint64_t gpu_chunks;          /* chunks decoded by nvCOMP */
    uint64_t gpu_batches;         /* batched nvCOMP calls */
    uint64_t gpu_cpu_fallbacks;   /* chunks bound for the GPU decoder that the CPU decoded */
    uint64_t image_gpu;           /* images decoded by nvJPEG (ferry_image_batch) */
    uint64_t image_cpu;           /* images decoded by the CPU threads (ferry_image_batch) */
    uint64_t image_skipped;       /* samples left out by ferry_image_batch's on_error SKIP */
    uint64_t image_fallbacks;     /* images bound for nvJPEG that the CPU decoded (any reason) */
} ferry_stats;

void ferry_stats_get(ferry_ctx *ctx, ferry_stats *out);
void ferry_stats_reset(ferry_ctx *ctx);

/* ------------------------------------------------------------------------- */
/* Formats: datasets, variables, selections                                  */
/* ------------------------------------------------------------------------- */
/* A dataset is an opened file or store of any supported format:
 *   "npy"          one array per file
 *   "safetensors"  a .safetensors file, or a *.safetensors.index.json of shards
 *   "netcdf3"      netCDF classic: CDF-1, CDF-2 (64-bit offset), CDF-5
 *   "zarr"         a Zarr v2 or v3 store directory (a group or one array)
 *   "hdf5"         netCDF-4 / HDF5 (superblock 0-3, after a user block too):
 *                  one group's datasets, contiguous, compact or chunked (every
 *                  chunk index: v1 B-tree, single chunk, implicit, fixed array,
 *                  extensible array, v2 B-tree; filters deflate, shuffle,
 *                  fletcher32, blosc, zstd, lz4, bitshuffle), netCDF-4
 *                  dimensions from dimension scales (phony ones otherwise),
 *                  soft links followed. codecs describes the filter pipeline
 *                  in decoding order with what a writer chose ("fletcher32
 *                  zlib(level=4) shuffle"). Variable-length strings are
 *                  FERRY_DT_STRING variables (ferry_dataset_read_strings).
 *                  Described but refused on read (ferry_var_info.error, ending
 *                  "(unsupported)" where the dataset is valid but uses what
 *                  ferry lacks): variable-length sequences, compound,
 *                  reference and array types,
 *                  other filters (named with their id), external and virtual
 *                  storage, null dataspaces. Every group's metadata is checked
 *                  at open (as netCDF-C reads it); an external link in the
 *                  group opened (or on the way to it) refuses the open, naming
 *                  the link and the other file.
 * Metadata is parsed once at open (only headers are read); reads become plans. */

typedef enum ferry_dtype {
    FERRY_DT_UNKNOWN = 0,
    FERRY_DT_BOOL, FERRY_DT_I8, FERRY_DT_U8, FERRY_DT_I16, FERRY_DT_U16,
    FERRY_DT_I32, FERRY_DT_U32, FERRY_DT_I64, FERRY_DT_U64,
    FERRY_DT_F16, FERRY_DT_BF16, FERRY_DT_F32, FERRY_DT_F64,
    FERRY_DT_C64, FERRY_DT_C128,
    FERRY_DT_F8_E4M3, FERRY_DT_F8_E5M2,
    FERRY_DT_F8_E4M3FNUZ, FERRY_DT_F8_E5M2FNUZ, FERRY_DT_F8_E8M0,   /* torch's float8 variants */
    FERRY_DT_F4_E2M1, FERRY_DT_F6_E2M3, FERRY_DT_F6_E3M2,   /* sub-byte (4 and 6 bits, packed):
                                  named for safetensors; a dataset exposes them as bytes */
    FERRY_DT_DATETIME64, FERRY_DT_TIMEDELTA64,
    FERRY_DT_CHAR,         /* netCDF char / numpy S1 */
    FERRY_DT_BYTES,        /* fixed-size bytes |Sn or void |Vn */
    FERRY_DT_OTHER,        /* any other fixed-size type; see typestr */
    FERRY_DT_STRING        /* variable-length UTF-8 text (HDF5 variable-length strings,
                              netCDF-4 "string"): typestr "|O"; no fixed-size element, so
                              ferry_dataset_read_strings reads it, not a plan */
} ferry_dtype;

/** Name styles for ferry_dtype_name. */
typedef enum ferry_name_style {
    FERRY_NAME_SHORT = 0,       /* "f4", "bf16", "f8e4m3", "M8" (ferry info, Dataset.variables()) */
    FERRY_NAME_LONG = 1,        /* "float32", "bfloat16", "float8_e4m3fn" (numpy / torch names) */
    FERRY_NAME_SAFETENSORS = 2, /* "F32", "BF16", "F8_E4M3"; NULL where safetensors has none */
    FERRY_NAME_TYPESTR = 3      /* what ferry_var_info.typestr holds for it, little-endian:
                                   numpy's "<f4", "|b1", "<M8"; the long name for a type
                                   numpy lacks ("bfloat16"); NULL for BYTES (sized) */
} ferry_name_style;

/** A static name of d in the given style ("other" for UNKNOWN/OTHER; NULL
 *  only for a safetensors name safetensors lacks, or BYTES' typestr). The
 *  enum's numbers may change before 1.0 (names do not): store names. */
const char *ferry_dtype_name(ferry_dtype d, ferry_name_style style);
/** Parse a name of any style ("f4", "float32", "F32", "<f4"); FERRY_EINVAL if unknown. */
int ferry_dtype_parse(const char *name, ferry_dtype *out);
/** Parse a name of one style only (a safetensors header's "F32", never "f4"). */
int ferry_dtype_parse_style(const char *name, ferry_name_style style, ferry_dtype *out);
/** Bytes per element, 0 where it varies (BYTES), is below a byte (F4, F6) or is unknown. */
uint32_t ferry_dtype_itemsize(ferry_dtype d);
/** Bits per element (4 for F4_E2M1, 6 for F6_*, 8·itemsize otherwise; 0: varies). */
uint32_t ferry_dtype_bits(ferry_dtype d);

typedef struct ferry_var_info {
    const char *name;              /* valid while the dataset is open */
    ferry_dtype dtype;
    const char *typestr;           /* numpy-style, as stored: "<f4", ">i2", "|b1",
                                      "<M8[ns]", "|S1"; "bfloat16", "float8_e4m3fn",
                                      "float8_e5m2" for types numpy lacks; for a type
                                      ferry cannot read, as written in the metadata
                                      (Zarr: "|O", "string", JSON of a structured or
                                      configured type) */
    uint32_t itemsize;             /* 1 when the type is unknown (see error); FERRY_DT_STRING:
                                      the size of one stored reference to a string */
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t chunks[FERRY_MAX_DIMS];  /* chunk (or record) shape; = shape if unchunked */
    int fortran_order;             /* data stored in F order (npy, zarr "F") */
    const char *dims_json;         /* JSON array of dimension names, or "null" */
    const char *attrs_json;        /* JSON object of attributes (see per-format notes) */
    const char *fill_json;         /* JSON fill value, or "null" */
    const char *codecs;            /* codec chain, e.g. "blosc(lz4,shuffle) crc32c", or "" */
    const char *path;              /* file holding the data (first one for stores) */
    uint64_t data_offset;          /* contiguous data: byte range in `path`, else 0,0 */
    uint64_t data_bytes;
    const char *error;             /* NULL, or why ferry cannot read this variable (a Zarr
                                      dtype, codec, chunk grid... it lacks), naming the file
                                      and byte position: the rest is described as far as the
                                      metadata goes, and every ferry_dataset_plan_read of it
                                      fails with FERRY_EUNSUPPORTED and this message */
} ferry_var_info;

typedef struct ferry_open_opts {
    const char *format;   /* NULL: detect from content and name */
    const char *group;    /* Zarr, HDF5: group path inside the store or file ("" = root,
                             "a/b" a child group) */
    int allow_outside;    /* kerchunk references ("refs"): also read files that lie outside
                             the reference set's directory (0: such a reference fails
                             naming the file; URLs are read either way) */
    const char *refs_json; /* kerchunk references given as JSON text (NUL-terminated, version 0
                             or 1), read instead of the file at path, which names where they
                             came from: a Parquet reference directory (kerchunk's
                             refs_to_dataframe) that the caller read (the Python package, with
                             pyarrow). Messages name path; relative targets resolve against
                             the directory holding it. The format is "refs" (another one asked
                             is FERRY_EINVAL). NULL: read path. Copied during the call */
} ferry_open_opts;

typedef struct ferry_dataset ferry_dataset;

/** Open and parse metadata. opts may be NULL. Errors name the file and byte position;
 *  FERRY_ENOFORMAT when the path is not a file or store of any supported format.
 *  path may be a URL (see ferry_file_open) of a single-file format: npy,
 *  safetensors, netCDF classic, a kerchunk reference set; Zarr stores are read
 *  from local paths only.
 *  Kerchunk reference sets (format "refs": JSON, version 0 or 1 with templates
 *  and gen entries) open as the Zarr v2 store they describe: every chunk is a
 *  (file, offset, length) the plan reads, or bytes inline in the JSON, decoded
 *  as any Zarr chunk (on the GPU too). Relative paths resolve against the
 *  JSON's directory, which local files must lie in unless opts->allow_outside;
 *  URLs are read remotely. A reference whose file is missing, lies outside, or
 *  ends before its offset + length fails the plan that needs it, naming the
 *  JSON, the key and the file. A Parquet reference directory is refused
 *  (FERRY_EUNSUPPORTED) unless opts->refs_json carries its references as JSON.
 *  A Hugging Face checkpoint directory by URL (objects are not listed):
 *  "URL/" opens URL/model.safetensors.index.json, else URL/model.safetensors;
 *  a URL naming no object (404), opened as safetensors or with no format, is
 *  tried as URL/ and then as URL.index.json. An index's shards are the
 *  objects beside it, each pinned to the version it had when opened (its
 *  ETag); a set whose shards carry another save's id ("ferry.save") than the
 *  index is -ESTALE: two saves are never mixed. */
int ferry_dataset_open(ferry_ctx *ctx, const char *path, const ferry_open_opts *opts, ferry_dataset **out);
/** Close and free. Plans made by ferry_dataset_plan_read may name the files
 *  the dataset keeps open (npy, safetensors, netcdf3, hdf5): close it only after
 *  every job running such a plan has completed. Every string the dataset
 *  returned (ferry_var_info's, the *_json ones) dies with it. NULL: no-op. */
void ferry_dataset_close(ferry_dataset *ds);
const char *ferry_dataset_format(const ferry_dataset *ds);   /* "npy", "safetensors", ... (static) */
/** The file or store opened: path as given, or what a directory (or a
 *  directory URL) resolved to -- a Hugging Face checkpoint directory opens
 *  its model.safetensors.index.json or model.safetensors. Valid while ds is. */
const char *ferry_dataset_path(const ferry_dataset *ds);
/** Byte offset of the HDF5 superblock signature "\x89HDF\r\n\x1a\n" (the
 *  container of netCDF-4) in the file at path: 0, or 512, 1024, 2048, ... after
 *  a user block. FERRY_ENOFORMAT when the file has none, -errno when it cannot
 *  be read. ferry_dataset_open reads such a file as format "hdf5". */
int64_t ferry_hdf5_signature(ferry_ctx *ctx, const char *path);
/** The format ferry_dataset_open would pick for path, by content and then by
 *  name: "npy", "safetensors", "netcdf3", "zarr", "hdf5" for a netCDF-4/HDF5
 *  file, or "refs" for a kerchunk reference set (JSON, version 0 or 1: the
 *  Zarr v2 store it describes, each chunk read from the file or URL it names;
 *  a name ending in .json that nothing else claims is given to it too).
 *  *format is a static string. FERRY_ENOFORMAT (naming the path) when it is
 *  none of them, -errno when it cannot be read. */
int ferry_format_detect(ferry_ctx *ctx, const char *path, const char **format);
/** JSON object of global attributes (netCDF global attributes, Zarr group
 *  attributes, safetensors __metadata__), "{}" if none. This and the two
 *  below are valid while the dataset is open. */
const char *ferry_dataset_attrs_json(const ferry_dataset *ds);
/** JSON object of dimensions: {"name": {"size": n, "unlimited": bool}}, "{}" if none. */
const char *ferry_dataset_dims_json(const ferry_dataset *ds);
/** JSON array of child group names (Zarr, HDF5), "[]" if none. */
const char *ferry_dataset_groups_json(const ferry_dataset *ds);
/** What ferry_dataset_open found about the store itself (all zeros for a
 *  format other than Zarr). */
typedef struct ferry_store_info {
    int zarr_format;     /* 2 or 3 for a Zarr store, else 0 */
    int consolidated;    /* 1: the node's members came from consolidated metadata
                            (v2: .zmetadata at the store root; v3: the group's
                            zarr.json "consolidated_metadata"), as zarr-python's
                            open_consolidated reads them; 0: from the members' own
                            documents, listed from the directory */
    int is_array;        /* 1: the opened node (the store root or group=) is itself an
                            array, the dataset's one variable; 0: a group */
} ferry_store_info;
/** Fill *out for ds (0), FERRY_EINVAL for NULL arguments. */
int ferry_dataset_store_info(const ferry_dataset *ds, ferry_store_info *out);
/** The fill value of variable `var` as the planner fills absent chunks with
 *  it: one element, itemsize bytes in host (little-endian) order, written to
 *  out (cap >= itemsize, else FERRY_EINVAL). Returns itemsize, or 0 when the
 *  variable has none (a Zarr fill_value of null or of a type ferry cannot read,
 *  a format without fill values: netCDF's _FillValue is an attribute); an
 *  array whose codecs ferry lacks still has its fill value. Zarr's
 *  "NaN", "Infinity", "0x..." bit patterns, base64 bytes and "NaT" are decoded
 *  here, once. */
int ferry_dataset_fill(const ferry_dataset *ds, int var, void *out, size_t cap);
int ferry_dataset_nvars(const ferry_dataset *ds);
int ferry_dataset_var(const ferry_dataset *ds, int index, ferry_var_info *out);
/** Index of the variable named `name`, or FERRY_ENOTFOUND. Constant time (a table built at
 *  open); safe to call from several threads on one open dataset. */
int ferry_dataset_find(const ferry_dataset *ds, const char *name);

/** One dimension of a selection: indices start, start+step, ... < stop. */
typedef struct ferry_slice { int64_t start, stop, step; } ferry_slice;

enum {
    FERRY_NATIVE = 1u << 0,    /* convert big-endian data to host order
                                  (on the GPU by a kernel for device memory) */
    FERRY_STORED_ORDER = 1u << 1, /* whole reads of F-order arrays: keep F order */
    FERRY_EXACT_RUNS = 1u << 2   /* ferry_plan_array: read at most 4 KiB the selection does not
                                    want per extent (see there) */
};

/** Append to `plan` the extents that read variable `var`, restricted to sel
 *  (ndim slices inside the shape: a start or stop past the end, a negative
 *  index or a step < 1 is FERRY_EINVAL naming the dimension; NULL:
 *  everything), into dst as a C-order array of the selection's shape
 *  (dst.size >= product × itemsize).
 *  Only the chunks / records / rows the selection touches are read; missing
 *  Zarr chunks become fills. Returns the number of bytes placed in dst.
 *  Lifetimes: dst must live until a job running the plan completes, and so
 *  must the dataset (the plan may name its open files; see ferry_dataset_close). */
int64_t ferry_dataset_plan_read(ferry_dataset *ds, int var, const ferry_slice *sel,
                                ferry_buf dst, unsigned flags, ferry_plan *plan);

/** Variable-length strings (FERRY_DT_STRING variables: HDF5 variable-length
 *  strings, netCDF-4's "string" type). Their elements have no fixed size to
 *  place in a caller's buffer, so ferry_dataset_plan_read refuses them
 *  (FERRY_EINVAL naming this call) and ferry_dataset_read_strings reads them
 *  at once, into memory it allocates:
 *    count    elements of the selection, in C order;
 *    offsets  count + 1 ascending byte offsets into data: element i is the
 *             bytes [offsets[i], offsets[i + 1]) (UTF-8 as stored; ASCII for
 *             files that say ASCII);
 *    data     every element's bytes back to back, offsets[count] of them,
 *             then a NUL (an element ends at its first NUL, as a C string
 *             does: netCDF-C and h5py read them so).
 *  An element written as "" or as a NULL pointer is "" (as netCDF4-python
 *  and h5py read it); elements never written read as the dataset's fill
 *  value (a string; "" where it has none). */
typedef struct ferry_strings {
    uint64_t count;
    uint64_t *offsets;
    char *data;
} ferry_strings;

/** The largest selection ferry_dataset_read_strings reads in one call: its
 *  text, and its count (each element's stored reference is read first). A
 *  larger one fails with FERRY_EINVAL saying so: read it in parts. */
#define FERRY_STRINGS_MAX_BYTES ((uint64_t)1 << 30)
#define FERRY_STRINGS_MAX_COUNT ((uint64_t)1 << 26)

/** Read sel (as ferry_dataset_plan_read: ndim slices, NULL: everything) of
 *  string variable `var` into *out (zeroed first; free it with
 *  ferry_strings_free, also after an error). The references are read by a
 *  plan run on ds's context (opts as ferry_run's; NULL: the context's), then
 *  each string from the file's global heap, every heap collection read once
 *  per call. Returns count, or a negative code: FERRY_EINVAL for a variable
 *  of another type or a selection past the FERRY_STRINGS_MAX_* bounds,
 *  FERRY_EFORMAT naming the file, byte and variable for a reference or heap
 *  that lies (outside the file, an object that is not there, a string longer
 *  than its object, collections that add up to more than the file). Safe from
 *  several threads on one open dataset. */
int64_t ferry_dataset_read_strings(ferry_dataset *ds, int var, const ferry_slice *sel, const ferry_run_opts *opts,
                                   ferry_strings *out);
/** Free what ferry_dataset_read_strings allocated and zero *s. NULL: no-op. */
void ferry_strings_free(ferry_strings *s);

/* ------------------------------------------------------------------------- */
/* Chunked layouts: the one planner for chunked arrays                       */
/* ------------------------------------------------------------------------- */
/* ferry_plan_layout plans a selection of any regularly chunked array from a
 * description of its layout and a table (or a callback) saying where each
 * chunk is stored. The Zarr and HDF5 parsers plan through it, and so does the
 * xarray backend for netCDF-4, whose chunk tables h5py reads. Only the chunks
 * the selection touches are visited:
 *   - a stored chunk is one READ extent: its encoded bytes, the layout's codec
 *     chain (less the codecs its `skip` mask drops), and a placement copying
 *     its part of the selection into dst; a chunk whose chain is element-wise
 *     only (none, or BYTESWAP) reads only the byte span the selection needs;
 *   - an absent chunk is a FILL extent of the fill value over its part.
 * A table that lies (offsets or lengths outside `file_size`, an uncompressed
 * chunk shorter than a chunk, origins off the grid, duplicates) gives
 * FERRY_EFORMAT naming the chunk; data that decodes to the wrong size fails
 * when the plan runs (FERRY_ECODEC). No extent ever reaches outside dst. */

/* ferry_chunk.length values that are not lengths */
#define FERRY_CHUNK_ABSENT UINT64_MAX         /* never written: the fill value */
#define FERRY_CHUNK_UNSIZED (UINT64_MAX - 1)  /* not looked at (a chunk file by path, element-wise
                                                 chain only): read the span the selection needs,
                                                 fill it if the file does not exist (no stat per
                                                 chunk while planning; elements of <= 16 bytes) */

/** Where one chunk is stored. */
typedef struct ferry_chunk {
    const char *path;    /* file holding it; NULL: the layout's `path`. A lookup
                            callback's string need only live until the next call
                            (the plan copies it) */
    uint64_t offset;     /* byte offset of the stored chunk in that file */
    uint64_t length;     /* stored (encoded) bytes, or FERRY_CHUNK_ABSENT / _UNSIZED */
    uint32_t skip;       /* bit i set: layout codecs[i] does not apply to this chunk (HDF5's
                            filter mask, renumbered in decoding order); 0 for most formats */
} ferry_chunk;

/** Look up chunk `idx` (ndim chunk-grid coordinates) into *out. Returns 0, or a
 *  negative code (with ferry's message set, e.g. through a failed ferry call)
 *  that ends the planning and is returned by ferry_plan_layout. */
typedef int (*ferry_chunk_fn)(void *arg, const uint64_t *idx, ferry_chunk *out);

typedef enum ferry_order {
    FERRY_ORDER_C = 0,   /* decoded chunk in C order (last axis fastest)        */
    FERRY_ORDER_F = 1,   /* Fortran order (first axis fastest)                  */
    FERRY_ORDER_PERM = 2 /* C order of the chunk transposed by perm: axis perm[0]
                            slowest ... perm[ndim-1] fastest (Zarr v3 transpose) */
} ferry_order;

typedef struct ferry_layout {
    int ndim;                          /* 0..FERRY_MAX_DIMS (0: a scalar, one chunk) */
    uint64_t shape[FERRY_MAX_DIMS];    /* array shape */
    uint64_t chunks[FERRY_MAX_DIMS];   /* chunk shape, each >= 1; edge chunks are stored full size */
    ferry_order order;
    int perm[FERRY_MAX_DIMS];          /* FERRY_ORDER_PERM only: a permutation of 0..ndim-1 */
    uint32_t itemsize;                 /* bytes per element, 1..2^20 */
    uint32_t swap;                     /* stored data is byte-reversed in groups of `swap` bytes
                                          (big-endian elements; complex: half the itemsize), else
                                          0. FERRY_NATIVE appends a BYTESWAP; without it the data
                                          stays as stored and the fill is swapped to match */
    int ncodecs;                       /* codec chain, in decoding order */
    ferry_codec codecs[FERRY_MAX_CODECS];
    uint8_t fill[16];                  /* fill element in host order (the first itemsize bytes);
                                          absent chunks of wider elements are filled with zeros */
    const char *path;                  /* the file of chunks whose `path` is NULL */
    uint64_t file_size;                /* its size when known: chunk offsets and lengths are
                                          checked against it; 0: not checked */
    const char *label;                 /* variable name for error messages (may be NULL) */
    /* The chunk table, either a table ... */
    const ferry_chunk *table;          /* ntable entries */
    const uint64_t *table_index;       /* each entry's C-order linear chunk-grid index, strictly
                                          ascending (ferry_layout_sort_table makes one); NULL:
                                          the table is dense, entry i is grid chunk i. A grid
                                          chunk not in the table is absent */
    size_t ntable;
    ferry_chunk_fn lookup;             /* ... or (table NULL) called for each chunk touched */
    void *lookup_arg;
    const char *root;                  /* non-NULL: every read by path gets FERRY_EXTENT_NOFOLLOW
                                          with this root (a store's chunk files); NULL: none */
} ferry_layout;

/** Append to `plan` the extents that read sel (ndim slices; NULL: everything;
 *  the same rules as ferry_dataset_plan_read: a stop past the end,
 *  a negative index or step < 1 is FERRY_EINVAL) of the array `layout`
 *  describes into dst as a C-order array of the selection's shape
 *  (FERRY_STORED_ORDER: a whole read of an F-order array stays F order).
 *  flags: FERRY_NATIVE, FERRY_STORED_ORDER. Returns the bytes placed in dst, or
 *  a negative code (extents appended before an error stay in the plan: clear
 *  it). layout, its table and the strings it names are only read during the
 *  call; dst must live until the plan has run. */
int64_t ferry_plan_layout(const ferry_layout *layout, const ferry_slice *sel, ferry_buf dst, unsigned flags,
                          ferry_plan *plan);

/** Build a sparse chunk table from entries keyed by chunk origin (element
 *  coordinates, ndim values per entry, as h5py's chunk_iter gives them): checks
 *  each origin lies on the grid of `layout` (a multiple of the chunk shape,
 *  inside the shape) and writes its linear grid index to index[i], then sorts
 *  table[] and index[] together (ascending) and refuses duplicates. Returns 0,
 *  or FERRY_EFORMAT naming the entry; then set layout->table = table,
 *  table_index = index, ntable = n. */
int ferry_layout_sort_table(const ferry_layout *layout, const uint64_t *origins, ferry_chunk *table,
                            uint64_t *index, size_t n);

/** Append to `plan` the extents that read sel (as ferry_plan_layout: ndim
 *  slices, NULL: everything, a stop past the end FERRY_EINVAL) of an array stored as
 *  is in the open file f, element (0, ..., 0) at byte `offset`: layout gives
 *  ndim, shape, itemsize, order (C or F) and label, and must have no codecs,
 *  swap, perm or chunk table (its chunks are ignored). dst receives a C-order
 *  array of the selection's shape. This is the box planner of every array
 *  stored contiguously (npy, safetensors, netCDF classic, HDF5 contiguous, DCP
 *  checkpoints), with one rule for what is read: dimensions contiguous both in
 *  the file and in dst merge into one run; runs under 256 KiB are grouped into
 *  one extent with a strided placement while the span read stays under
 *  64 KiB, or under 16 MiB with at least a quarter of it wanted; every other
 *  run is its own read. So a read is never more than 4 x the bytes it places,
 *  except for spans under 64 KiB. flags FERRY_EXACT_RUNS (DCP checkpoints,
 *  which many ranks read at once, where every byte read is I/O): a group may
 *  also hold at most 4 KiB (a page) of unwanted bytes, so a rank's reads sum to
 *  what it places plus at most 4 KiB per extent. FERRY_EFORMAT (naming the file
 *  and label) when the array passes the end of the file. Returns the bytes
 *  placed in dst. f and dst must live until a job running the plan completes;
 *  layout is only read during the call. */
int64_t ferry_plan_array(ferry_file *f, uint64_t offset, const ferry_layout *layout, const ferry_slice *sel,
                         ferry_buf dst, unsigned flags, ferry_plan *plan);

/* ------------------------------------------------------------------------- */
/* Testing seam: fault injection                                              */
/* ------------------------------------------------------------------------- */
/** Replace the system call `name` under ferry's file I/O and allocations —
 *  "open", "close", "pread", "preadv", "pwrite", "fsync", "fstat", "stat",
 *  "lstat" (a Zarr plan's chunk lookups), "ftruncate", "madvise", "mmap" (the mappings small
 *  records are copied from), "posix_fadvise" (the hints of cold records), "access" (whether
 *  nvidia-fs is loaded, which makes AUTO choose cuFile) — with fn, a function of libc's signature (open:
 *  int (*)(const char *, int, mode_t)); fn NULL restores libc's, name NULL
 *  restores all. Tests use it to make reads short, interrupted or failing
 *  (as SQLite's xSetSystemCall does). Process-wide and not synchronised: change
 *  it only while no job runs. Returns 0 or FERRY_EINVAL for an unknown name. */
int ferry_test_set_syscall(const char *name, void *fn);

/* ------------------------------------------------------------------------- */
/* Many .npy files, one sample each (DALI's and MONAI's layout)              */
/* ------------------------------------------------------------------------- */
/* n .npy files of one dtype and shape become one batch: file i's array goes
 * to dst + i * stride. The first file's header is parsed when the batch is
 * submitted; every file's header and data are then read in one job (by path,
 * through the context's open-file cache, opened by the workers in parallel;
 * into host memory each file's header and data are one preadv). When the job
 * is done every header is checked against the first: byte-identical headers
 * are the common case and cost a memcmp; any other header is parsed and must
 * give the same dtype, shape and order (its data is then re-read from its own
 * offset), else the batch fails with FERRY_EFORMAT naming that file, its dtype
 * and shape and the first file's. A header and the data after it are read
 * from one open file, so a file replaced meanwhile is read whole or not at all. */
typedef struct ferry_npy_info {
    ferry_dtype dtype;
    char typestr[64];             /* as stored, e.g. "<f4", ">i2", "|u1" */
    uint32_t itemsize;
    int ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    int fortran_order;
    uint64_t nbytes;              /* bytes of one file's array */
} ferry_npy_info;

typedef struct ferry_npy_batch ferry_npy_batch;

/** Start reading the n files paths[0..n-1] into dst (host or device memory):
 *  file i's array at byte i * stride of dst (stride 0: the array's size;
 *  otherwise at least it). flags: FERRY_NATIVE converts big-endian data to
 *  host order; FERRY_STORED_ORDER accepts Fortran-order files and copies them
 *  as stored (without it they are FERRY_EUNSUPPORTED); FERRY_REREAD is passed
 *  to the batch's job (a dataset's files, read again every epoch). info (may be NULL)
 *  receives the first file's dtype and shape. paths are copied; dst must live
 *  until ferry_npy_batch_wait returns. Errors of the first file, bad
 *  arguments and a dst too small are returned here. */
int ferry_npy_batch_submit(ferry_ctx *ctx, const char *const *paths, size_t n, ferry_buf dst, uint64_t stride,
                           unsigned flags, ferry_npy_info *info, ferry_npy_batch **out);
/** Wait for the batch and check every file's header (see above). Returns the
 *  data bytes placed (n * nbytes) or a negative code naming the file at fault.
 *  Device memory is complete when it returns (the copies were waited for).
 *  Call once; then destroy. */
int64_t ferry_npy_batch_wait(ferry_npy_batch *b);
/** Wait (if not yet waited for) and free. NULL: no-op. */
void ferry_npy_batch_destroy(ferry_npy_batch *b);
/** submit + wait + destroy. */
int64_t ferry_npy_read_many(ferry_ctx *ctx, const char *const *paths, size_t n, ferry_buf dst, uint64_t stride,
                            unsigned flags, ferry_npy_info *info);

/* ------------------------------------------------------------------------- */
/* Epoch orders, keyed permutations (src/formats/perm.c)                     */
/* ------------------------------------------------------------------------- */
/** A permutation of [0, n) keyed by (seed, epoch), evaluated per position in
 *  O(1) memory (a Feistel network cycle-walked into [0, n)): the order in
 *  which ferry.torch's TokenDataset visits its windows, the same permutation
 *  as python/ferry/_torch_order.py's FeistelOrder. shuffle = 0: the identity.
 *  Plain data: fill with ferry_perm_init, share between threads freely. */
#define FERRY_PERM_ROUNDS 4
typedef struct ferry_perm {
    uint64_t n;
    unsigned half;                    /* the domain is 4^half >= n */
    int shuffle;
    uint64_t key[FERRY_PERM_ROUNDS], mul[FERRY_PERM_ROUNDS];
} ferry_perm;
/** 0, or FERRY_EINVAL (o NULL, n > INT64_MAX). */
int ferry_perm_init(ferry_perm *o, uint64_t n, int64_t seed, int64_t epoch, int shuffle);
/** ids[i] = the permutation at position pos[i], for i < count. Returns count,
 *  or FERRY_EINVAL (a position outside [0, n): nothing written). */
int64_t ferry_perm_take(const ferry_perm *o, const int64_t *pos, size_t count, int64_t *ids);

/* ------------------------------------------------------------------------- */
/* Per-format notes                                                           */
/* ------------------------------------------------------------------------- */
/* attrs_json
 *   netcdf3: {"name": {"type": "<typestr>", "value": [numbers]} } for numeric
 *            attributes (NaN/Infinity written as the strings "NaN", "Infinity",
 *            "-Infinity"), {"name": "text"} for char attributes.
 *   hdf5:    as netcdf3 for numbers (with the stored byte order in "type") and
 *            text (fixed or variable-length strings; several as a JSON array);
 *            null for values of other types or shapes ferry cannot express. The netCDF-4 and dimension-scale
 *            bookkeeping (DIMENSION_LIST, _Netcdf4Dimid, _Netcdf4Coordinates,
 *            _NCProperties, _nc3_strict; on dimension scales also CLASS, NAME,
 *            REFERENCE_LIST) is left out. Types: numpy's bool and complex as
 *            h5py stores them ("|b1", "<c8"), enumerations as their integers. Variables list in creation order where the file
 *            records it, else by name. dims_json: each axis's dimension scale,
 *            else "phony_dim_<n>" (one per distinct length, as netCDF-C names
 *            them); a variable along an unlimited dimension is as long as the
 *            dimension, the rest read as its fill value. fill_json is the
 *            _FillValue attribute; ferry_dataset_fill gives HDF5's fill value
 *            (what unwritten chunks read as; none for FERRY_DT_STRING, whose
 *            fill is itself a string that ferry_dataset_read_strings gives for
 *            unwritten elements). codecs: decoding order.
 *   zarr:    the attributes exactly as stored (.zattrs / zarr.json "attributes").
 *   safetensors: {} per tensor; the file's __metadata__ as dataset attrs.
 *   npy:     {}.
 */

FERRY_API_END

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
