#define _POSIX_C_SOURCE 200809L
#include "launch/heartbeat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* One rank's file, opened at its first beat: "KIND S pid P", KIND "step" or "start". */
static void beat(const char *kind, long long step, int rank) {
    static int fd = -2;
    if (fd == -2) {
        fd = -1;
        const char *dir = getenv("DTRAIN_HEARTBEAT");
        if (dir && *dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/rank.%d", dir, rank);
            fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644); /* a missing directory is not our error */
        }
    }
    if (fd < 0) return;
    char line[64];
    /* fixed width, the same for both kinds: each beat overwrites the whole of the last one */
    int n = snprintf(line, sizeof line, "%s %*lld pid %10d\n", kind, 25 - (int)strlen(kind), step, (int)getpid());
    if (n > 0) (void)!pwrite(fd, line, (size_t)n, 0); /* mtime = now */
}

void dt_heartbeat(long long step, int rank) { beat("step", step, rank); }

void dt_heartbeat_start(int rank) { beat("start", 0, rank); }

int dt_heartbeat_read(const char *dir, dt_beat *out, int max) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        int rank;
        char tail;
        if (sscanf(e->d_name, "rank.%d%c", &rank, &tail) != 1 || rank < 0) continue;
        char path[4096], line[128];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        struct stat st;
        ssize_t k = fstat(fd, &st) == 0 ? read(fd, line, sizeof line - 1) : -1;
        close(fd);
        if (k <= 0) continue;
        line[k] = 0;
        dt_beat b = {rank, 0, 0, (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec, 0};
        if (sscanf(line, "step %lld pid %d", &b.step, &b.pid) != 2) {
            if (sscanf(line, "start %lld pid %d", &b.step, &b.pid) != 2) continue;
            b.start = 1;
        }
        int i = n++;
        while (i > 0 && out[i - 1].rank > rank) { /* rank order */
            out[i] = out[i - 1];
            i--;
        }
        out[i] = b;
    }
    closedir(d);
    return n;
}

void dt_heartbeat_clear(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "rank.", 5)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* armed: a step finished since the start, stale: none for more than timeout seconds */
#define STALE(x) ((x).mtime > started && !(x).start && now - (x).mtime > timeout)

int dt_heartbeat_verdict(const dt_beat *b, int n, double started, double now, double timeout, char *msg, size_t cap) {
    int stale = 0;
    long long low = 0;
    for (int i = 0; i < n; i++)
        if (STALE(b[i])) {
            if (!stale || b[i].step < low) low = b[i].step;
            stale++;
        }
    if (!stale) return 0;
    /* the stale ranks at the lowest step stopped first: the others went on until they
     * needed them */
    size_t used = 0;
    int k = 0, named = 0;
    double oldest = 0.0;
    for (int i = 0; i < n; i++)
        if (STALE(b[i]) && b[i].step == low) {
            named++;
            if (now - b[i].mtime > oldest) oldest = now - b[i].mtime;
        }
#define PUT(...)                                                                 \
    do {                                                                         \
        if (used < cap) {                                                        \
            int w_ = snprintf(msg + used, cap - used, __VA_ARGS__);              \
            if (w_ > 0) used += (size_t)w_ < cap - used ? (size_t)w_ : cap - used - 1; \
        }                                                                        \
    } while (0)
    PUT("no heartbeat for %.0f s from rank%s", oldest, named > 1 ? "s" : "");
    for (int i = 0; i < n; i++)
        if (STALE(b[i]) && b[i].step == low) PUT("%s %d", k++ ? "," : "", b[i].rank);
    PUT(" (last step %lld)", low);
    int others = n - named;
    if (others > 0) {
        PUT(", stopped first; the others:");
        k = 0;
        for (int i = 0; i < n && k < 8; i++) {
            if (STALE(b[i]) && b[i].step == low) continue;
            PUT("%s rank %d at step %lld (%.0f s ago)", k++ ? "," : "", b[i].rank, b[i].step, now - b[i].mtime);
        }
        if (others > k) PUT(", ...");
    }
    return 1;
}
#undef STALE

int dt_heartbeat_startup_verdict(const dt_beat *b, int n, int world, double started, double now, double startup,
                                 char *msg, size_t cap) {
    if (now - started <= startup) return 0;
    /* per rank of the world: its beat this attempt (NULL: none yet) */
    int waiting = 0, absent = 0, k;
    const dt_beat *of[4096];
    if (world > 4096) world = 4096;
    for (int r = 0; r < world; r++) {
        of[r] = NULL;
        for (int i = 0; i < n; i++)
            if (b[i].rank == r && b[i].mtime > started) of[r] = &b[i];
        if (!of[r]) absent++;
        else if (of[r]->start) waiting++;
    }
    if (!waiting && !absent) return 0;
    size_t used = 0;
    PUT("no step within %.0f s of the start (--startup-timeout):", startup);
    if (waiting) {
        k = 0;
        for (int r = 0; r < world && k < 8; r++)
            if (of[r] && of[r]->start) PUT("%s %d", k++ ? "," : (waiting > 1 ? " ranks" : " rank"), r);
        PUT("%s started but finished no step", waiting > k ? ", ..." : "");
    }
    if (absent) {
        k = 0;
        for (int r = 0; r < world && k < 8; r++)
            if (!of[r]) PUT("%s %d", k++ ? "," : absent > 1 ? (waiting ? "; ranks" : " ranks") : (waiting ? "; rank" : " rank"), r);
        PUT("%s not started", absent > k ? ", ..." : "");
    }
    int others = world - waiting - absent;
    if (others > 0) {
        PUT("; the others:");
        k = 0;
        for (int r = 0; r < world && k < 8; r++)
            if (of[r] && !of[r]->start) PUT("%s rank %d at step %lld", k++ ? "," : "", r, of[r]->step);
        if (others > k) PUT(", ...");
    }
    return 1;
}
#undef PUT

void dt_test_fault(long long step, int rank) {
    const char *spec = getenv("DT_TEST_FAULT");
    if (!spec || !*spec) return;
    char kind[8];
    long long at;
    int who;
    if (sscanf(spec, "%7[a-z]:%lld:%d", kind, &at, &who) != 3) {
        if (sscanf(spec, "%7[a-z]:start:%d", kind, &who) != 2) return;
        at = -1; /* at the start */
    }
    if (at != step || who != rank) return;
    const char *once = getenv("DT_TEST_FAULT_ONCE");
    if (once && *once) {
        int fd = open(once, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0) return; /* fired before */
        close(fd);
    }
    if (!strcmp(kind, "exit")) _exit(9);
    if (!strcmp(kind, "stop")) { /* the whole process, as `kill -STOP` of the rank */
        fprintf(stderr, "test fault: rank %d stops (SIGSTOP) after step %lld\n", rank, step);
        fflush(stderr);
        raise(SIGSTOP);
        return;
    }
    if (!strcmp(kind, "hang"))
        for (;;) pause(); /* signals are recorded by the trainer's handlers and ignored here */
}

void dt_test_straggle(int rank, double seconds) {
    const char *spec = getenv("DT_TEST_STRAGGLER");
    int who;
    double factor, floor_s = 0.0;
    if (!spec || sscanf(spec, "%d:%lf:%lf", &who, &factor, &floor_s) < 2 || who != rank || !(factor > 1.0) ||
        !(seconds > 0))
        return;
    double t = (factor - 1.0) * seconds;
    if (floor_s > t && floor_s < 3600) t = floor_s;
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
