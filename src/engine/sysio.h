/* sysio.h — the system-call table moved to the floor (base/sysio.h); this
 * name stays for the files that include it. Internal. */
#ifndef FERRY_ENGINE_SYSIO_H
#define FERRY_ENGINE_SYSIO_H
#include "base/sysio.h"
#endif
