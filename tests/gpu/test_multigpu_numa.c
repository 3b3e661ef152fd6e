/* test_multigpu_numa.c — workers move to the NUMA node of the device they
 * feed. Runs on the stand-in driver only (tests/cudasim: its device d has PCI
 * bus id 0000:<0x10 + d>:00.0), under a fake sysfs (FERRY_SYSFS_ROOT) of two
 * nodes, CPU 0 and CPU 1, device 0 on node 0 and device 1 on node 1: a pool
 * worker feeding device 1 ends up allowed CPU 1 only; the caller's thread
 * (inline work) keeps its CPUs; FERRY_NUMA=off moves nobody, nor does a
 * process holding contexts on both nodes' GPUs. On a real GPU
 * host the topology is the machine's: bench_multigpu.py reports it. */
#include "check.h"
#include "ferry.h"
#include "engine/numa.h"
#include <dirent.h>
#include <dlfcn.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

static char root_[256], path_[512];
enum { N = 24 << 20 };

static void put(const char *rel, const char *text) {
    char p[512], dir[512];
    snprintf(p, sizeof p, "%s%s", root_, rel);
    snprintf(dir, sizeof dir, "%s", p);
    for (char *c = dir + strlen(root_) + 1; *c; c++)
        if (*c == '/') { *c = 0; mkdir(dir, 0755); *c = '/'; }
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* threads of this process whose allowed CPU list is exactly `list` */
static int threads_allowed(const char *list) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[300], line[512];
        snprintf(p, sizeof p, "/proc/self/task/%.200s/status", e->d_name);
        FILE *f = fopen(p, "r");
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Cpus_allowed_list:", 18)) {
                char *v = line + 18;
                while (*v == ' ' || *v == '\t') v++;
                v[strcspn(v, "\n")] = 0;
                if (!strcmp(v, list)) n++;
            }
        if (f) fclose(f);
    }
    if (d) closedir(d);
    return n;
}

static int64_t read_to(ferry_ctx *c, int dev, size_t len) {
    uintptr_t d;
    if (ferry_cuda_malloc(c, dev, N, &d) != 0) return -1;
    ferry_file *f;
    int64_t got = -1;
    if (ferry_file_open(c, path_, FERRY_READ, &f) == 0) {
        got = ferry_pread(f, ferry_cuda_buf(dev, d, len), 0, len, 0);
        ferry_file_close(f);
    }
    ferry_cuda_free(c, d);
    return got;
}

static void test_worker_moves_to_its_devices_node(void) {
    cpu_set_t before, after;
    sched_getaffinity(0, sizeof before, &before);
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 2;
    ferry_ctx *c;
    CHECK_EQ_I(ferry_ctx_create(&c, &cfg), 0);
    CHECK_EQ_I(ferry_numa_device_node(0), 0);
    CHECK_EQ_I(ferry_numa_device_node(1), 1);
    CHECK_EQ_I(read_to(c, 1, 5000), 5000);   /* inline: on this thread, which must not move */
    sched_getaffinity(0, sizeof after, &after);
    CHECK(CPU_EQUAL(&before, &after));
    CHECK_EQ_I(ferry_numa_placed(1), 0);
    CHECK_EQ_I(read_to(c, 1, N), N);          /* pooled: the workers move */
    CHECK(ferry_numa_placed(1) >= 1);
    CHECK_EQ_I(ferry_numa_placed(0), 0);
    CHECK(threads_allowed("1") >= 1);
    sched_getaffinity(0, sizeof after, &after);
    CHECK(CPU_EQUAL(&before, &after));
    char line[512];
    ferry_numa_describe(line, sizeof line, 2);
    CHECK_STR_CONTAINS(line, "2 nodes");
    CHECK_STR_CONTAINS(line, "GPU1 0000:11:00.0 node 1");
    CHECK_STR_CONTAINS(line, "placement auto");
    ferry_ctx_destroy(c);
}

static void test_numa_off_moves_nobody(void) {
    setenv("FERRY_NUMA", "off", 1);
    long before = ferry_numa_placed(0) + ferry_numa_placed(1);
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 2;
    ferry_ctx *c;
    CHECK_EQ_I(ferry_ctx_create(&c, &cfg), 0);
    CHECK_EQ_I(read_to(c, 0, N), N);
    CHECK_EQ_I(ferry_numa_placed(0) + ferry_numa_placed(1), before);
    char line[512];
    ferry_numa_describe(line, sizeof line, 2);
    CHECK_STR_CONTAINS(line, "placement off");
    ferry_ctx_destroy(c);
    setenv("FERRY_NUMA", "nonsense", 1);   /* a bad value fails the context, naming it */
    CHECK(ferry_ctx_create(&c, NULL) < 0);
    CHECK_STR_CONTAINS(ferry_errmsg(NULL), "FERRY_NUMA=\"nonsense\"");
    unsetenv("FERRY_NUMA");
}

/* Device 0 now has a context too (the test above): a process holding
 * contexts on both nodes' GPUs (one plan filling every GPU) moves nobody. */
static void test_contexts_on_two_nodes_move_nobody(void) {
    long before = ferry_numa_placed(0) + ferry_numa_placed(1);
    ferry_config cfg;
    ferry_config_init(&cfg);
    cfg.threads = 2;
    ferry_ctx *c;
    CHECK_EQ_I(ferry_ctx_create(&c, &cfg), 0);
    CHECK_EQ_I(read_to(c, 1, N), N);
    CHECK_EQ_I(ferry_numa_placed(0) + ferry_numa_placed(1), before);
    ferry_ctx_destroy(c);
}

int main(void) {
    cpu_set_t mine;
    sched_getaffinity(0, sizeof mine, &mine);
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu || !dlsym(cu, "cudasim_count") || !CPU_ISSET(0, &mine) || !CPU_ISSET(1, &mine)) {
        printf("skipped: %s\n", !cu || !dlsym(cu, "cudasim_count") ? "runs on the stand-in driver only (tests/cudasim)"
                                                                   : "needs CPUs 0 and 1");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    snprintf(root_, sizeof root_, "%s/ferry-numa-XXXXXX", getenv("FERRY_TEST_DIR") ? getenv("FERRY_TEST_DIR") : ".");
    if (!mkdtemp(root_)) return 1;
    put("/sys/devices/system/node/online", "0-1\n");
    put("/sys/devices/system/node/node0/cpulist", "0\n");
    put("/sys/devices/system/node/node1/cpulist", "1\n");
    put("/sys/bus/pci/devices/0000:10:00.0/numa_node", "0\n");
    put("/sys/bus/pci/devices/0000:11:00.0/numa_node", "1\n");
    setenv("FERRY_SYSFS_ROOT", root_, 1);
    setenv("FERRY_CUDASIM_DEVICES", "2", 1);
    unsetenv("FERRY_NUMA");
    snprintf(path_, sizeof path_, "%s/data.bin", root_);
    FILE *w = fopen(path_, "wb");
    uint8_t *b = calloc(1, N);
    fwrite(b, 1, N, w);
    fclose(w);
    free(b);
    RUN(test_worker_moves_to_its_devices_node);
    RUN(test_numa_off_moves_nobody);
    RUN(test_contexts_on_two_nodes_move_nobody);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root_);
    return check_summary();
}
