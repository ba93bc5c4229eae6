#include "ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/dirs.h"
#include "../core/input_file.h"

typedef struct {
    char name[64];
    long long step;
} step_entry;

/* Value of a run of decimal digits s[0..n) that fits max_digits, or -1. */
static long long parse_digits(const char *s, size_t n, size_t max_digits) {
    if (n == 0 || n > max_digits) return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

long long dt_ckpt_step_of(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *d = name + 5, *end = d + strspn(d, "0123456789");
    long long step = parse_digits(d, (size_t)(end - d), 18);
    if (step < 0 || *end == 0) return step;
    if (end[0] != '.' || end[1] != 'v') return -1;
    long long k = parse_digits(end + 2, strlen(end + 2), 9);
    return k >= 2 ? step : -1;
}

static int hook_matches(const char *var, const char *point, long long step) {
    const char *want = getenv(var);
    if (!want || !*want) return 0;
    size_t n = strlen(point);
    if (strncmp(want, point, n) != 0) return 0;
    return want[n] == 0 || (want[n] == ':' && strtoll(want + n + 1, NULL, 10) == step);
}

void dt_ckpt_test_crash(const char *point, long long step) {
    if (hook_matches("DT_TEST_CRASH_AT", point, step)) _exit(99);
}

int dt_ckpt_test_fail(const char *point, long long step) { return hook_matches("DT_TEST_FAIL_AT", point, step); }

void dt_ckpt_remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[2048];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", path, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(path);
}

static int is_kind(const char *dir, const char *name, mode_t kind) {
    char p[2048];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &sb) == 0 && (sb.st_mode & S_IFMT) == kind;
}

/* The step directories of DIR (names as above; *out is malloc'd, free it). */
static dt_status list_steps(const char *dir, step_entry **out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return dt_fail(DT_ERUNTIME, "checkpoint dir '%s': cannot list (%s)", dir, strerror(errno));
    int cap = 0;
    dt_status s = DT_OK;
    struct dirent *e;
    while (s == DT_OK && (e = readdir(d))) {
        long long step = dt_ckpt_step_of(e->d_name);
        size_t len = strlen(e->d_name);
        if (step < 0 || len >= sizeof((step_entry *)0)->name || !is_kind(dir, e->d_name, S_IFDIR)) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            step_entry *grown = realloc(*out, (size_t)cap * sizeof **out);
            if (!grown) {
                s = dt_fail(DT_ERUNTIME, "out of memory (checkpoint dir)");
                break;
            }
            *out = grown;
        }
        memcpy((*out)[*count].name, e->d_name, len + 1);
        (*out)[(*count)++].step = step;
    }
    closedir(d);
    if (s != DT_OK) {
        free(*out);
        *out = NULL;
        *count = 0;
    }
    return s;
}

dt_status dt_ckpt_read_latest(const char *dir, char *name, size_t cap) {
    char p[1100];
    snprintf(p, sizeof p, "%s/latest", dir);
    char *txt = NULL;
    size_t len = 0;
    char what[1100];
    snprintf(what, sizeof what, "checkpoint '%s'", dir);
    DT_TRY(dt_input_read(p, what, &txt, &len, 4096)); /* a FIFO here must not block */
    while (len > 0 && (txt[len - 1] == '\n' || txt[len - 1] == '\r' || txt[len - 1] == ' ')) txt[--len] = 0;
    int ok = len > 0 && len < cap && !strchr(txt, '/') && strcmp(txt, "..") && strcmp(txt, ".");
    if (ok) memcpy(name, txt, len + 1);
    free(txt);
    if (!ok) return dt_fail(DT_EINPUT, "checkpoint '%s': 'latest' does not name a step directory", dir);
    return DT_OK;
}

dt_status dt_ckpt_fresh_name(const char *dir, long long step, char *name, size_t cap) {
    char p[2048];
    struct stat sb;
    for (int k = 1; k < 1000000; k++) {
        if (k == 1) snprintf(name, cap, "step_%08lld", step);
        else snprintf(name, cap, "step_%08lld.v%d", step, k);
        snprintf(p, sizeof p, "%s/%s", dir, name);
        if (lstat(p, &sb) != 0) {
            if (errno == ENOENT) return DT_OK;
            return dt_fail(DT_ERUNTIME, "checkpoint '%s': %s", p, strerror(errno));
        }
    }
    return dt_fail(DT_ERUNTIME, "checkpoint dir '%s': no free name for step %lld", dir, step);
}

/* Renames a step directory out of the step namespace first, so a crash while its files
 * are deleted leaves a temporary (removed by the next run), never a broken step. */
