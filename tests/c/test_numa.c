/* test_numa.c — the NUMA topology read from a fake sysfs root (the layout of
 * a two-socket, 8-GPU host and its variants), the CPU set a worker is moved
 * to, and the refusal of every malformed list. The real placement on the
 * stand-in driver is tests/gpu/test_multigpu_numa.c. */
#include "check.h"
#include "engine/numa.h"
#include <sys/stat.h>
#include <unistd.h>

static char root_[256];

static void put(const char *rel, const char *text) {
    char path[512], dir[512];
    snprintf(path, sizeof path, "%s%s", root_, rel);
    /* mkdir -p of the parent */
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + strlen(root_) + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(dir, 0755); *p = '/'; }
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(1); }
    fputs(text, f);
    fclose(f);
}

static void gpu(const char *busid, const char *cls, int node) {
    char rel[256], txt[32];
    snprintf(rel, sizeof rel, "/sys/bus/pci/devices/%s/vendor", busid);
    put(rel, "0x10de\n");
    snprintf(rel, sizeof rel, "/sys/bus/pci/devices/%s/class", busid);
    put(rel, cls);
    snprintf(rel, sizeof rel, "/sys/bus/pci/devices/%s/numa_node", busid);
    snprintf(txt, sizeof txt, "%d\n", node);
    put(rel, txt);
}

static int has_exactly(const cpu_set_t *s, const int *cpus, int n) {
    if (CPU_COUNT(s) != n) return 0;
    for (int i = 0; i < n; i++) if (!CPU_ISSET(cpus[i], s)) return 0;
    return 1;
}

static void test_lists_parse_as_the_kernel_writes_them(void) {
    cpu_set_t s;
    CHECK_EQ_I(ferry_numa_parse_list("0-3,8,10-11", &s), 7);
    int want[] = {0, 1, 2, 3, 8, 10, 11};
    CHECK(has_exactly(&s, want, 7));
    CHECK_EQ_I(ferry_numa_parse_list("5", &s), 1);
    CHECK_EQ_I(ferry_numa_parse_list("0-1,1-2", &s), 3);   /* overlaps count once */
    CHECK_EQ_I(ferry_numa_parse_list("", &s), 0);
}

static void test_malformed_lists_are_refused(void) {
    cpu_set_t s;
    const char *bad[] = {"-1", "3-1", "1,", ",1", "1-", "a", "1 2", "0-99999", "1--2", "1,,2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ferry_numa_parse_list(bad[i], &s);
        if (rc != -1) fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
        CHECK_EQ_I(rc, -1);
    }
    CHECK_EQ_I(ferry_numa_parse_list(NULL, &s), -1);
}

/* Two sockets; node 1's CPUs are 8-15 and 24-31 (SMT siblings listed apart). */
static void test_two_socket_host(void) {
    put("/sys/devices/system/node/online", "0-1\n");
    put("/sys/devices/system/node/node0/cpulist", "0-7,16-23\n");
    put("/sys/devices/system/node/node1/cpulist", "8-15,24-31\n");
    gpu("0000:17:00.0", "0x030200\n", 0);
    gpu("0000:ca:00.0", "0x030200\n", 1);
    cpu_set_t nodes, cpus, allowed, out;
    CHECK_EQ_I(ferry_numa_nodes(root_, &nodes), 2);
    CHECK_EQ_I(ferry_numa_node_cpus(root_, 1, &cpus), 16);
    CHECK(CPU_ISSET(8, &cpus) && CPU_ISSET(31, &cpus) && !CPU_ISSET(0, &cpus));
    CHECK_EQ_I(ferry_numa_node_cpus(root_, 2, &cpus), -1);
    /* bus ids as drivers spell them: 4 or 8 domain digits, either case */
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:17:00.0"), 0);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "00000000:CA:00.0"), 1);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:ca:00.0"), 1);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:cb:00.0"), -1);   /* no such function */
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:ca:00.0x"), -1);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "garbage"), -1);
    CHECK_EQ_I(ferry_numa_pci_node(root_, NULL), -1);
    /* GPUs on both nodes: the ordinal cannot be matched without bus ids */
    CHECK_EQ_I(ferry_numa_gpus_common_node(root_), -1);
    /* a worker feeding the node-1 GPU, from a process allowed everything */
    CPU_ZERO(&allowed);
    for (int c = 0; c < 32; c++) CPU_SET(c, &allowed);
    CHECK_EQ_I(ferry_numa_choose(root_, 1, &allowed, &out), 16);
    CHECK_EQ_I(ferry_numa_node_cpus(root_, 1, &cpus), 16);
    CHECK(CPU_EQUAL(&out, &cpus));
    /* a container's cpuset of 4-11: only 8-11 of node 1 */
    CPU_ZERO(&allowed);
    for (int c = 4; c < 12; c++) CPU_SET(c, &allowed);
    CHECK_EQ_I(ferry_numa_choose(root_, 1, &allowed, &out), 4);
    int want[] = {8, 9, 10, 11};
    CHECK(has_exactly(&out, want, 4));
    /* a cpuset entirely on node 0: the node-1 worker is not moved */
    CPU_ZERO(&allowed);
    CPU_SET(2, &allowed);
    CHECK_EQ_I(ferry_numa_choose(root_, 1, &allowed, &out), 0);
    CHECK_EQ_I(CPU_COUNT(&out), 0);
    CHECK_EQ_I(ferry_numa_choose(root_, -1, &allowed, &out), 0);
}

