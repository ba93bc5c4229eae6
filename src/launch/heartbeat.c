#define _POSIX_C_SOURCE 200809L
#include "launch/heartbeat.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void dt_heartbeat(void) {
    static const char *path;
    static int looked;
    if (!looked) {
        looked = 1;
        path = getenv("DTRAIN_HEARTBEAT");
        if (path && !*path) path = NULL;
    }
    if (path) utimensat(AT_FDCWD, path, NULL, 0); /* mtime = now; a missing file is not our error */
}

void dt_test_fault(long long step, int rank) {
    const char *spec = getenv("DT_TEST_FAULT");
    if (!spec || !*spec) return;
    char kind[8];
    long long at;
    int who;
    if (sscanf(spec, "%7[a-z]:%lld:%d", kind, &at, &who) != 3 || at != step || who != rank) return;
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