static dt_status retire(const char *dir, const step_entry *e) {
    char from[1100], to[1200];
    snprintf(from, sizeof from, "%s/%s", dir, e->name);
    snprintf(to, sizeof to, "%s/.%s.old.%d", dir, e->name, (int)getpid());
    dt_ckpt_remove_flat_dir(to); /* our own pid's leftover: we are the only writer */
    if (rename(from, to) != 0)
        return dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot retire (%s)", from, strerror(errno));
    dt_ckpt_test_crash("retire", e->step);
    dt_ckpt_remove_flat_dir(to);
    return DT_OK;
}

dt_status dt_ckpt_retire_copies(const char *dir, long long step, const char *keep) {
    step_entry *v;
    int n;
    DT_TRY(list_steps(dir, &v, &n));
    dt_status s = DT_OK;
    for (int i = 0; i < n && s == DT_OK; i++)
        if (v[i].step == step && strcmp(v[i].name, keep) != 0) s = retire(dir, &v[i]);
    free(v);
    return s;
}

static int by_step_desc(const void *a, const void *b) {
    long long x = ((const step_entry *)a)->step, y = ((const step_entry *)b)->step;
    return (x < y) - (x > y);
}

dt_status dt_ckpt_prune(const char *dir, int keep_last, int drop_others) {
    if (!drop_others && keep_last <= 0) return DT_OK;
    char latest[256];
    DT_TRY(dt_ckpt_read_latest(dir, latest, sizeof latest));
    long long newest = dt_ckpt_step_of(latest);
    if (newest < 0) return dt_fail(DT_EINPUT, "checkpoint '%s': 'latest' does not name a step directory", dir);
    step_entry *v;
    int n;
    DT_TRY(list_steps(dir, &v, &n));
    qsort(v, (size_t)n, sizeof *v, by_step_desc);
    dt_status s = DT_OK;
    int kept = 1; /* distinct steps kept, the latest included */
    long long prev = newest;
    for (int i = 0; i < n && s == DT_OK; i++) {
        if (!strcmp(v[i].name, latest)) continue;
        int drop = drop_others;
        if (!drop_others) {
            if (v[i].step > newest) continue;
            if (v[i].step != prev) kept++;
            prev = v[i].step;
            drop = v[i].step == newest || kept > keep_last;
        }
        if (drop) s = retire(dir, &v[i]);
    }
    free(v);
    return s;
}

/* The pid in a temporary's name: "latest.tmp.PID" or ".<step dir>.tmp|old.PID"; 0 if
 * the name is not one of ours. */
static int temp_pid(const char *name, int *is_dir) {
    size_t n = strlen(name), k = n;
    while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9') k--;
    long long pid = parse_digits(name + k, n - k, 10);
    if (pid <= 0 || pid > INT_MAX || k < 7) return 0;
    if (k == strlen("latest.tmp.") && !strncmp(name, "latest.tmp.", k)) {
        *is_dir = 0;
        return (int)pid;
    }
    const char *tag = name + k - 5;
    char step[64];
    if (name[0] != '.' || (strncmp(tag, ".tmp.", 5) && strncmp(tag, ".old.", 5)) || k - 6 >= sizeof step) return 0;
    memcpy(step, name + 1, k - 6);
    step[k - 6] = 0;
    *is_dir = 1;
    return dt_ckpt_step_of(step) >= 0 ? (int)pid : 0;
}

/* A zombie (exited, not yet reaped: a rank killed by mpirun lingers so in a container
 * whose init does not reap) is gone. */
static int zombie(int pid) {
    char p[64], buf[256];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *r = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and parentheses */
    return r && r[1] == ' ' && r[2] == 'Z';
}

/* Our own pid is stale too: this run has not started saving. A pid reused by an
 * unrelated live process keeps its leftover until a later run. */
static int pid_alive(int pid) {
    return pid != (int)getpid() && (kill(pid, 0) == 0 || errno == EPERM) && !zombie(pid);
}

static void remove_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char (*names)[256] = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int is_dir, pid = temp_pid(e->d_name, &is_dir);
        if (!pid || pid_alive(pid) || !is_kind(dir, e->d_name, is_dir ? S_IFDIR : S_IFREG)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char (*grown)[256] = realloc(names, (size_t)cap * sizeof *names);
            if (!grown) break;
            names = grown;
        }
        snprintf(names[n++], sizeof *names, "%s", e->d_name);
    }
    closedir(d);
    char p[2048];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (names[i][0] == '.') dt_ckpt_remove_flat_dir(p);
        else unlink(p);
    }
    free(names);
}

