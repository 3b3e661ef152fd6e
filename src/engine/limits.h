/* limits.h — the engine's fixed sizes. Internal; a leaf. */
#ifndef FERRY_ENGINE_LIMITS_H
#define FERRY_ENGINE_LIMITS_H
#define FERRY_ALIGN 4096          /* O_DIRECT and cuFile alignment */
#define FERRY_MAX_WORKERS 256
#define FERRY_MAX_STAGING 16
#define FERRY_MAX_DEVICES 16
#define FERRY_PACK_RUNS 4096      /* scatter entries per staging buffer */
#endif
