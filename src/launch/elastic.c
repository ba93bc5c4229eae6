#define _POSIX_C_SOURCE 200809L
#include "launch/elastic.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/input_file.h"
#include "core/timer.h"

int dt_elastic_wait_world(const dt_launch_opts *o, const dt_config *c, long long gb, volatile sig_atomic_t *stop,
                          dt_status *err) {
    double until = dt_now() + o->wait_timeout;
    int said = 0;
    for (;;) {
        int slots = o->hostfile ? dt_launch_hostfile_slots(o->hostfile) : o->nproc;
        if (slots < 0) {
            *err = DT_EINPUT;
            return -1;
        }
        int world = dt_launch_world(o, c, gb, slots);
        if (world) {
            if (said) dt_launch_say("%s now offers %d slot%s", o->hostfile, slots, slots == 1 ? "" : "s");
            return world;
        }
        if (dt_now() >= until) {
            char waited[64] = "";
            if (said) snprintf(waited, sizeof waited, " (waited %g s, --wait-timeout)", o->wait_timeout);
            dt_fail(DT_ERUNTIME, "launch: %s offers %d slot%s, fewer than a world of at least --min-ranks %d needs%s",
                    o->hostfile ? o->hostfile : "-n", slots, slots == 1 ? "" : "s", o->min_ranks, waited);
            *err = DT_ERUNTIME;
            return -1;
        }
        if (!said)
            dt_launch_say(
                "%s offers %d slot%s, fewer than a world of at least --min-ranks %d needs: waiting up to %g s for more "
                "(--wait-timeout)", o->hostfile, slots, slots == 1 ? "" : "s", o->min_ranks, o->wait_timeout);
        said = 1;
        dt_launch_nap(1.0);
        if (*stop) return 0;
    }
}

/* checkpoint.dir's `latest` (the step directory last committed), or "" */
static void read_latest(const char *dir, char *out, size_t cap) {
    char p[DT_PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/latest", dir);
    out[0] = 0;
    int fd = dt_input_open_quiet(p); /* a FIFO would block the launcher */
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return;
    }
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

void dt_grow_start(dt_grow *g, const dt_launch_opts *o, const dt_config *c, long long gb, int world) {
    memset(g, 0, sizeof *g);
    g->o = o;
    g->c = c;
    g->gb = gb;
    g->world = world;
    g->host_mtime = -1.0;
}

int dt_grow_due(dt_grow *g) {
    if (!g->o->grow || g->world >= g->o->nproc) return 0;
    struct stat st;
    double now = dt_now(), mt = -1.0;
    long long size = -1;
    if (stat(g->o->hostfile, &st) == 0) {
        mt = (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
        size = (long long)st.st_size;
    }
    if (mt != g->host_mtime || size != g->host_size || now >= g->next_read) { /* changed, or a while ago */
        g->host_mtime = mt;
        g->host_size = size;
        g->next_read = now + 5.0;
        int slots = dt_launch_hostfile_slots(g->o->hostfile);
        if (slots < 0) dt_error_clear(); /* being rewritten: the next look decides */
        int w = slots > 0 ? dt_launch_world(g->o, g->c, g->gb, slots) : 0;
        if (w > g->world && w != g->target) {
            g->target = w;
            read_latest(g->c->checkpoint.dir, g->latest, sizeof g->latest);
            dt_launch_say("%s offers %d slots: growing from %d to %d ranks at the next checkpoint",
                g->o->hostfile, slots,
                g->world, w);
        } else if (w <= g->world && g->target) {
            dt_launch_say("%s offers %d slots again: not growing", g->o->hostfile, slots < 0 ? 0 : slots);
            g->target = 0;
        }
    }
    if (!g->target) return 0;
    char now_latest[sizeof g->latest];
    read_latest(g->c->checkpoint.dir, now_latest, sizeof now_latest);
    return strcmp(now_latest, g->latest) != 0;
}
