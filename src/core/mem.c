#include "mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

dt_status dt_alloc(void **out, size_t bytes, const char *what) {
    *out = NULL;
    if (bytes == 0) bytes = 64;
    size_t align = bytes >= (4u << 20) ? (2u << 20) : 64;
    size_t rounded = (bytes + align - 1) / align * align;
    void *p = NULL;
    if (posix_memalign(&p, align, rounded) != 0 || !p)
        return dt_fail(DT_ERUNTIME, "out of memory allocating %zu bytes for %s", bytes, what);
#ifdef MADV_HUGEPAGE
    if (align > 64) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    memset(p, 0, rounded);
    *out = p;
    return DT_OK;
}

void dt_free(void *p) { free(p); }

size_t dt_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
