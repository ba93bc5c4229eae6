/* Threads per rank (src/launch/threads.c): the node's CPUs shared among its ranks, an
 * explicit request kept, a forced oversubscription flagged; and mkdir -p of output paths
 * (src/core/dirs.c). */
#include <stdlib.h>

#include "check.h"
#include "core/dirs.h"
#include "launch/threads.h"

static void cpus(dt_rank_cpus *r, int first, int n) {
    memset(r->mask, 0, sizeof r->mask);
    for (int c = first; c < first + n; c++) r->mask[c / 64] |= 1ull << (c % 64);
}

static dt_threads_plan plan(dt_rank_cpus *r, int n, int me, int quota) {
    dt_threads_plan p;
    dt_threads_plan_node(r, n, me, quota, &p);
    return p;
}

int main(void) {
    dt_rank_cpus r[8];
    memset(r, 0, sizeof r);
    /* 4 unbound ranks on 2 CPUs (mpirun -np 4 --oversubscribe on this machine): 1 each, no warning */
    for (int i = 0; i < 4; i++) cpus(&r[i], 0, 2);
    dt_threads_plan p = plan(r, 4, 1, 0);
    CHECK(p.threads == 1 && p.sharing == 4 && p.node_cpus == 2 && p.node_threads == 4 && !p.forced_over,
          "4 on 2: %d threads, %d sharing, %d cpus, %d in all, forced %d", p.threads, p.sharing, p.node_cpus,
          p.node_threads, p.forced_over);
    /* 2 unbound ranks on 16 CPUs: 8 each */
    for (int i = 0; i < 2; i++) cpus(&r[i], 0, 16);
    p = plan(r, 2, 0, 0);
    CHECK(p.threads == 8 && p.node_threads == 16, "2 on 16: %d", p.threads);
    /* the same under a cgroup quota of 4 CPUs: 2 each */
    p = plan(r, 2, 0, 4);
    CHECK(p.threads == 2 && p.node_cpus == 4, "quota 4: %d threads, %d cpus", p.threads, p.node_cpus);
    /* mpirun --bind-to core: each rank alone on its CPU */
    cpus(&r[0], 0, 1), cpus(&r[1], 1, 1);
    p = plan(r, 2, 1, 0);
    CHECK(p.threads == 1 && p.sharing == 1 && p.node_cpus == 2, "bound to cores: %d", p.threads);
    /* --bind-to socket: 4 ranks, 2 per 8-CPU socket: 4 each (not 16/4 = 4 by luck: 3 per socket gives 2) */
    for (int i = 0; i < 4; i++) cpus(&r[i], i < 2 ? 0 : 8, 8);
    p = plan(r, 4, 3, 0);
    CHECK(p.threads == 4 && p.sharing == 2 && p.node_cpus == 16, "sockets: %d threads, %d sharing", p.threads, p.sharing);
    for (int i = 0; i < 6; i++) cpus(&r[i], i < 3 ? 0 : 8, 8);
    p = plan(r, 6, 0, 0);
    CHECK(p.threads == 2 && p.node_threads == 12, "3 per socket: %d threads, %d in all", p.threads, p.node_threads);
    /* an explicit request wins, and oversubscribing with it is flagged */
    for (int i = 0; i < 4; i++) cpus(&r[i], 0, 2), r[i].requested = 2, r[i].source = DT_THREADS_CONFIG;
    p = plan(r, 4, 0, 0);
    CHECK(p.threads == 2 && p.source == DT_THREADS_CONFIG && p.node_threads == 8 && p.forced_over,
          "forced: %d threads, %d in all, forced %d", p.threads, p.node_threads, p.forced_over);
    char w[512];
    dt_threads_warning(&p, w, sizeof w);
    CHECK(strstr(w, "warning: 4 ranks with 8 threads in all") && strstr(w, "2 CPUs"), "warning: %s", w);
    /* the wait policy: named unless idle threads already sleep */
    setenv("OMP_WAIT_POLICY", "active", 1);
    dt_threads_warning(&p, w, sizeof w);
    CHECK(strstr(w, "set OMP_WAIT_POLICY=passive") != NULL, "spinning threads: %s", w);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    dt_threads_warning(&p, w, sizeof w);
    CHECK(!strstr(w, "OMP_WAIT_POLICY"), "sleeping threads: %s", w);
    /* requesting 1 thread per rank is never "forced" oversubscription (the ranks are the user's -np) */
    for (int i = 0; i < 4; i++) r[i].requested = 1;
    p = plan(r, 4, 0, 0);
    CHECK(p.threads == 1 && !p.forced_over, "threads=1: forced %d", p.forced_over);
    dt_threads_warning(&p, w, sizeof w);
    CHECK(w[0] == 0, "no warning: %s", w);
    /* OMP_NUM_THREADS as the source */
    for (int i = 0; i < 4; i++) r[i].requested = 3, r[i].source = DT_THREADS_ENV;
    p = plan(r, 1, 0, 0);
    CHECK(p.threads == 3 && p.source == DT_THREADS_ENV && p.forced_over, "env: %d", p.threads);
    dt_threads_describe(&p, w, sizeof w);
    CHECK(strstr(w, "OMP_NUM_THREADS") != NULL, "describe: %s", w);
    /* auto with more ranks than CPUs says the ranks share cores */
    memset(r, 0, sizeof r);
    for (int i = 0; i < 4; i++) cpus(&r[i], 0, 2);
    p = plan(r, 4, 0, 0);
    dt_threads_describe(&p, w, sizeof w);
    CHECK(strstr(w, "automatic: 4 ranks on this node's 2 CPUs") != NULL, "describe: %s", w);

    /* mkdir -p */
    char base[] = "/tmp/dtrain-dirs.XXXXXX";
    CHECK(mkdtemp(base) != NULL, "mkdtemp");
    char d[256], f[256];
    snprintf(d, sizeof d, "%s/a/b/c/", base);
    CHECK(dt_make_dirs(d, "checkpoint dir") == DT_OK, "nested dirs");
    struct stat sb;
    snprintf(f, sizeof f, "%s/a/b/c", base);
    CHECK(stat(f, &sb) == 0 && S_ISDIR(sb.st_mode), "made %s", f);
    CHECK(dt_make_dirs(d, "checkpoint dir") == DT_OK, "existing is fine");
    snprintf(f, sizeof f, "%s/x/y/m.jsonl", base);
    CHECK(dt_make_parent_dirs(f, "metrics file") == DT_OK, "parents");
    snprintf(f, sizeof f, "%s/x/y", base);
    CHECK(stat(f, &sb) == 0 && S_ISDIR(sb.st_mode), "made %s", f);
    CHECK(dt_make_parent_dirs("plain.jsonl", "metrics file") == DT_OK, "no directory part");
    snprintf(f, sizeof f, "%s/file", base);
    FILE *fp = fopen(f, "w");
    if (fp) fclose(fp);
    snprintf(d, sizeof d, "%s/file/sub", base);
    CHECK(dt_make_dirs(d, "checkpoint dir") == DT_EINPUT && strstr(dt_error_message(), "is not a directory") &&
              strstr(dt_error_message(), "checkpoint dir"),
          "file in the way: %s", dt_error_message());
    dt_error_clear();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    CHECK(system(cmd) == 0, "cleanup");
    return check_finish();
}
