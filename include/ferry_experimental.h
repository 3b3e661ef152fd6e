/*
 * ferry_experimental.h — the tier of ferry's C API that may still change.
 *
 * Everything here is exported and documented like ferry.h, under the same
 * rules (return codes, per-thread messages, lifetimes), but its names and
 * structs may change between minor versions while the features settle: the
 * device memory budget of a stream of jobs, image shards and image decoders.
 * Include it after (or instead of) ferry.h; ferry.h does not include it.
 * `make test-c` checks `nm -D` against both headers.
 */
#ifndef FERRY_EXPERIMENTAL_H
#define FERRY_EXPERIMENTAL_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif
FERRY_API_BEGIN

/* ------------------------------------------------------------------------- */
/* Device memory budget of a stream of jobs                                   */
/* ------------------------------------------------------------------------- */
/** What a stream of jobs (a dataset's groups of batches, each read while the
 *  one before is consumed) may hold on its device: ferry_plan_budget. */
typedef struct ferry_budget {
    uint64_t units;            /* whole units (the caller's unit_bytes) one job holds, >= 1 */
    uint64_t job_bytes;        /* units x unit_bytes: the decoded bytes of one job */
    int jobs;                  /* jobs to keep in the engine at once, besides the one being
                                  consumed: 2, or 1 where two do not fit; 0 where nothing is
                                  decoded on the GPU (any number: only the destinations count) */
    uint64_t job_device_bytes; /* device memory ferry's decode of one such job holds at most
                                  (compressed inputs, nvCOMP's temp space, call arrays) */
    uint64_t device_bytes;     /* all the stream holds at most: jobs + 2 destinations (the jobs in
                                  the engine, the one consumed, the next one allocated while it
                                  waits for room) and jobs x job_device_bytes */
    uint64_t free_bytes;       /* the device's free memory at the call, after ferry gave back
                                  its idle decode buffers there (0: the driver cannot say) */
    uint64_t keep_free;        /* what the budget leaves free (keep_free, or its default) */
} ferry_budget;

/** keep_free value asking for the default: a quarter of the free memory, 64 MiB at least. */
#define FERRY_KEEP_FREE_DEFAULT UINT64_MAX

/** The size of each job and how many to keep in the engine when plans like
 *  `like` are run as a stream of jobs, one rule for every dataset.
 *  `like`: a plan like the caller's jobs (one unit is enough), only inspected
 *  for what its chunks are decoded by under `decode` (a ferry_decode_policy;
 *  FERRY_DECODE_AUTO: the context's), their device and their largest chunk;
 *  its addresses need not be real. `unit_bytes`: the destination bytes of one
 *  unit a job holds a whole number of (a batch). `keep_free`: device bytes the
 *  stream leaves free at all times for the caller's own use (a model's next
 *  allocations), FERRY_KEEP_FREE_DEFAULT for the default.
 *
 *  Chunks nvCOMP's deflate and zstd decode (ferry_plan_job_bytes says why)
 *  ask for jobs of 2.5 GiB of their bytes, two in the engine. Each job in the
 *  engine holds its destination and ferry's decode memory (job_device_bytes:
 *  the call slots its calls take, each call's compressed input and nvCOMP's
 *  temp space, dev_per_byte times the call's decoded bytes, plus rounding);
 *  the caller holds two more destinations. The job is the most units
 *  (at most the 2.5 GiB) for which all of it, device_bytes, fits in the free
 *  memory less keep_free with two jobs in the engine; where even one unit
 *  does not fit two, one job; where one does not fit either, FERRY_ENOMEM
 *  with a message naming the device, what one job of one unit needs, what
 *  is free, and how to lower it. The context's idle decode buffers on the
 *  device (call slots of earlier jobs) are given back first, and the context
 *  remembers keep_free for the device: from then on a job that ends gives
 *  its idle decode buffers there back whenever the free memory is below it,
 *  so that the caller's next allocation finds them free.
 *  Nothing decoded on the GPU (host destinations, CPU codecs, the CPU policy,
 *  no nvCOMP): units 1 and jobs 0. Returns 0 or a negative ferry_status. */
int ferry_plan_budget(ferry_ctx *ctx, const ferry_plan *like, int decode, uint64_t unit_bytes, uint64_t keep_free,
                      ferry_budget *out);

