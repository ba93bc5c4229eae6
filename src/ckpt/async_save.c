#include "async_save.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

dt_status dt_ckpt_async_wait(dt_ckpt_async *a) {
    if (a->pid <= 0) return DT_OK;
    char msg[1024];
    size_t n = 0;
    for (;;) { /* the message first: a child blocked on a full pipe would never exit */
        ssize_t r = read(a->fd, msg + n, sizeof msg - 1 - n);
        if (r > 0 && (n += (size_t)r) < sizeof msg - 1) continue;
        if (r < 0 && errno == EINTR) continue;
        break;
    }
    msg[n] = 0;
    close(a->fd);
    int status = 0;
    pid_t r;
    while ((r = waitpid(a->pid, &status, 0)) < 0 && errno == EINTR) {}
    long long step = a->step;
    a->pid = 0;
    if (r < 0) return dt_fail(DT_ERUNTIME, "checkpoint of step %lld (background): waitpid: %s", step, strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return DT_OK;
    if (n > 0) return dt_fail(WIFEXITED(status) && WEXITSTATUS(status) == DT_EINPUT ? DT_EINPUT : DT_ERUNTIME,
                              "checkpoint of step %lld (background): %s", step, msg);
    return dt_fail(DT_ERUNTIME, "checkpoint of step %lld (background): the writing process %s %d", step,
                   WIFSIGNALED(status) ? "was killed by signal" : "exited with", WIFSIGNALED(status) ? WTERMSIG(status)
                                                                                         : WEXITSTATUS(status));
}

dt_status dt_ckpt_save_async(dt_ckpt_async *a, const char *dir, const gpt_model *m, float *const *exp_avg,
                             float *const *exp_avg_sq, const dt_train_state *st, const char *config_json,
                             double shard_mb) {
    DT_TRY(dt_ckpt_async_wait(a));
    int p[2];
    if (pipe(p) != 0) return dt_fail(DT_ERUNTIME, "checkpoint: pipe: %s", strerror(errno));
    pid_t parent = getpid();
    fflush(NULL); /* nothing buffered is written twice */
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return dt_fail(DT_ERUNTIME, "checkpoint: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1); /* the parent died before prctl */
        signal(SIGINT, SIG_IGN); /* a terminal's Ctrl-C is the parent's to handle: it waits for us */
        signal(SIGTERM, SIG_IGN);
        signal(SIGUSR1, SIG_IGN);
        dt_error_clear();
        const char *delay = getenv("DT_TEST_SAVE_DELAY_MS"); /* test hook: the parent trains on meanwhile */
        if (delay && atoi(delay) > 0) usleep((useconds_t)atoi(delay) * 1000u);
        dt_status s = dt_ckpt_save(dir, m, exp_avg, exp_avg_sq, st, config_json, shard_mb);
        if (s != DT_OK) {
            const char *msg = dt_error_message();
            ssize_t w = write(p[1], msg, strlen(msg));
            (void)w;
        }
        _exit(s == DT_OK ? 0 : (int)s); /* no atexit handlers: they are the parent's (MPI) */
    }
    close(p[1]);
    a->pid = pid;
    a->fd = p[0];
    a->step = st->step;
    return DT_OK;
}
