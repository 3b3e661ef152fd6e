/* fuzz_sniff.c — the format sniffer of every reader's error path: any input
 * gives 0 or a description with a name and advice, never a crash or a read
 * past the head. */
#include "fuzz.h"
#include "formats/sniff.h"

static int fuzz_sniff(const uint8_t *data, size_t size) {
    ferry_sniffed s;
    if (ferry_sniff(data, size, &s) && (!s.what || !s.todo)) abort();
    return 0;
}
FERRY_FUZZ_TARGET(sniff, fuzz_sniff)