/* ------------------------------------------------------------------------- */
/* Sample shards: WebDataset tar, Mosaic MDS, folders of files               */
/* ------------------------------------------------------------------------- */
/* A shard set is an index, built once at open from headers only, of every
 * sample of a list of shards: per sample its key and members, per member
 * (a tar member's extension, an MDS column, a file's extension) the file, byte
 * offset and size of its bytes. Samples are then read in any order.
 *
 *  "tar"     WebDataset tar files (ustar, GNU long names, pax path/size
 *            records; GNU sparse members are refused). Members are grouped as
 *            webdataset groups them: consecutive members with one key, the key
 *            being the path up to the first dot of its basename, the member's
 *            name the rest, lowercased ("a/b.seg.png": key "a/b", "seg.png").
 *            Only regular files count; names without a dot in the basename and
 *            __meta__ names are skipped. Every header's checksum is verified,
 *            every member must lie inside the file, and the archive must end
 *            with its end-of-archive block.
 *  "mds"     a Mosaic streaming directory (index.json + shard.NNNNN.mds, or
 *            .mds.zstd when written with compression="zstd"): members are the
 *            columns, named as in index.json, their encodings given by
 *            ferry_member_info.encoding ("jpeg", "png", "int", "str", ...;
 *            ferry decodes none of them but the images).
 *  "folder"  torchvision's ImageFolder layout: one sub-folder per class, sorted
 *            by name (class i = the i-th name), image files in each (extensions
 *            as torchvision's IMG_EXTENSIONS, case-insensitive), sorted, searched
 *            recursively; each file is one sample with one member named by its
 *            lowercased extension and the class index as label.
 *  "files"   a flat list of files: each is a sample, keyed by its path less the
 *            extension, one member named by the extension.
 */
typedef struct ferry_shards ferry_shards;

/** Open `n` paths as one shard set of `format` ("tar", "mds", "folder",
 *  "files"; NULL: detected — a directory holding index.json is "mds", any
 *  other directory "folder", files ending in .tar "tar", other files "files").
 *  A path with *, ? or [ is a glob(3) pattern, expanded in sorted order (no
 *  match: -ENOENT). "mds" and "folder" take one directory each; paths of
 *  several MDS directories append their samples in order. Errors name the
 *  shard, the member and the byte: FERRY_EFORMAT for a damaged shard,
 *  FERRY_EUNSUPPORTED for what ferry does not read (sparse tar members, MDS
 *  compression other than zstd), -errno from the file system. *out is NULL on
 *  failure. Paths may be URLs (s3://, gs://, https://; the context's remote
 *  options): an s3:// or gs:// glob is expanded by listing the bucket
 *  (ferry_url_glob), a folder is the listing of its prefix, and the format is
 *  told without stat (".tar": tar; a last part without a dot or a final '/':
 *  "mds" when it holds index.json, else "folder"; other URLs: "files"). A set
 *  holds no local file open; a tar or MDS shard at a URL stays open in the set
 *  (64 KiB each) so that every read of it is pinned to the version indexed (a
 *  shard replaced since is an error naming it). It is read-only once open, so
 *  threads may share it (reads of compressed MDS shards take a lock). */
int ferry_shards_open(ferry_ctx *ctx, const char *const *paths, size_t n, const char *format, ferry_shards **out);
/** Free the set and every string it returned. NULL: no-op. */
void ferry_shards_close(ferry_shards *s);
/** "tar", "mds", "folder" or "files" (static). */
const char *ferry_shards_format(const ferry_shards *s);
/** Number of samples. */
int64_t ferry_shards_count(const ferry_shards *s);
/** Number of shard files (tar files, MDS shards, or image files). */
int64_t ferry_shards_nfiles(const ferry_shards *s);
/** Classes of a "folder" set (0 for the other formats) and the name of class i
 *  (NULL when out of range); valid while the set is open. */
int ferry_shards_nclasses(const ferry_shards *s);
const char *ferry_shards_class(const ferry_shards *s, int i);

typedef struct ferry_sample_info {
    const char *key;       /* valid while the set is open */
    int nmembers;
    int label;             /* "folder": the class index; else -1 */
} ferry_sample_info;
/** Describe sample i (0 <= i < count; FERRY_EINVAL otherwise). */
int ferry_shards_sample(const ferry_shards *s, int64_t i, ferry_sample_info *out);