/* The kernel says -1 for a function it cannot place (many VMs): unknown. */
static void test_numa_node_minus_one_is_unknown(void) {
    gpu("0000:18:00.0", "0x030200\n", -1);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:18:00.0"), -1);
}

/* One node, its GPUs found by vendor and class; an NVSwitch bridge (class
 * 0x0680) on another node does not count. */
static void test_single_node_fallback_by_vendor_and_class(void) {
    char saved[256];
    snprintf(saved, sizeof saved, "%s", root_);
    strcat(root_, "/one");
    mkdir(root_, 0755);
    put("/sys/devices/system/node/online", "0\n");
    put("/sys/devices/system/node/node0/cpulist", "0-15\n");
    gpu("0000:00:05.0", "0x030200\n", 0);
    gpu("0000:00:06.0", "0x030000\n", 0);
    gpu("0000:00:07.0", "0x068000\n", 1);
    put("/sys/bus/pci/devices/0000:00:01.0/vendor", "0x8086\n");   /* not NVIDIA */
    put("/sys/bus/pci/devices/0000:00:01.0/class", "0x030000\n");
    put("/sys/bus/pci/devices/0000:00:01.0/numa_node", "1\n");
    cpu_set_t nodes;
    CHECK_EQ_I(ferry_numa_nodes(root_, &nodes), 1);
    CHECK_EQ_I(ferry_numa_gpus_common_node(root_), 0);
    snprintf(root_, sizeof root_, "%s", saved);
}

/* A node id past FERRY_NUMA_MAX_NODES (64) is unknown, as ferry_numa_pci_node
 * says: callers index per-node tables with it. Node 63 still counts. */
static void test_node_past_the_limit_is_unknown(void) {
    char saved[256];
    snprintf(saved, sizeof saved, "%s", root_);
    strcat(root_, "/wide");
    mkdir(root_, 0755);
    gpu("0000:41:00.0", "0x030200\n", 64);
    gpu("0000:42:00.0", "0x030200\n", 64);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:41:00.0"), -1);
    CHECK_EQ_I(ferry_numa_gpus_common_node(root_), -1);
    snprintf(root_, sizeof root_, "%s", saved);
    strcat(root_, "/edge");
    mkdir(root_, 0755);
    gpu("0000:41:00.0", "0x030200\n", 63);
    CHECK_EQ_I(ferry_numa_pci_node(root_, "0000:41:00.0"), 63);
    CHECK_EQ_I(ferry_numa_gpus_common_node(root_), 63);
    gpu("0000:42:00.0", "0x030200\n", 1000);
    CHECK_EQ_I(ferry_numa_gpus_common_node(root_), -1);
    snprintf(root_, sizeof root_, "%s", saved);
}

/* A kernel without NUMA has /sys/devices/system but no node/online: 0 nodes,
 * not an error; a root with nothing at all is unreadable (-1). */
static void test_no_numa_kernel(void) {
    char saved[256];
    snprintf(saved, sizeof saved, "%s", root_);
    strcat(root_, "/flat");
    mkdir(root_, 0755);
    cpu_set_t nodes;
    CHECK_EQ_I(ferry_numa_nodes(root_, &nodes), -1);
    put("/sys/devices/system/cpu/online", "0-3\n");
    CHECK_EQ_I(ferry_numa_nodes(root_, &nodes), 0);
    put("/sys/devices/system/node/online", "0-1,x\n");   /* garbage in the file itself */
    CHECK_EQ_I(ferry_numa_nodes(root_, &nodes), -1);
    snprintf(root_, sizeof root_, "%s", saved);
}

/* FERRY_NUMA takes auto or off; anything else is an error naming the value. */
static void test_policy_names(void) {
    setenv("FERRY_NUMA", "auto", 1);
    CHECK_EQ_I(ferry_numa_check_env(), 0);
    setenv("FERRY_NUMA", "OFF", 1);
    CHECK_EQ_I(ferry_numa_check_env(), 0);
    setenv("FERRY_NUMA", "node1", 1);
    CHECK(ferry_numa_check_env() < 0);
    unsetenv("FERRY_NUMA");
    CHECK_EQ_I(ferry_numa_check_env(), 0);
}

int main(void) {
    snprintf(root_, sizeof root_, "%s/ferry-numa-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root_)) return 1;
    RUN(test_lists_parse_as_the_kernel_writes_them);
    RUN(test_malformed_lists_are_refused);
    RUN(test_two_socket_host);
    RUN(test_numa_node_minus_one_is_unknown);
    RUN(test_single_node_fallback_by_vendor_and_class);
    RUN(test_node_past_the_limit_is_unknown);
    RUN(test_no_numa_kernel);
    RUN(test_policy_names);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root_);
    return check_summary();
}
