/* numa.c — the host's NUMA topology from sysfs and the placement of worker
 * threads on the node of the device they feed (numa.h says what and when).
 *
 * Why: on a two-socket host with four GPUs per socket, a staging buffer on the
 * far socket makes every byte cross the socket link twice (pread writes it,
 * the copy engine reads it), and a worker on the far socket reads the page
 * cache through the same link. Where the host has one node (most one-GPU VMs,
 * CI) nothing here runs beyond reading two sysfs files once.
 *
 * No libnuma: two syscalls (sched_setaffinity, set_mempolicy) and sysfs text. */
#include "engine/numa.h"
#include "engine/knobs.h"
#include "common.h"
#include "cuda/cuda.h"
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_PREFERRED_ 1         /* linux/mempolicy.h */
#define MAX_DEV 64

/* ---- sysfs text ------------------------------------------------------------ */
static int read_text(const char *root, const char *path, char *buf, size_t n) {
    char full[1024];
    snprintf(full, sizeof full, "%s%s", root ? root : "", path);
    FILE *f = fopen(full, "re");
    if (!f) return -1;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = 0;
    while (got && isspace((unsigned char)buf[got - 1])) buf[--got] = 0;
    return (int)got;
}

int ferry_numa_parse_list(const char *s, cpu_set_t *set) {
    CPU_ZERO(set);
    int count = 0;
    const char *p = s;
    if (!p) return -1;
    while (*p) {
        char *end;
        if (!isdigit((unsigned char)*p)) return -1;
        long lo = strtol(p, &end, 10), hi = lo;
        p = end;
        if (*p == '-') {
            if (!isdigit((unsigned char)p[1])) return -1;
            hi = strtol(p + 1, &end, 10);
            p = end;
        }
        if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return -1;
        for (long c = lo; c <= hi; c++) if (!CPU_ISSET(c, set)) { CPU_SET(c, set); count++; }
        if (*p == ',') { p++; if (!*p) return -1; }
        else if (*p) return -1;
    }
    return count;
}

int ferry_numa_nodes(const char *root, cpu_set_t *nodes) {
    char buf[4096];
    CPU_ZERO(nodes);
    if (read_text(root, "/sys/devices/system/node/online", buf, sizeof buf) < 0) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/sys/devices/system", root ? root : "");
        DIR *d = opendir(dir);
        if (!d) return -1;
        closedir(d);
        return 0;   /* a kernel without NUMA: no node directory */
    }
    int n = ferry_numa_parse_list(buf, nodes);
    return n < 0 || n > FERRY_NUMA_MAX_NODES ? -1 : n;
}

int ferry_numa_node_cpus(const char *root, int node, cpu_set_t *cpus) {
    char path[128], buf[4096];
    CPU_ZERO(cpus);
    if (node < 0) return -1;
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    if (read_text(root, path, buf, sizeof buf) < 0) return -1;
    if (!buf[0]) return 0;   /* a memory-only node (CXL, HBM) has no CPUs */
    return ferry_numa_parse_list(buf, cpus);
}

static int read_int(const char *root, const char *path, long *out) {
    char buf[64], *end;
    if (read_text(root, path, buf, sizeof buf) <= 0) return -1;
    long v = strtol(buf, &end, 0);
    if (*end) return -1;
    *out = v;
    return 0;
}