typedef struct ferry_member_info {
    const char *name;      /* extension or column name, valid while the set is open */
    const char *encoding;  /* MDS: the column's encoding ("jpeg", "int", ...); else NULL */
    const char *path;      /* the file holding its bytes */
    uint64_t offset;       /* byte offset in that file (compressed: in the decoded shard) */
    uint64_t size;         /* bytes */
    int compressed;        /* 1: in a zstd-compressed MDS shard; ferry_shards_plan_member refuses it */
} ferry_member_info;
/** Describe member m of sample i (FERRY_EINVAL when out of range). */
int ferry_shards_member(const ferry_shards *s, int64_t i, int m, ferry_member_info *out);
/** Index of sample i's member called `name` (an extension or column), or
 *  FERRY_ENOTFOUND naming the sample. Case-sensitive; tar names are lowercased. */
int ferry_shards_find(const ferry_shards *s, int64_t i, const char *name);
/** Append to `plan` one READ extent of member m of sample i into dst at
 *  dst_offset (by path: the engine's open-file cache opens it; a shard at a
 *  URL by the set's own handle, pinned to the version indexed). Returns the
 *  member's size. FERRY_EUNSUPPORTED for a member of a compressed MDS shard
 *  (use ferry_shards_read), FERRY_EINVAL when dst is too small. The set may be
 *  closed once the plan has been built, unless it is over URLs (then it must
 *  outlive the plan's run). */
int64_t ferry_shards_plan_member(const ferry_shards *s, int64_t i, int m, ferry_buf dst, uint64_t dst_offset,
                                 ferry_plan *plan);
/** Read member m of sample i into host memory dst (cap bytes at least its
 *  size, else FERRY_EINVAL). Returns its size. A file that changed since the
 *  set was opened (shorter now) is FERRY_ESHORT naming the shard, the member
 *  and the byte. */
int64_t ferry_shards_read(ferry_shards *s, int64_t i, int m, void *dst, size_t cap);

/* ------------------------------------------------------------------------- */
/* Image decoders (JPEG through libjpeg-turbo, PNG through libspng)          */
/* ------------------------------------------------------------------------- */
/* Images decode to HWC uint8 arrays: 3 channels (RGB), or 1 for gray images
 * when asked (FERRY_IMAGE_KEEP_GRAY); 16-bit PNGs are reduced to 8 bits,
 * alpha is dropped (composited on nothing: the color channels as stored),
 * palettes expanded, CMYK JPEGs converted to RGB. Corrupt data is an error,
 * never a partial image: libjpeg-turbo's warnings about corrupt data count as
 * errors. A build without libturbojpeg / libspng refuses that format with
 * FERRY_EUNSUPPORTED at run time. */
typedef enum ferry_image_format {
    FERRY_IMAGE_UNKNOWN = 0,
    FERRY_IMAGE_JPEG = 1,
    FERRY_IMAGE_PNG = 2
} ferry_image_format;

typedef struct ferry_image_info {
    ferry_image_format format;
    uint32_t width, height;
    int channels;          /* stored channels: 1 gray, 2 gray+alpha, 3 color, 4 RGBA or CMYK */
    int subsampling;       /* JPEG chroma subsampling as "4:N:M" digits: 444, 422, 420, 440, 411,
                              441; 400 for gray; 0 for PNG or unknown */
    int progressive;       /* JPEG: 1 progressive, 0 baseline/extended; PNG: 1 interlaced (Adam7) */
    int bit_depth;         /* bits per sample as stored (8, or PNG's 1..16) */
    int cmyk;              /* JPEG stored as CMYK or YCCK */
} ferry_image_info;

enum {
    FERRY_IMAGE_KEEP_GRAY = 1u << 0    /* gray images decode to 1 channel, not 3 */
};

/** The format of data by its signature (JPEG: FF D8 FF; PNG: the 8-byte signature). */
ferry_image_format ferry_image_sniff(const void *data, size_t n);
/** Read the header of an encoded image without decoding its pixels.
 *  FERRY_ECODEC for a corrupt header, FERRY_EUNSUPPORTED for an unknown format
 *  or a decoder this build lacks. */
int ferry_image_probe(const void *data, size_t n, ferry_image_info *out);
/** The channels an image decodes to under `flags` (1 or 3). */
int ferry_image_out_channels(const ferry_image_info *info, unsigned flags);
/** Decode into dst (height x width x channels bytes, C order; cap at least
 *  that, else FERRY_EINVAL). info (may be NULL) receives the header. Returns
 *  the bytes written. Thread-safe (each thread keeps its own decoder). */
