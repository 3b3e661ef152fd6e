/* numa.h — where each GPU sits in the host's NUMA topology, and moving a
 * worker thread (and the staging it allocates next) to its device's node.
 * A leaf: depends on nothing of the engine. Internal.
 *
 * The topology comes from sysfs (FERRY_SYSFS_ROOT prefixes every path, for
 * tests): /sys/devices/system/node/online and node<N>/cpulist, and for a CUDA
 * device the numa_node of its PCI function, /sys/bus/pci/devices/<bus id>/,
 * the bus id asked from the driver (cuDeviceGetPCIBusId, which needs no
 * context). FERRY_NUMA=auto (default) places where the host has two or more
 * nodes; off never touches affinity or memory policy. */
#ifndef FERRY_NUMA_H
#define FERRY_NUMA_H
#include <sched.h>
#include <stddef.h>

#define FERRY_NUMA_MAX_NODES 64

/* Parse a kernel cpulist/nodelist ("0-3,8,10-11") into set. Returns the
 * number of entries set, or -1 on garbage (nothing is trusted: a list naming
 * CPUs past CPU_SETSIZE is garbage too). */
int ferry_numa_parse_list(const char *s, cpu_set_t *set);
/* Nodes online under root ("" for the real /sys): a count, 0 where the
 * kernel exposes no node directory (no NUMA support), -1 when unreadable. */
int ferry_numa_nodes(const char *root, cpu_set_t *nodes);
/* The CPUs of node under root. Returns their count, or -1. */
int ferry_numa_node_cpus(const char *root, int node, cpu_set_t *cpus);
/* numa_node of a PCI function named as the driver names it ("0000:17:00.0",
 * "00000000:17:00.0", any case): the node, -1 when the kernel says -1 or
 * the file is missing or unreadable. */
int ferry_numa_pci_node(const char *root, const char *busid);
/* Without bus ids from the driver: the node every NVIDIA display/3D PCI
 * function under root shares (vendor 0x10de, class 0x03xxxx); -1 when they
 * sit on different nodes (the CUDA ordinal cannot be matched to a function
 * then) or none is found. */
int ferry_numa_gpus_common_node(const char *root);
/* The CPU set a worker feeding a device on node should run on: node's CPUs
 * that the thread may use (allowed). Returns the count; 0 (out empty) when
 * the two do not meet — a container's cpuset elsewhere: do not move. */
int ferry_numa_choose(const char *root, int node, const cpu_set_t *allowed, cpu_set_t *out);

/* FERRY_NUMA: 0 valid (or unset), else FERRY_EINVAL naming the value. */
int ferry_numa_check_env(void);
/* The node of CUDA device dev (cached per process), -1 unknown. */
int ferry_numa_device_node(int dev);
/* Called by a pool worker before it allocates staging that feeds device dev:
 * the first call on a thread moves the thread to dev's node's CPUs and
 * prefers that node for its memory (set_mempolicy MPOL_PREFERRED), where
 * FERRY_NUMA=auto, the host has several nodes and every device with a live
 * primary context in the process is on that node. Later calls on the thread do
 * nothing: staging buffers are allocated once and serve every device, so a
 * worker stays where its buffers are. Never fails (placement is an
 * optimisation); returns the node moved to, or -1. */
struct ferry_ctx;
int ferry_numa_place_thread(const struct ferry_ctx *ctx, int dev);
/* Threads moved so far to node (tests and `ferry info`). */
long ferry_numa_placed(int node);
/* One line for `ferry info`: nodes, each device's node, the policy. */
void ferry_numa_describe(char *buf, size_t n, int ndev);
#endif
