/* The offload store (src/offload/store.h), both kinds, against an in-memory reference:
 * random passes (ascending ranges with gaps, each adding a known value to what it is
 * handed) checked after every pass through dt_store_read; random unaligned writes and
 * reads; passes after writes see them; the I/O counters; the file's size, zeros at open,
 * removal at close. Then the nvme open's refusals (DT_EINPUT naming the path and cause):
 * no such directory, a file for a directory, a file in use (the first store unharmed),
 * io_uring forbidden (seccomp, as a container may), and with root and mount(2): a
 * filesystem without O_DIRECT, a full one, a read-only one. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "offload/store.h"

#define BLOCK 4096

static char g_dir[512]; /* the nvme files' directory: takes O_DIRECT */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static int takes_odirect(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/.odirect-probe", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_DIRECT, 0600);
    int ok = fd >= 0;
    if (fd >= 0) close(fd);
    unlink(p);
    return ok;
}

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n == 0;
}

static void file_path(char *p, size_t cap, const char *dir, const char *tag) {
    snprintf(p, cap, "%s/dtrain-offload-%s.bin", dir, tag);
}

/* host_alloc/host_free stand-ins for a GPU's page-locked allocator: counted */
static int g_live;
static dt_status counting_alloc(void **p, size_t bytes, const char *what) {
    (void)what;
    if (posix_memalign(p, 4096, bytes)) return dt_fail(DT_ERUNTIME, "alloc");
    g_live++;
    return DT_OK;
}
static void counting_free(void *p) {
    g_live--;
    free(p);
}

static dt_store_opts opts(dt_store_kind kind, const char *dir, const char *tag, int buffers) {
    dt_store_opts o = {.kind = kind, .dir = dir, .tag = tag, .block_bytes = BLOCK, .buffers = buffers};
    return o;
}