int64_t ferry_image_decode(const void *data, size_t n, void *dst, size_t cap, unsigned flags, ferry_image_info *info);

/** One image of a batch: the encoded bytes in, the pixels out. */
typedef struct ferry_image_job {
    const void *data;      /* encoded bytes */
    size_t size;
    void *dst;             /* host memory for the pixels */
    size_t cap;            /* bytes at dst */
    const char *label;     /* named in the error message (a sample key and member); may be NULL */
    ferry_image_info info; /* out: the header */
    int64_t result;        /* out: bytes written, or a negative code */
} ferry_image_job;
/** Decode jobs[0..n) on `threads` threads (the caller's and threads-1 started
 *  for the call; 0: one per CPU, at most 16). Every job gets its result; the
 *  call returns n when all succeeded, else the first failing job's code, with
 *  the message of that job (naming its label) as the thread's message. */
int64_t ferry_image_decode_batch(ferry_image_job *jobs, size_t n, unsigned flags, int threads);

/** Decode one JPEG on CUDA device `device` with nvJPEG (libnvjpeg.so.13 or
 *  .so.12, loaded at run time; FERRY_NVJPEG names the file, or "off") into
 *  device memory dst: height x width x 3 bytes of RGB (gray images
 *  replicated), cap at least that, else FERRY_EINVAL. The pixels are written
 *  on `stream` (a CUstream; NULL: the legacy default stream): work queued on
 *  it after this call sees them; data may be freed when the call returns.
 *  The header is read on the CPU first (info, may be NULL, receives it; this
 *  needs libturbojpeg), and an image without its end-of-image marker is
 *  refused (FERRY_ECODEC) before nvJPEG sees it: nvJPEG checks damaged data
 *  less strictly than ferry_image_decode. FERRY_EUNSUPPORTED for PNG, CMYK
 *  JPEGs and when nvJPEG cannot be loaded (the message says why). The calling
 *  thread's CUDA context is left as it was. Returns the bytes written. */
int64_t ferry_image_decode_cuda(const void *data, size_t n, int device, uintptr_t dst, size_t cap, void *stream,
                                ferry_image_info *info);
/** "loaded nvJPEG 12.4 from libnvjpeg.so.12", or why nvJPEG is not loaded (static text). */
const char *ferry_nvjpeg_status(void);

/* ------------------------------------------------------------------------- */
/* Writing objects (s3://, gs://)                                             */
/* ------------------------------------------------------------------------- */
/** Write the n bytes at data as the object at url, whole or not at all.
 *  url: s3://BUCKET/KEY, or gs://BUCKET/KEY signed with HMAC keys (GCS's
 *  S3-compatible API); endpoint, region and credentials as ferry_file_open
 *  reads them. Up to the part size: one PUT. Above it: a multipart upload --
 *  CreateMultipartUpload, the parts sent side by side (at most
 *  FERRY_REMOTE_CONNECTIONS, 64 at most per call), CompleteMultipartUpload.
 *  Each request is retried as reads are (timeouts, resets, 5xx, 429,
 *  SlowDown; FERRY_REMOTE_RETRIES, FERRY_REMOTE_RETRY_SECONDS,
 *  FERRY_REMOTE_STALL_SECONDS). Any failure aborts the upload
 *  (AbortMultipartUpload): unless the call returns 0, the object at url is
 *  what it was before (or absent) and no pending upload remains; an abort
 *  that fails too is said in the message, with the upload id to abort.
 *  FERRY_REMOTE_PART_SIZE: bytes per part (16M; 5M to 5G, S3's bounds),
 *  grown by whole MiB where 10,000 parts (S3's most) would not cover n.
 *  Small bodies (up to 1 MiB) are signed with their SHA-256; larger ones are
 *  sent as UNSIGNED-PAYLOAD (TLS protects them on https endpoints).
 *  http:// and https:// are FERRY_EUNSUPPORTED (HTTP has no one protocol
 *  for writing an object whole), as is every URL in a ferry built without
 *  libcurl; plain paths and file:// are FERRY_EINVAL (ferry_pwrite writes
 *  files). data must stay valid and unchanged until the call returns; it is
 *  read from the calling thread's requests, never copied. 0, or a negative
 *  code with the thread's message naming url, the request (the part and its
 *  bytes), the HTTP status and the server's message. */
int ferry_object_write(ferry_ctx *ctx, const char *url, const void *data, uint64_t n);
/** Delete the object at url (s3:// or gs://, as ferry_object_write). An
 *  absent object is not an error. 0, or a negative code naming url. */
