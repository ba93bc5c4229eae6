/* The unit tests' one assertion: counts passes and failures, prints each failure with
 * its location and the last dtrain error message, and never stops the test early. */
#ifndef DT_TEST_CHECK_H
#define DT_TEST_CHECK_H
#include <dirent.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

static int g_pass, g_fail;
static int g_rank = -1; /* MPI tests set their rank: failures then name it */

static inline void check_rank_prefix(void) {
    if (g_rank >= 0) fprintf(stderr, "rank %d: ", g_rank);
}

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            g_pass++;                                                           \
        } else {                                                                \
            g_fail++;                                                           \
            check_rank_prefix();                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " [last error: %s]\n", dt_error_message());        \
        }                                                                       \
    } while (0)

/* max |a - b| over max |a| for n floats (|a - b| itself when a is all zero) */
static inline double check_rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)a[i]));
    }
    return s > 0 ? d / s : d;
}

/* Prints the closing "N passed, M failed" line; returns the exit code. */
static inline int check_finish(void) {
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/* Removes a test's temporary directory and everything below it. */
static inline void check_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[1024];
            if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
                chmod(p, 0700);
                check_remove_tree(p);
            } else {
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

#endif