/* Element i of a field, as a number (elem 2 or 4), and an addition to it. */
static uint32_t get(const unsigned char *p, size_t elem, size_t i) {
    if (elem == 2) {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}
static void add(unsigned char *p, size_t elem, size_t i, uint32_t d) {
    if (elem == 2) {
        uint16_t v = (uint16_t)(get(p, 2, i) + d);
        memcpy(p + 2 * i, &v, 2);
    } else {
        uint32_t v = get(p, 4, i) + d;
        memcpy(p + 4 * i, &v, 4);
    }
}

/* Every field read back whole equals the reference. */
static int matches(dt_store *s, const unsigned char *ref, size_t n, int nfields, size_t elem, unsigned char *tmp) {
    for (int f = 0; f < nfields; f++) {
        if (dt_store_read(s, f, 0, n, tmp) != DT_OK) return 0;
        if (n && memcmp(tmp, ref + (size_t)f * n * elem, n * elem)) return 0;
    }
    return 1;
}

/* One pass over random ascending ranges with gaps: checks what it is handed against the
 * reference, adds a value depending on pass, field and element, counts blocks touched. */
static int random_pass(dt_store *s, int cpu, unsigned char *ref, size_t n, int nfields, size_t elem, int pass,
                       size_t *touched) {
    size_t epb = BLOCK / elem, k = 0, last_block = SIZE_MAX;
    int ok = dt_store_pass_begin(s) == DT_OK;
    void *fields[3];
    *touched = 0;
    while (ok) {
        k += rnd_below(4) ? 0 : rnd_below(3 * epb); /* a gap now and then */
        if (k >= n) break;
        size_t len = 1 + rnd_below(2 * epb);
        if (len > n - k) len = n - k;
        while (ok && len) {
            size_t got = 0;
            ok = dt_store_pass_range(s, k, len, fields, &got) == DT_OK && got >= 1 && got <= len;
            ok &= cpu ? got == len : (k % epb) + got <= epb; /* nvme: to the end of the block */
            if (!ok) break;
            if (k / epb != last_block) ++*touched, last_block = k / epb;
            for (int f = 0; f < nfields; f++) {
                unsigned char *r = ref + (size_t)f * n * elem;
                ok &= !memcmp(fields[f], r + k * elem, got * elem); /* sees what was written before */
                for (size_t i = 0; i < got; i++) {
                    uint32_t d = (uint32_t)((pass + 1) * 131 + f * 17 + (k + i) % 251);
                    add(fields[f], elem, i, d);
                    add(r, elem, k + i, d);
                }
            }
            k += got;
            len -= got;
        }
    }
    return dt_store_pass_end(s) == DT_OK && ok;
}

/* Random writes and reads of unaligned ranges; returns the blocks the writes touched. */
static int random_access(dt_store *s, unsigned char *ref, size_t n, int nfields, size_t elem, unsigned char *tmp,
                         size_t *wblocks) {
    size_t epb = BLOCK / elem;
    int ok = 1;
    *wblocks = 0;
    for (int t = 0; t < 6 && n; t++) {
        int f = (int)rnd_below((size_t)nfields);
        size_t k = rnd_below(n), len = 1 + rnd_below(n - k < 3 * epb ? n - k : 3 * epb);
        unsigned char *r = ref + (size_t)f * n * elem;
        if (rnd() & 1) {
            for (size_t i = 0; i < len * elem; i++) tmp[i] = (unsigned char)rnd();
            ok &= dt_store_write(s, f, k, len, tmp) == DT_OK;
            memcpy(r + k * elem, tmp, len * elem);
            *wblocks += (k + len - 1) / epb - k / epb + 1;
        } else {
            ok &= dt_store_read(s, f, k, len, tmp) == DT_OK && !memcmp(tmp, r + k * elem, len * elem);
        }
    }
    return ok;
}

static void store_case(dt_store_kind kind, size_t n, int nfields, size_t elem, int buffers, int pinned) {
    char tag[64], path[700];
    snprintf(tag, sizeof tag, "case-%zu-%d-%zu-%d", n, nfields, elem, buffers);
    file_path(path, sizeof path, g_dir, tag);
    const char *kn = kind == DT_STORE_CPU ? "cpu" : "nvme";
    dt_store_opts o = opts(kind, g_dir, tag, buffers);
    if (pinned) o.host_alloc = counting_alloc, o.host_free = counting_free;
    dt_store *s = NULL;
    if (dt_store_open(&s, n, nfields, elem, &o, "test state") != DT_OK) {
        CHECK(0, "%s open n %zu fields %d elem %zu", kn, n, nfields, elem);
        return;
    }
    size_t epb = BLOCK / elem, nblocks = (n + epb - 1) / epb, bytes = n * elem * (size_t)nfields;
    unsigned char *ref = calloc(bytes + 1, 1), *tmp = malloc(n * elem + 1);
    struct stat st;
    if (kind == DT_STORE_NVME) {
        size_t slots = (size_t)buffers < nblocks ? (size_t)buffers : nblocks ? nblocks : 1;
        CHECK(dt_store_file_bytes(s) == nblocks * (size_t)nfields * BLOCK && stat(path, &st) == 0 &&
                  (size_t)st.st_size == dt_store_file_bytes(s),
              "%s: file %zu bytes, on disk %lld", tag, dt_store_file_bytes(s), (long long)st.st_size);
        CHECK(dt_store_host_bytes(s) == slots * (size_t)nfields * BLOCK, "%s: host %zu", tag, dt_store_host_bytes(s));
    } else {
        CHECK(dt_store_file_bytes(s) == 0 && dt_store_host_bytes(s) == bytes && stat(path, &st) != 0,
              "cpu: file %zu host %zu", dt_store_file_bytes(s), dt_store_host_bytes(s));
    }
    CHECK(matches(s, ref, n, nfields, elem, tmp), "%s %s: zeros at open", kn, tag);
    dt_store_stats before, after;
    int ok_pass = 1, ok_match = 1, ok_rand = 1, ok_wbytes = 1;
    for (int pass = 0; pass < 24; pass++) {
        size_t touched = 0, wblocks = 0;
        dt_store_stats_of(s, &before);
        ok_pass &= random_pass(s, kind == DT_STORE_CPU, ref, n, nfields, elem, pass, &touched);
        dt_store_stats_of(s, &after);
        /* a pass writes back exactly the blocks it was asked for, all fields at once */
        if (kind == DT_STORE_NVME)
            ok_wbytes &= after.write_bytes - before.write_bytes == (double)(touched * (size_t)nfields * BLOCK);
        ok_match &= matches(s, ref, n, nfields, elem, tmp);
        if (pass % 3 == 2) {
            dt_store_stats_of(s, &before);
            ok_rand &= random_access(s, ref, n, nfields, elem, tmp, &wblocks);
            dt_store_stats_of(s, &after);
            if (kind == DT_STORE_NVME) /* a write moves the field's block, no more */
                ok_wbytes &= after.write_bytes - before.write_bytes == (double)(wblocks * BLOCK);
            ok_match &= matches(s, ref, n, nfields, elem, tmp);
        }
    }
    CHECK(ok_pass, "%s %s: passes", kn, tag);
    CHECK(ok_match, "%s %s: state equals the reference after every pass and write", kn, tag);
    CHECK(ok_rand, "%s %s: random reads equal the reference", kn, tag);
    CHECK(ok_wbytes, "%s %s: bytes written = blocks touched", kn, tag);
    dt_store_stats_of(s, &after);
    if (kind == DT_STORE_NVME && n)
        CHECK(after.read_bytes >= (double)(nblocks * (size_t)nfields * BLOCK) && after.write_bytes > 0 &&
                  (long long)after.read_bytes % 512 == 0 && after.wait_s >= 0,
              "%s: stats read %.0f write %.0f wait %g", tag, after.read_bytes, after.write_bytes, after.wait_s);
    else if (kind == DT_STORE_CPU)
        CHECK(after.read_bytes == 0 && after.write_bytes == 0, "cpu stats");
    dt_store_close(s);
    CHECK(stat(path, &st) != 0 && errno == ENOENT, "%s: file removed at close", tag);
    if (pinned) CHECK(g_live == 0, "%s: host_alloc'd buffers all freed (%d live)", tag, g_live);
    free(ref);
    free(tmp);
}

/* The read-ahead (dt_store_fetch_begin/take) of a one-field store with 64 KiB blocks:
 * random ranges up to fetch_max taken as begun (and only their 4 KiB pieces read, not
 * whole blocks), taken without a begin or with another range begun, begun and then
 * overwritten by a write or a pass before the take: always the reference's values. The
 * buffer counts in the host bytes. */
static void fetch_case(dt_store_kind kind, size_t n, size_t elem) {
    enum { FBLOCK = 64 << 10 };
    size_t fmax = 5000;
    char tag[64];
    snprintf(tag, sizeof tag, "fetch-%zu-%zu", n, elem);
    const char *kn = kind == DT_STORE_CPU ? "cpu" : "nvme";
    dt_store_opts o = opts(kind, g_dir, tag, 3);
    o.block_bytes = FBLOCK;
    o.fetch_max = fmax;
    dt_store *s = NULL;
    if (dt_store_open(&s, n, 1, elem, &o, "fetch state") != DT_OK) {
        CHECK(0, "%s: open", tag);
        return;
    }
    unsigned char *ref = malloc(n * elem), *tmp = malloc(n * elem);
    for (size_t i = 0; i < n * elem; i++) ref[i] = (unsigned char)rnd();
    CHECK(dt_store_write(s, 0, 0, n, ref) == DT_OK, "%s %s: write", kn, tag);
    size_t nblocks = (n * elem + FBLOCK - 1) / FBLOCK, slots = nblocks < 3 ? nblocks : 3;
    size_t want_host = kind == DT_STORE_CPU ? n * elem : slots * FBLOCK + (fmax * elem + 4095) / 4096 * 4096 + 4096;
    CHECK(dt_store_host_bytes(s) == want_host, "%s %s: host bytes %zu, want %zu", kn, tag, dt_store_host_bytes(s),
          want_host);
    int ok_taken = 1, ok_other = 1, ok_write = 1, ok_pass = 1, ok_bytes = 1;
    dt_store_stats a, b;
    for (int t = 0; t < 40; t++) {
        size_t k = rnd_below(n), len = 1 + rnd_below(n - k < fmax ? n - k : fmax);
        dt_store_stats_of(s, &a);
        dt_store_fetch_begin(s, k, len);
        ok_taken &= dt_store_fetch_take(s, k, len, tmp) == DT_OK && !memcmp(tmp, ref + k * elem, len * elem);
        dt_store_stats_of(s, &b);
        size_t pieces = ((k + len) * elem + 4095) / 4096 - k * elem / 4096; /* the range's 4 KiB pieces */
        if (kind == DT_STORE_NVME) ok_bytes &= b.read_bytes - a.read_bytes == (double)(pieces * 4096);
        /* another range begun: taken by a plain read */
        size_t k2 = rnd_below(n), len2 = 1 + rnd_below(n - k2 < fmax ? n - k2 : fmax);
        dt_store_fetch_begin(s, k, len);
        ok_other &= dt_store_fetch_take(s, k2, len2, tmp) == DT_OK && !memcmp(tmp, ref + k2 * elem, len2 * elem);
        ok_other &= dt_store_fetch_take(s, k, len, tmp) == DT_OK && !memcmp(tmp, ref + k * elem, len * elem);
        /* begun, then written over: the take sees the write */
        dt_store_fetch_begin(s, k, len);
        for (size_t i = 0; i < len * elem; i++) ref[k * elem + i] = (unsigned char)rnd();
        ok_write &= dt_store_write(s, 0, k, len, ref + k * elem) == DT_OK;
        ok_write &= dt_store_fetch_take(s, k, len, tmp) == DT_OK && !memcmp(tmp, ref + k * elem, len * elem);
        /* begun, then a pass adds 1 to the range: the take sees it */
        dt_store_fetch_begin(s, k, len);
        ok_pass &= dt_store_pass_begin(s) == DT_OK;
        for (size_t j = k, got = 0; j < k + len && ok_pass; j += got) {
            void *f[1];
            ok_pass &= dt_store_pass_range(s, j, k + len - j, f, &got) == DT_OK;
            for (size_t i = 0; i < got; i++) add(f[0], elem, i, 1), add(ref + j * elem, elem, i, 1);
        }
        ok_pass &= dt_store_pass_end(s) == DT_OK;
        ok_pass &= dt_store_fetch_take(s, k, len, tmp) == DT_OK && !memcmp(tmp, ref + k * elem, len * elem);
    }
    CHECK(ok_taken, "%s %s: ranges taken as begun", kn, tag);
    CHECK(ok_bytes, "%s %s: a read-ahead reads the range's 4 KiB pieces, not its blocks", kn, tag);
    CHECK(ok_other, "%s %s: another range taken (a plain read)", kn, tag);
    CHECK(ok_write, "%s %s: a write after the begin is seen", kn, tag);
    CHECK(ok_pass, "%s %s: a pass after the begin is seen", kn, tag);
    dt_store_fetch_begin(s, 0, fmax < n ? fmax : n); /* closed with a read-ahead in flight */
    dt_store_close(s);
    free(ref);
    free(tmp);
}

/* Calls out of order are refused (DT_ERUNTIME) and leave the store usable. */
static void misuse(dt_store_kind kind) {
    dt_store_opts o = opts(kind, g_dir, "misuse", 3);
    dt_store *s = NULL;
    void *f[1];
    size_t got;
    float v = 0;
    if (dt_store_open(&s, 5000, 1, 4, &o, "misuse") != DT_OK) {
        CHECK(0, "misuse: open");
        return;
    }
    CHECK(dt_store_pass_range(s, 0, 1, f, &got) == DT_ERUNTIME, "range outside a pass");
    CHECK(dt_store_pass_end(s) == DT_ERUNTIME, "pass_end outside a pass");
    CHECK(dt_store_read(s, 1, 0, 1, &v) == DT_ERUNTIME && dt_store_read(s, 0, 4999, 2, &v) == DT_ERUNTIME,
          "read of a missing field or past the end");
    CHECK(dt_store_pass_begin(s) == DT_OK && dt_store_pass_begin(s) == DT_ERUNTIME, "nested pass");
    CHECK(dt_store_pass_range(s, 2000, 10, f, &got) == DT_OK &&
              dt_store_pass_range(s, 2005, 1, f, &got) == DT_ERUNTIME &&
              dt_store_pass_range(s, 4999, 2, f, &got) == DT_ERUNTIME,
          "range before the previous end, past the end");
    CHECK(dt_store_write(s, 0, 0, 1, &v) == DT_ERUNTIME, "write during a pass");
    CHECK(dt_store_pass_range(s, 2010, 1, f, &got) == DT_OK && got == 1 && dt_store_pass_end(s) == DT_OK,
          "the pass goes on after refusals");
    dt_store_close(s);
    dt_error_clear();
}

/* open must fail with DT_EINPUT, a message holding want and want2, nothing left */
static void refused(const char *dir, const char *tag, size_t n, const char *want, const char *want2, const char *what) {
    dt_store_opts o = opts(DT_STORE_NVME, dir, tag, 3);
    dt_store *s = (dt_store *)&o; /* not NULL: open must clear it */
    dt_error_clear();
    dt_status st = dt_store_open(&s, n, 2, 4, &o, "optimizer state");
    const char *m = dt_error_message();
    CHECK(st == DT_EINPUT && s == NULL && strstr(m, want) && strstr(m, want2) && strstr(m, "optimizer state") &&
              !strchr(m, '\n'),
          "%s: status %d, message '%s'", what, (int)st, m);
    if (st == DT_OK && s) dt_store_close(s);
    dt_error_clear();
}

static void bad_paths(void) {
    char p[700], q[700];
    snprintf(p, sizeof p, "%s/no-such-dir", g_dir);
    refused(p, "x", 1000, p, "no such directory", "missing directory");
    snprintf(p, sizeof p, "%s/a-file", g_dir);
    FILE *fp = fopen(p, "w");
    if (fp) fclose(fp);
    refused(p, "x", 1000, p, "not a directory", "regular file as directory");
    unlink(p);

    /* the same file twice: the second refused, the first untouched and working */
    dt_store_opts o = opts(DT_STORE_NVME, g_dir, "twice", 3);
    dt_store *a = NULL;
    CHECK(dt_store_open(&a, 5000, 2, 4, &o, "first") == DT_OK, "first open");
    if (a) {
        float v[5000], w[5000];
        for (int i = 0; i < 5000; i++) v[i] = (float)i * 0.5f;
        CHECK(dt_store_write(a, 1, 0, 5000, v) == DT_OK, "first write");
        file_path(q, sizeof q, g_dir, "twice");
        refused(g_dir, "twice", 5000, q, "in use", "same file twice");
        struct stat st;
        CHECK(stat(q, &st) == 0 && (size_t)st.st_size == dt_store_file_bytes(a), "in use: file kept whole");
        memset(w, 0, sizeof w);
        CHECK(dt_store_read(a, 1, 0, 5000, w) == DT_OK && !memcmp(v, w, sizeof v), "in use: first store's data intact");
        void *f[2];
        size_t got;
        int ok = dt_store_pass_begin(a) == DT_OK && dt_store_pass_range(a, 0, 10, f, &got) == DT_OK &&
                 ((float *)f[1])[3] == 1.5f && dt_store_pass_end(a) == DT_OK;
        CHECK(ok, "in use: first store still passes");
        dt_store_close(a);
    }

    /* a stale file (a crashed run's) is taken over: zeros, removed at close */
    file_path(q, sizeof q, g_dir, "stale");
    int fd = open(q, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    unsigned char junk[8192];
    memset(junk, 0xab, sizeof junk);
    CHECK(fd >= 0 && write(fd, junk, sizeof junk) == (ssize_t)sizeof junk, "stale file written");
    if (fd >= 0) close(fd);
    o = opts(DT_STORE_NVME, g_dir, "stale", 3);
    CHECK(dt_store_open(&a, 3000, 1, 4, &o, "stale") == DT_OK, "stale file taken over");
    if (a) {
        uint32_t z[3000];
        memset(z, 0xff, sizeof z);
        int zero = dt_store_read(a, 0, 0, 3000, z) == DT_OK;
        for (int i = 0; i < 3000; i++) zero &= z[i] == 0;
        CHECK(zero, "stale file: zeros");
        dt_store_close(a);
        CHECK(access(q, F_OK) != 0, "stale file removed at close");
    }

    if (geteuid() != 0) { /* root writes anywhere: only a read-only filesystem refuses it (below) */
        snprintf(p, sizeof p, "%s/readonly", g_dir);
        mkdir(p, 0555);
        refused(p, "x", 1000, p, "not writable", "directory without write permission");
        rmdir(p);
    }
}

/* In a child whose seccomp filter answers io_uring_setup with EPERM (what a container
 * forbidding io_uring does): open refuses with one line and leaves no file. */
static void io_uring_forbidden(void) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct sock_filter filt[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {.len = sizeof filt / sizeof filt[0], .filter = filt};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) _exit(77);
        refused(g_dir, "uring", 1000, "io_uring is not available", "Operation not permitted", "io_uring forbidden");
        char p[700];
        file_path(p, sizeof p, g_dir, "uring");
        CHECK(access(p, F_OK) != 0, "io_uring forbidden: the file is removed");
        fflush(stderr);
        _exit(g_fail ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
          "io_uring forbidden: child status %d", status);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
        printf("note: no seccomp here: the io_uring refusal is not checked\n");
    else
        g_pass += 2; /* the child's two checks */
}

/* A tmpfs (or ramfs) mounted on a fresh directory under g_dir; 0 when mounting is not possible. */
static int mount_fs(char *mnt, size_t cap, const char *type, unsigned long flags, const char *data) {
    snprintf(mnt, cap, "%s/mnt-XXXXXX", g_dir);
    if (!mkdtemp(mnt)) return 0;
    if (mount(type, mnt, type, flags, data) != 0) {
        rmdir(mnt);
        return 0;
    }
    return 1;
}
static void unmount_fs(const char *mnt) {
    CHECK(umount(mnt) == 0 && rmdir(mnt) == 0, "unmount %s: %s", mnt, strerror(errno));
}

static void bad_filesystems(void) {
    char mnt[700];
    if (geteuid() != 0 || !mount_fs(mnt, sizeof mnt, "tmpfs", 0, "size=4m")) {
        printf("note: cannot mount here (not root, or no mount permission): the no-O_DIRECT, full and "
               "read-only filesystem checks are skipped\n");
        return;
    }
    /* tmpfs takes O_DIRECT since Linux 6.6; ramfs never does */
    if (takes_odirect(mnt)) {
        unmount_fs(mnt);
        if (!mount_fs(mnt, sizeof mnt, "ramfs", 0, "")) mnt[0] = 0;
    }
    if (mnt[0] && !takes_odirect(mnt)) {
        refused(mnt, "x", 1000, mnt, "does not support O_DIRECT", "filesystem without O_DIRECT");
        CHECK(dir_is_empty(mnt), "no O_DIRECT: nothing left behind");
    } else {
        printf("note: no filesystem without O_DIRECT could be mounted: that check is skipped\n");
    }
    if (mnt[0]) unmount_fs(mnt);

    if (mount_fs(mnt, sizeof mnt, "tmpfs", 0, "size=1m")) {
        if (takes_odirect(mnt)) {
            char p[800];
            file_path(p, sizeof p, mnt, "full");
            refused(mnt, "full", 1 << 20, p, "no room: 8 MiB needed, ", "full filesystem");
            CHECK(dir_is_empty(mnt), "full: nothing left behind");
        } else {
            printf("note: tmpfs does not take O_DIRECT here: the full filesystem check is skipped\n");
        }
        unmount_fs(mnt);
    }
    if (mount_fs(mnt, sizeof mnt, "tmpfs", MS_RDONLY, "size=1m")) {
        refused(mnt, "x", 1000, mnt, "not writable (creating", "read-only filesystem");
        unmount_fs(mnt);
    }
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-store-XXXXXX");
    if (!mkdtemp(g_dir) || !takes_odirect(g_dir)) {
        if (g_dir[0] && strcmp(g_dir, "/tmp/dtrain-store-XXXXXX")) rmdir(g_dir);
        snprintf(g_dir, sizeof g_dir, "dtrain-store-XXXXXX"); /* the build directory, where ctest runs us */
        if (!mkdtemp(g_dir) || !takes_odirect(g_dir)) {
            printf("skip: neither /tmp nor the working directory takes O_DIRECT\n");
            if (g_dir[0]) rmdir(g_dir);
            return 77;
        }
    }
    for (int k = 0; k < 2; k++) {
        dt_store_kind kind = k ? DT_STORE_NVME : DT_STORE_CPU;
        store_case(kind, 3 * 1024 + 77, 1, 4, 3, 0);  /* 4 blocks, the last partial */
        store_case(kind, 7 * 1024 + 1, 3, 4, 3, 1);   /* 8 blocks, host_alloc'd buffers */
        store_case(kind, 9 * 2048 + 999, 2, 2, 5, 0); /* elem 2, more slots */
        store_case(kind, 4 * 2048, 3, 2, 4, 0);       /* a multiple of the block */
        store_case(kind, 100, 2, 4, 8, 0);            /* one partial block, slots capped */
        store_case(kind, 0, 1, 4, 3, 0);              /* empty */
    }
    fetch_case(DT_STORE_NVME, 200000, 4); /* 13 blocks */
    fetch_case(DT_STORE_NVME, 70001, 2);  /* elem 2, the last block partial */
    fetch_case(DT_STORE_CPU, 70001, 4);
    misuse(DT_STORE_CPU);
    misuse(DT_STORE_NVME);
    bad_paths();
    io_uring_forbidden();
    bad_filesystems();
    CHECK(dir_is_empty(g_dir), "nothing left in %s", g_dir);
    check_remove_tree(g_dir);
    return check_finish();
}