int ferry_object_delete(ferry_ctx *ctx, const char *url);

/* ------------------------------------------------------------------------- */
/* Image batches: shards -> decode (CPU and GPU) -> transform -> one array   */
/* ------------------------------------------------------------------------- */
/* ferry_image_batch turns n samples of a shard set into n rows of one array,
 * in host or CUDA device memory:
 *
 *   1. read    each sample's image member (ferry_shards_read; threads)
 *   2. probe   its header on the CPU: size, format, sampling; the crop box and
 *              the flip are drawn now, from (seed, epoch, sample index), so a
 *              resumed epoch draws the same ones whoever decodes the image
 *   3. decode  from one queue served by two decoders at once: CPU threads
 *              (libjpeg-turbo, libspng) take images one at a time, the GPU
 *              (nvJPEG's batched decode) takes runs of them; what nvJPEG
 *              cannot take goes to the CPU (fallbacks, counted by reason)
 *   4. transform  crop, antialiased resize, flip, normalise, layout, dtype
 *              (imagexform): for a device destination on the GPU kernel, the
 *              images the CPU decoded uploaded first (so the CPU threads only
 *              decode; where the kernel cannot load, the CPU transforms and
 *              copies rows); for a host destination on the CPU threads
 *
 * The copies of CPU-decoded images go on `stream` from pageable memory, which
 * the driver may stage only once the stream reaches them: work queued on the
 * stream before the call slows the CPU threads. Give a batch a stream of its
 * own (and make the consumer's stream wait on it) rather than the training
 * step's.
 *
 * Decode policy (ferry_decode_policy; FERRY_DECODE_AUTO takes the context's,
 * FERRY_DECODE in the environment, as for compressed chunks):
 *   CPU   every image on the CPU threads.
 *   GPU   every JPEG nvJPEG takes on the GPU; the rest (PNG, CMYK, 12-bit,
 *         sampling other than 4:4:4, 4:2:2, 4:2:0, 4:4:0 and gray: 4:1:1, 4:1:0
 *         and unknown ones; sides past 16384) on the CPU.
 *         Needs a device destination, nvJPEG (ferry_nvjpeg_status) and the
 *         transform kernel: else FERRY_EPATH saying which is missing.
 *   AUTO  a device destination with nvJPEG and the kernel: both decoders on
 *         one queue, so the rate is the sum of the two where both help (each
 *         GPU run is the share of the pixels left that the GPU finishes when
 *         the CPU threads finish the rest, by the decode rates measured in the
 *         call and in earlier calls on the device); else the CPU alone (host
 *         destinations always).
 * On the GPU, images the hardware JPEG engine takes (nvjpegDecodeBatchedSupported:
 * baseline, one scan) go to NVJPEG_BACKEND_HARDWARE where the device has one,
 * the others to the CUDA backend. The hardware backend writes its output when
 * the call is made, not in stream order (measured on H100s by the torchcodec
 * and torchvision projects), so ferry waits on the host for the stream before
 * each hardware call; its outputs are ferry's own scratch memory.
 *
 * Corrupt images. Every image is probed on the CPU and a JPEG without its
 * end-of-image marker is refused before any decoder sees it; libjpeg-turbo's
 * warnings count as errors. A batch nvJPEG refuses is decoded again on the CPU,
 * image by image (fallback "gpu_error"), so the error names the image. nvJPEG
 * checks entropy-coded data less strictly than libjpeg-turbo: a bit flipped
 * inside a scan that the CPU reports can decode on the GPU to wrong blocks
 * (FERRY_DECODE_CPU checks every image as strictly).
 * on_error RAISE: the call fails with the first failing sample's code and a
 * message naming the shard file, the sample key and the member (the rows are
 * then unspecified). SKIP: failing samples are left out, the rows of the
 * others are moved up (rows 0..written-1 in order of the samples kept), and
 * their positions are reported. */
typedef enum ferry_image_crop {
    FERRY_IMAGE_CROP_RANDOM_RESIZED = 0, /* torchvision RandomResizedCrop(scale, ratio), then resize */
    FERRY_IMAGE_CROP_CENTER = 1,         /* the largest centred box of the output's aspect ratio, then
                                            resize: for a square output torchvision's CenterCrop(shorter
                                            side) + Resize(size), which is Resize(size) +
                                            CenterCrop(size) but for the filter at the box's edges */
    FERRY_IMAGE_CROP_RESIZE = 2,         /* the whole image resized to the output (aspect not kept) */
    FERRY_IMAGE_CROP_NONE = 3            /* no crop, no resize: every image must be the output's size
                                            (FERRY_EINVAL otherwise, saying to pass a crop or resize,
                                            with on_error SKIP too: the arguments are wrong, not the image) */
} ferry_image_crop;