dt_status dt_ckpt_latest_bytes(const char *dir, double *bytes) {
    *bytes = 0;
    char name[256], path[1400];
    DT_TRY(dt_ckpt_read_latest(dir, name, sizeof name));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    DIR *d = opendir(path);
    if (!d) return dt_fail(DT_ERUNTIME, "checkpoint '%s': cannot list (%s)", path, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        char f[1700];
        struct stat sb;
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.' && stat(f, &sb) == 0 && S_ISREG(sb.st_mode)) *bytes += (double)sb.st_size;
    }
    closedir(d);
    return DT_OK;
}

/* Whether the resolved step directory lies directly in dir (same directory, any spelling). */
static int lies_in(const char *step_dir, const char *dir) {
    char *a = realpath(step_dir, NULL), *b = realpath(dir, NULL);
    int same = 0;
    if (a && b) {
        char *slash = strrchr(a, '/');
        if (slash && slash != a) *slash = 0;
        same = !strcmp(a, b);
    }
    free(a);
    free(b);
    return same;
}

dt_status dt_ckpt_prepare_dir(const char *dir, const char *resume_step, int overwrite, int *replaces_run) {
    if (replaces_run) *replaces_run = 0;
    DT_TRY(dt_make_dirs(dir, "checkpoint dir"));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_fail(DT_EINPUT, "checkpoint dir '%s': not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return dt_fail(DT_EINPUT, "checkpoint dir '%s': not writable (%s)", dir, strerror(errno));
    step_entry *v;
    int n;
    DT_TRY(list_steps(dir, &v, &n));
    char latest[256], what[300] = "", p[1100];
    snprintf(p, sizeof p, "%s/latest", dir);
    int has_latest = lstat(p, &sb) == 0;
    if (has_latest && dt_ckpt_read_latest(dir, latest, sizeof latest) != DT_OK) {
        dt_error_clear(); /* an unreadable `latest` still means the directory is in use */
        snprintf(latest, sizeof latest, "unreadable");
    }
    if (has_latest) {
        snprintf(what, sizeof what, "latest: %s", latest);
    } else if (n > 0) {
        qsort(v, (size_t)n, sizeof *v, by_step_desc);
        snprintf(what, sizeof what, "newest: %s, no latest", v[0].name);
    }
    free(v);
    int holds = has_latest || n > 0, here = resume_step && lies_in(resume_step, dir);
    if (holds && !here && !overwrite)
        return dt_fail(DT_EINPUT,
                       "checkpoint dir '%s' already holds a run's checkpoints (%s); use --resume %s to continue it "
                       "or --overwrite to start over",
                       dir, what, dir);
    if (replaces_run) *replaces_run = holds && !here;
    remove_stale(dir);
    /* Another copy of the step `latest` names was superseded, or never committed, by a
     * save killed between its rename and the end of its retirement step. */
    long long step = has_latest ? dt_ckpt_step_of(latest) : -1;
    if (step < 0) return DT_OK;
    snprintf(p, sizeof p, "%s/%s/trainer_state.json", dir, latest);
    return stat(p, &sb) == 0 ? dt_ckpt_retire_copies(dir, step, latest) : DT_OK;
}

/* Copy number of a step-directory name: K of ".vK", else 1. */
static long long copy_of(const char *name) {
    const char *v = strstr(name, ".v");
    return v ? strtoll(v + 2, NULL, 10) : 1;
}

static int newest_first(const void *a, const void *b) {
    const step_entry *x = a, *y = b;
    if (x->step != y->step) return (x->step < y->step) - (x->step > y->step);
    long long p = copy_of(x->name), q = copy_of(y->name);
    return (p < q) - (p > q);
}

dt_status dt_ckpt_list_steps(const char *dir, char (**names)[64], long long **steps, int *count) {
    step_entry *v;
    int n;
    *names = NULL;
    *steps = NULL;
    *count = 0;
    DT_TRY(list_steps(dir, &v, &n));
    if (n > 1) qsort(v, (size_t)n, sizeof *v, newest_first); /* v is NULL when n is 0 */
    *names = malloc((size_t)n * sizeof **names + 1);
    *steps = malloc((size_t)n * sizeof **steps + 1);
    if (!*names || !*steps) {
        free(v);
        free(*names);
        free(*steps);
        *names = NULL;
        *steps = NULL;
        return dt_fail(DT_ERUNTIME, "out of memory (checkpoint dir)");
    }
    for (int i = 0; i < n; i++) {
        memcpy((*names)[i], v[i].name, sizeof v[i].name);
        (*steps)[i] = v[i].step;
    }
    *count = n;
    free(v);
    return DT_OK;
}