int ferry_numa_pci_node(const char *root, const char *busid) {
    unsigned dom, bus, dev, fn;
    char tail;
    /* hex digits, colons and one dot only: sscanf's %x would take "0x" */
    if (!busid || busid[strspn(busid, "0123456789abcdefABCDEF:.")]) return -1;
    if (sscanf(busid, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4) return -1;
    if (dom > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return -1;
    char path[128];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", dom, bus, dev, fn);
    long node;
    if (read_int(root, path, &node) < 0 || node < 0 || node >= FERRY_NUMA_MAX_NODES) return -1;
    return (int)node;
}

int ferry_numa_gpus_common_node(const char *root) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/sys/bus/pci/devices", root ? root : "");
    DIR *d = opendir(dir);
    if (!d) return -1;
    int node = -2;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        long vendor, cls, nd;
        snprintf(p, sizeof p, "/sys/bus/pci/devices/%.255s/vendor", e->d_name);
        if (read_int(root, p, &vendor) < 0 || vendor != 0x10de) continue;
        snprintf(p, sizeof p, "/sys/bus/pci/devices/%.255s/class", e->d_name);
        if (read_int(root, p, &cls) < 0 || (cls >> 16) != 0x03) continue;   /* not a GPU (NVSwitch, audio) */
        snprintf(p, sizeof p, "/sys/bus/pci/devices/%.255s/numa_node", e->d_name);
        if (read_int(root, p, &nd) < 0 || nd < 0 || nd >= FERRY_NUMA_MAX_NODES) { node = -1; break; }   /* as ferry_numa_pci_node */
        if (node == -2) node = (int)nd;
        else if (node != nd) { node = -1; break; }
    }
    closedir(d);
    return node < 0 ? -1 : node;
}

int ferry_numa_choose(const char *root, int node, const cpu_set_t *allowed, cpu_set_t *out) {
    cpu_set_t cpus;
    CPU_ZERO(out);
    if (ferry_numa_node_cpus(root, node, &cpus) <= 0) return 0;
    CPU_AND(out, &cpus, allowed);
    return CPU_COUNT(out);
}

/* ---- the process's view ---------------------------------------------------- */
static const char *root_(void) {
    const char *r = ferry_knob(NULL, "FERRY_SYSFS_ROOT");   /* the process's view: no context */
    return r ? r : "";
}

/* 1 auto, 0 off, -1 garbage: FERRY_NUMA as ctx reads it (NULL: the environment) */
static int policy_of(const ferry_ctx *ctx) {
    const char *s = ferry_knob(ctx, "FERRY_NUMA");
    if (!s || !*s || !strcasecmp(s, "auto")) return 1;
    if (!strcasecmp(s, "off") || !strcmp(s, "0")) return 0;
    return -1;
}

int ferry_numa_check_env(void) {
    if (policy_of(NULL) >= 0) return 0;
    return ferry_seterr(FERRY_EINVAL, "FERRY_NUMA=\"%s\": use auto or off", ferry_knob(NULL, "FERRY_NUMA"));
}

static pthread_once_t once_ = PTHREAD_ONCE_INIT;
static int nnodes_;               /* online nodes, 0/-1 none known */
static pthread_mutex_t dev_lock_ = PTHREAD_MUTEX_INITIALIZER;
static int dev_node_[MAX_DEV];    /* a device's node, -1 unknown; valid once dev_done_ */
static char dev_bus_[MAX_DEV][32]; /* its PCI bus id as the driver said it, "" none */
static int dev_done_[MAX_DEV];
static atomic_long placed_[FERRY_NUMA_MAX_NODES];
static __thread int thread_placed_;

static void load_once(void) {
    cpu_set_t nodes;
    nnodes_ = ferry_numa_nodes(root_(), &nodes);
}

/* cuDeviceGetPCIBusId through the already loaded driver (ferry's loader does
 * not need it for anything else; a driver without it falls back to sysfs). */
typedef CUresult (*busid_fn)(char *, int, CUdevice);
typedef CUresult (*devget_fn)(CUdevice *, int);
typedef CUresult (*ctxstate_fn)(CUdevice, unsigned *, int *);

/* 1 when every device with a live primary context in this process is on node: the
 * process serves one node's GPUs (a DDP rank, or a job over one socket's GPUs). A
 * process that holds contexts on both sockets (one plan filling all GPUs) gets no
 * placement: its workers serve every device, and pinning them all to the node of the
 * first device they fed would put every staging buffer on one socket. */
static int process_on_one_node(int node) {
    const ferry_cuda_api *cu = ferry_cuda_load(NULL);
    void *h = cu ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) : NULL;
    ctxstate_fn state = h ? (ctxstate_fn)dlsym(h, "cuDevicePrimaryCtxGetState") : NULL;
    devget_fn devget = h ? (devget_fn)dlsym(h, "cuDeviceGet") : NULL;
    int n = 0, ok = state && devget && cu->DeviceGetCount(&n) == 0;
    for (int d = 0; ok && d < n && d < MAX_DEV; d++) {
        CUdevice dv;
        unsigned flags;
        int active = 0;
        if (devget(&dv, d) != 0 || state(dv, &flags, &active) != 0) { ok = 0; break; }
        if (active && ferry_numa_device_node(d) != node) ok = 0;
    }
    if (h) dlclose(h);
    return ok;
}