typedef enum ferry_image_layout { FERRY_IMAGE_CHW = 0, FERRY_IMAGE_HWC = 1 } ferry_image_layout;
typedef enum ferry_on_error { FERRY_ON_ERROR_RAISE = 0, FERRY_ON_ERROR_SKIP = 1 } ferry_on_error;

/** What every sample becomes: one row of height x width x 3 (RGB; gray
 *  images replicated) elements in `layout`, of `dtype` (FERRY_DT_U8: the
 *  resized pixels; FERRY_DT_F32 / F16 / BF16: v / 255, then (v - mean[c]) /
 *  std[c] where std[c] != 0, so std all 0 is no normalisation). Resizing is
 *  the antialiased triangle filter of torchvision's resize(antialias=True). */
typedef struct ferry_image_transform {
    uint32_t height, width;     /* output size, 1..65536 each */
    ferry_image_crop crop;
    double scale[2], ratio[2];  /* RANDOM_RESIZED's area share and aspect range; all 0: (0.08, 1)
                                   and (3/4, 4/3), torchvision's defaults */
    double flip;                /* probability of a horizontal flip, 0..1 */
    float mean[3], std[3];
    ferry_image_layout layout;
    ferry_dtype dtype;          /* FERRY_DT_U8, F32, F16 or BF16 */
} ferry_image_transform;

/** One batch. The shard set is read, not changed; samples[] are indices into
 *  it (repeats allowed). `dst`: samples x row bytes at least (row bytes:
 *  height x width x 3 x the dtype's size), host memory or device memory of a
 *  CUDA device; a device destination is written on `stream` (a CUstream of
 *  that device; NULL: the legacy default stream), ordered after the work
 *  queued on it before the call. */
typedef struct ferry_image_batch_args {
    ferry_shards *shards;
    const int64_t *samples;
    size_t n;
    const char *member;         /* the member holding the image ("jpg", an MDS column); NULL: the
                                   first member named like an image (jpg, jpeg, png, "x.jpg"; an MDS
                                   column of encoding jpeg or png) */
    ferry_image_transform xf;
    uint64_t seed, epoch;       /* the crop boxes and flips derive from (seed, epoch, samples[i]) */
    ferry_buf dst;
    void *stream;
    ferry_on_error on_error;
    ferry_decode_policy decode; /* FERRY_DECODE_AUTO: the context's (FERRY_DECODE) */
    int threads;                /* CPU threads for reading and decoding: 0: one per CPU, at most 16 */
} ferry_image_batch_args;

/** Why an image bound for the GPU was decoded on the CPU (indices of
 *  ferry_image_batch_stats.fallbacks; ferry_image_fallback_name names them). */
enum {
    FERRY_IMAGE_FB_PNG = 0,      /* not a JPEG */
    FERRY_IMAGE_FB_CMYK = 1,     /* CMYK / YCCK: nvJPEG's conversion is not libjpeg-turbo's */
    FERRY_IMAGE_FB_SAMPLING = 2, /* chroma sampling ferry does not send to nvJPEG (4:1:1, 4:1:0, unknown) */
    FERRY_IMAGE_FB_PRECISION = 3,/* not 8 bits per sample */
    FERRY_IMAGE_FB_LARGE = 4,    /* a side past 16384 */
    FERRY_IMAGE_FB_GPU_ERROR = 5,/* nvJPEG refused its batch: decoded again on the CPU */
    FERRY_IMAGE_FB_COUNT_ = 6
};
/** "png", "cmyk", "sampling", "precision", "large", "gpu_error" (static); NULL when out of range. */
const char *ferry_image_fallback_name(int reason);

/** What one call did. skipped: caller's array of `n` entries (may be NULL)
 *  receiving the positions in samples[] of the samples left out. */
