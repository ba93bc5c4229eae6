#include "mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Test hook (fault injection): DT_TEST_FAIL_ALLOC="WHAT@RANK" makes the allocation
 * named WHAT fail on MPI rank RANK only, to check that a rank-local failure ends every
 * rank instead of leaving the others waiting in a collective. */
static int injected_failure(const char *what) {
    const char *spec = getenv("DT_TEST_FAIL_ALLOC");
    if (!spec || !*spec) return 0;
    const char *at = strrchr(spec, '@'), *rank = getenv("OMPI_COMM_WORLD_RANK");
    size_t n = at ? (size_t)(at - spec) : strlen(spec);
    if (strlen(what) != n || strncmp(what, spec, n) != 0) return 0;
    return !at || atoi(at + 1) == (rank ? atoi(rank) : 0);
}

dt_status dt_alloc(void **out, size_t bytes, const char *what) {
    *out = NULL;
    if (injected_failure(what))
        return dt_fail(DT_ERUNTIME, "out of memory allocating %zu bytes for %s (injected by DT_TEST_FAIL_ALLOC)", bytes,
                       what);
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