static void resolve_locked(int dev) {
    dev_done_[dev] = 1;
    dev_node_[dev] = -1;
    if (!ferry_cuda_load(NULL)) return;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    busid_fn busid = h ? (busid_fn)dlsym(h, "cuDeviceGetPCIBusId") : NULL;
    devget_fn devget = h ? (devget_fn)dlsym(h, "cuDeviceGet") : NULL;
    CUdevice d;
    if (busid && devget && devget(&d, dev) == 0 && busid(dev_bus_[dev], sizeof dev_bus_[dev], d) == 0) {
        dev_bus_[dev][sizeof dev_bus_[dev] - 1] = 0;
        dev_node_[dev] = ferry_numa_pci_node(root_(), dev_bus_[dev]);
    } else {
        dev_bus_[dev][0] = 0;
        dev_node_[dev] = ferry_numa_gpus_common_node(root_());
    }
    if (h) dlclose(h);
}

int ferry_numa_device_node(int dev) {
    if (dev < 0 || dev >= MAX_DEV) return -1;
    pthread_mutex_lock(&dev_lock_);
    if (!dev_done_[dev]) resolve_locked(dev);
    int node = dev_node_[dev];
    pthread_mutex_unlock(&dev_lock_);
    return node;
}

int ferry_numa_place_thread(const ferry_ctx *ctx, int dev) {
    if (thread_placed_) return -1;
    thread_placed_ = 1;
    pthread_once(&once_, load_once);
    if (policy_of(ctx) != 1 || nnodes_ < 2) return -1;
    int node = ferry_numa_device_node(dev);
    if (node < 0 || !process_on_one_node(node)) return -1;
    cpu_set_t allowed, set;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    if (ferry_numa_choose(root_(), node, &allowed, &set) == 0) return -1;
    if (sched_setaffinity(0, sizeof set, &set) != 0) return -1;   /* 0: this thread */
    /* Prefer (not bind) the node: when it runs out, memory comes from another
     * node instead of the allocation failing. A node the kernel does not know
     * (a test's fake sysfs) is refused with EINVAL: the CPUs still moved. */
    unsigned long mask[FERRY_NUMA_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
    mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
    (void)syscall(SYS_set_mempolicy, MPOL_PREFERRED_, mask, (unsigned long)FERRY_NUMA_MAX_NODES + 1);
    atomic_fetch_add(&placed_[node], 1);
    return node;
}

long ferry_numa_placed(int node) {
    return node >= 0 && node < FERRY_NUMA_MAX_NODES ? atomic_load(&placed_[node]) : 0;
}

void ferry_numa_describe(char *buf, size_t n, int ndev) {
    pthread_once(&once_, load_once);
    int pol = policy_of(NULL);
    size_t at = 0;
#define PUT(...) do { if (at < n) { int w_ = snprintf(buf + at, n - at, __VA_ARGS__); if (w_ > 0) at += (size_t)w_; } } while (0)
    if (nnodes_ <= 0) PUT("no NUMA nodes reported by the kernel");
    else PUT("%d node%s", nnodes_, nnodes_ == 1 ? "" : "s");
    for (int d = 0; d < ndev && d < MAX_DEV; d++) {
        int node = ferry_numa_device_node(d);
        PUT("%s GPU%d", d ? "," : ";", d);
        if (dev_bus_[d][0]) PUT(" %s", dev_bus_[d]);
        if (node >= 0) PUT(" node %d", node); else PUT(" node unknown");
    }
    if (pol < 0) PUT("; FERRY_NUMA invalid");
    else if (pol == 0) PUT("; placement off (FERRY_NUMA=off)");
    else if (nnodes_ < 2) PUT("; placement: nothing to do on one node");
    else PUT("; placement auto: workers and staging on their device's node (FERRY_NUMA)");
#undef PUT
}