typedef struct ferry_image_batch_stats {
    size_t written;             /* rows filled: n less the skipped */
    size_t nskipped;
    size_t *skipped;            /* in: the caller's array (or NULL); out: nskipped positions, ascending */
    size_t gpu, cpu;            /* images decoded by nvJPEG / by the CPU threads */
    size_t gpu_hw;              /* of gpu, those on the hardware JPEG engine */
    size_t fallbacks[FERRY_IMAGE_FB_COUNT_];
    /* where the call's time went (seconds): the call; reading and probing
     * (every thread, before decoding starts); thread-seconds the CPU threads
     * spent decoding and transforming; the GPU feeder's runs; thread-seconds
     * decoding threads waited for the device (a pinned buffer's copy, a
     * scratch buffer's last kernel) */
    double seconds, prepare_s, cpu_decode_s, gpu_s, wait_s;
} ferry_image_batch_stats;

/** Read, decode and transform a batch (see above); rows of skipped samples
 *  are not counted. Returns the rows written (>= 0) or a negative
 *  ferry_status: FERRY_EINVAL for bad arguments (the message says which),
 *  FERRY_EPATH for a forced GPU decode that cannot run, or with RAISE the
 *  first failing sample's code (FERRY_ECODEC, FERRY_EUNSUPPORTED, FERRY_ENOTFOUND
 *  for a sample without the member, -errno ...). Blocking: when it returns,
 *  the batch's work on `stream` has run (the rows are there). GPU decodes go
 *  through scratch device memory of one run of images (at most 64 images and
 *  256 MiB of pixels, or one larger image, two such buffers) and pinned
 *  upload buffers, which ferry keeps per device for later calls (four sets
 *  a device: calls in flight together each take one; a fifth makes its
 *  own). stats may be NULL; the context's ferry_stats add up the images
 *  (image_gpu, image_cpu, image_skipped, image_fallbacks). */
int64_t ferry_image_batch(ferry_ctx *ctx, const ferry_image_batch_args *args, ferry_image_batch_stats *stats);
/* Remote objects: options and listings                                       */
/* ------------------------------------------------------------------------- */
/** Set a remote option of ctx: every s3://, gs:// and https:// object ctx
 *  opens afterwards (files, datasets, a Zarr store's chunks, listings) uses
 *  it before the environment's settings (ferry_file_open lists those). Names
 *  and values (strings; value NULL or "" returns the option to the
 *  environment's):
 *    endpoint_url  "http(s)://host[:port]" s3:// (and gs://) requests go to
 *                  (in place of AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST)
 *    region        the S3 signing region (in place of AWS_REGION)
 *    addressing    "auto", "path" or "virtual" (FERRY_S3_ADDRESSING)
 *    key, secret   credentials (S3 access keys; GCS HMAC keys for gs://), with
 *    token         a session token; they replace the environment's and
 *                  ~/.aws/credentials'
 *    profile       a section of ~/.aws/credentials (AWS_PROFILE)
 *    anon          "true": unsigned requests whatever credentials are around
 *                  (public buckets); "false"
 *    ca_bundle     a PEM file the certificates of https:// servers are checked
 *                  against (verification is always on)
 *  Returns 0, or FERRY_EINVAL naming the option (an unknown name, a value it
 *  does not take, an unreadable ca_bundle). Set options before the context
 *  opens URLs, not while other threads open them. Python's storage_options
 *  are translated to these (ferry.remote_options). */
int ferry_ctx_set_remote_option(ferry_ctx *ctx, const char *name, const char *value);

/** The objects a URL glob names, sorted: s3://BUCKET/PATTERN or gs://...,
 *  the pattern's '*', '?' and '[...]' matching within one '/'-separated part
 *  of the key (fnmatch(3) with FNM_PATHNAME), "**" as a whole part matching
 *  any number of parts. The bucket is listed (ListObjectsV2; GCS's JSON API
 *  for gs:// without keys) from the literal part of the key before the first
 *  wildcard, with ctx's remote options. A pattern without wildcards names
 *  itself when the object exists. On success *urls is one malloc'ed block of
 *  *n NUL-terminated URLs back to back (free(3) it; NULL when *n is 0).
 *  FERRY_EUNSUPPORTED for other schemes (web servers cannot be listed);
 *  listing errors name the URL, the HTTP status and the server's message; more
 *  than 10,000,000 keys under the literal part is FERRY_EINVAL. */
int ferry_url_glob(ferry_ctx *ctx, const char *pattern, char **urls, size_t *n);

FERRY_API_END
#ifdef __cplusplus
}
#endif
#endif /* FERRY_EXPERIMENTAL_H */
