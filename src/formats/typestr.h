/* typestr.h — parse a numpy type string into a ferry dtype. Internal. */
#ifndef FERRY_FORMATS_TYPESTR_H
#define FERRY_FORMATS_TYPESTR_H
#include "common.h"

/* Map a numpy typestr of len bytes ("<f4", "|b1", ">M8[ns]", "|S10", "<U3",
 * ...) to a ferry dtype, item size and byteswap element size (0: none
 * needed for host order). Returns 0; -1 for a typestr that is malformed or
 * not a fixed-size type; -2 for a big-endian type whose elements ferry cannot
 * byteswap. */
int ferry_typestr_parse(const char *t, size_t len, ferry_dtype *dt, uint32_t *itemsize, uint32_t *swap);
#endif
