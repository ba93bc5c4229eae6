/* safetensors reader/writer and atomic_file: round trip, every corrupt-header case
 * (bytes built by hand), crash-safe replacement, per-tensor checksums. Usage: test_safetensors SRC_DIR */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "core/atomic_file.h"

#include "check.h"

static char g_dir[64]; /* fresh temp dir */


static void tmp_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static void write_raw(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(buf, 1, n, fp) != n || fclose(fp) != 0) {
        fprintf(stderr, "cannot write test file %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* A safetensors file by hand: length field hlen, header text, data_len zero bytes. */
static void make_file(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t h = strlen(header), n = 8 + h + data_len;
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, h);
    write_raw(path, buf, n);
    free(buf);
}

/* Opening must fail with DT_EINPUT, a message naming the file and containing word. */
static void expect_bad_file(const char *path, const char *word, const char *what) {
    st_file f;
    dt_error_clear();
    dt_status s = st_open(&f, path);
    const char *msg = dt_error_message();
    if (getenv("DT_TEST_VERBOSE")) printf("  %s\n", msg);
    CHECK(s == DT_EINPUT && strstr(msg, path) && strstr(msg, word), "%s: expected DT_EINPUT mentioning '%s'",
          what, word);
    CHECK(f.fp == NULL && f.entries == NULL && f.metadata == NULL, "%s: failed open leaves resources", what);
    st_close(&f); /* must be harmless */
}

static void expect_bad(const char *header, size_t data_len, const char *word) {
    char path[256];
    tmp_path(path, sizeof path, "bad.safetensors");
    make_file(path, strlen(header), header, data_len);
    expect_bad_file(path, word, header);
}

static int count_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int has_tmp_file(const char *dir) {
    DIR *d = opendir(dir);
    int found = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) found = 1;
    closedir(d);
    return found;
}

/* ------------------------------------------------------------ round trip */

static void test_round_trip(void) {
    float zeta[6] = {1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 65504.0f};
    uint8_t alpha[3] = {7, 0, 255}; /* odd size: the next tensor starts unaligned */
    int64_t mid[4] = {INT64_MIN, -1, 0, INT64_MAX};
    uint16_t bf[5] = {0x3f80, 0xbf80, 0x7f80, 0x0001, 0xffff};
    st_tensor_ref t[5] = {
        {"zeta", ST_F32, 2, {2, 3}, zeta},
        {"alpha", ST_U8, 1, {3}, alpha},
        {"mid.weight", ST_I64, 3, {2, 1, 2}, mid},
        {"empty", ST_F16, 2, {0, 4}, NULL},
        {"bf \"q\"\n", ST_BF16, 1, {5}, bf}, /* name needing JSON escapes */
    };
    const char *mk[] = {"format", "step", "note"};
    const char *mv[] = {"pt", "42", "tab\there \"quoted\" \\ back"};
    char path[256];
    tmp_path(path, sizeof path, "model.safetensors");

    dt_error_clear();
    dt_status s = st_write(path, t, 5, mk, mv, 3);
    CHECK(s == DT_OK, "st_write");
    CHECK(!has_tmp_file(g_dir), "st_write left a temp file");

    st_file f;
    dt_error_clear();
    s = st_open(&f, path);
    CHECK(s == DT_OK, "st_open of a written file");
    if (s != DT_OK) return;
    CHECK(f.n == 5, "n = %d", f.n);
    CHECK(f.data_start % 8 == 0, "data_start %llu not 8-aligned", (unsigned long long)f.data_start);
    CHECK(f.file_size == f.data_start + 24 + 3 + 32 + 0 + 10, "file size");
    for (int i = 0; i < 5; i++) {
        const st_entry *e = st_find(&f, t[i].name);
        CHECK(e != NULL, "st_find(%s)", t[i].name);
        if (!e) continue;
        CHECK(e->dtype == t[i].dtype && e->ndim == t[i].ndim, "%s: dtype/ndim", t[i].name);
        CHECK(memcmp(e->shape, t[i].shape, (size_t)e->ndim * sizeof e->shape[0]) == 0, "%s: shape", t[i].name);
        uint64_t n = e->end - e->begin;
        unsigned char buf[64] = {0};
        CHECK(n <= sizeof buf, "%s: size", t[i].name);
        if (n > sizeof buf) continue;
        dt_error_clear();
        CHECK(st_read(&f, e, buf, n) == DT_OK, "st_read(%s)", t[i].name);
        CHECK(n == 0 || memcmp(buf, t[i].data, n) == 0, "%s: data not bitwise equal", t[i].name);
    }
    /* data is laid out in the order given */
    CHECK(st_find(&f, "zeta")->begin == 0 && st_find(&f, "alpha")->begin == 24 &&
              st_find(&f, "mid.weight")->begin == 27,
          "data order");
    CHECK(st_find(&f, "nope") == NULL, "st_find of a missing name");
    CHECK(st_metadata(&f, "step") && strcmp(st_metadata(&f, "step"), "42") == 0, "metadata step");
    CHECK(st_metadata(&f, "note") && strcmp(st_metadata(&f, "note"), mv[2]) == 0, "metadata escapes");
    CHECK(st_metadata(&f, "missing") == NULL, "missing metadata key");
    CHECK(st_metadata(&f, "Format") == NULL, "metadata lookup is case-sensitive");

    /* wrong destination size is refused */
    float small[2];
    dt_error_clear();
    s = st_read(&f, st_find(&f, "zeta"), small, sizeof small);
    CHECK(s == DT_EINPUT && strstr(dt_error_message(), "zeta"), "st_read with wrong dst_bytes");
    st_entry foreign = *st_find(&f, "zeta");
    dt_error_clear();
    CHECK(st_read(&f, &foreign, zeta, sizeof zeta) != DT_OK, "st_read with an entry from elsewhere");
    st_close(&f);
    st_close(&f); /* twice is fine */

    /* header keys: __metadata__ first, then tensors sorted by name; padded with spaces */
    char *raw = NULL;
    size_t len = 0;
    dt_error_clear();
    CHECK(dt_read_file(path, &raw, &len, 1 << 20) == DT_OK, "read back raw file");
    if (!raw) return;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (unsigned char)raw[i];
    CHECK((8 + hlen) % 8 == 0 && hlen < len, "header length %llu", (unsigned long long)hlen);
    CHECK(raw[8] == '{', "header starts with '{'");
    cJSON *root = cJSON_ParseWithLength(raw + 8, (size_t)hlen);
    CHECK(root != NULL, "header parses with cJSON");
    if (root) {
        const cJSON *c = root->child;
        CHECK(c && strcmp(c->string, "__metadata__") == 0, "__metadata__ first");
        const char *prev = "";
        int sorted = 1, count = 0;
        for (c = c ? c->next : NULL; c; c = c->next, count++) {
            if (strcmp(prev, c->string) >= 0) sorted = 0;
            prev = c->string;
        }
        CHECK(sorted && count == 5, "tensor keys sorted by name");
        cJSON_Delete(root);
    }
    /* padding is spaces only */
    const char *close_brace = raw + 8 + hlen - 1;
    while (*close_brace == ' ') close_brace--;
    CHECK(*close_brace == '}', "header padding is spaces");

    /* truncated by one byte: the last tensor runs past the end */
    CHECK(truncate(path, (off_t)len - 1) == 0, "truncate");
    expect_bad_file(path, "offset", "truncated file");
    /* truncated inside the header */
    CHECK(truncate(path, 20) == 0, "truncate");
    expect_bad_file(path, "header", "file truncated inside the header");
    free(raw);
}

static void test_write_errors(void) {
    char path[256];
    tmp_path(path, sizeof path, "w.safetensors");
    float x[2] = {1, 2};
    st_tensor_ref dup[2] = {{"a", ST_F32, 1, {2}, x}, {"a", ST_F32, 1, {2}, x}};
    dt_error_clear();
    CHECK(st_write(path, dup, 2, NULL, NULL, 0) == DT_EINPUT && strstr(dt_error_message(), "duplicate"),
          "duplicate names refused");
    st_tensor_ref neg[1] = {{"a", ST_F32, 1, {-2}, x}};
    dt_error_clear();
    CHECK(st_write(path, neg, 1, NULL, NULL, 0) == DT_EINPUT, "negative dim refused");
    st_tensor_ref nodata[1] = {{"a", ST_F32, 1, {2}, NULL}};
    dt_error_clear();
    CHECK(st_write(path, nodata, 1, NULL, NULL, 0) == DT_EINPUT, "NULL data refused");
    st_tensor_ref reserved[1] = {{"__metadata__", ST_F32, 1, {2}, x}};
    dt_error_clear();
    CHECK(st_write(path, reserved, 1, NULL, NULL, 0) == DT_EINPUT, "reserved name refused");
    CHECK(access(path, F_OK) != 0, "nothing written on error");

    /* empty file: no tensors, no metadata */
    dt_error_clear();
    CHECK(st_write(path, NULL, 0, NULL, NULL, 0) == DT_OK, "empty st_write");
    st_file f;
    dt_error_clear();
    CHECK(st_open(&f, path) == DT_OK && f.n == 0 && f.data_start % 8 == 0, "open empty file");
    st_close(&f);
    unlink(path);
}

/* ------------------------------------------------------------ corrupt files */

static void test_corrupt(void) {
    char path[256];
    tmp_path(path, sizeof path, "bad.safetensors");

    write_raw(path, "\x10\0\0\0\0", 5);
    expect_bad_file(path, "short", "5-byte file");
    write_raw(path, "", 0);
    expect_bad_file(path, "short", "empty file");

    make_file(path, 0, "", 16);
    expect_bad_file(path, "header length is 0", "zero header length");
    make_file(path, 200u << 20, "{}", 0);
    expect_bad_file(path, "limit", "header over 100 MiB");
    make_file(path, UINT64_MAX, "{}", 0);
    expect_bad_file(path, "header", "header length 2^64-1");
    make_file(path, 1000, "{}", 10);
    expect_bad_file(path, "past the end", "header past end of file");

    char missing[256];
    tmp_path(missing, sizeof missing, "does-not-exist.safetensors");
    expect_bad_file(missing, "No such file", "missing file");

    const char *E = "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"; /* a valid entry body */
    char h[512];

    expect_bad("{\"a\":", 0, "JSON");
    expect_bad("not json at all!", 0, "JSON");
    expect_bad("[1,2,3]", 0, "not a JSON object");
    expect_bad("\"str\"", 0, "not a JSON object");
    expect_bad("{} x", 0, "trailing");
    expect_bad("{\"a\":5}", 0, "not a JSON object");
    expect_bad("{\"a\":[1]}", 0, "not a JSON object");

    expect_bad("{\"a\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "dtype");
    expect_bad("{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    expect_bad("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");

    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
               "shape");
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[4503599627370496,4096],\"data_offsets\":[0,8]}}", 8,
               "overflow");

    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 9, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":{\"b\":0}}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "begin");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "need 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, "past the end");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9007199254740984,9007199254740992]}}",
               8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1e300,1e300]}}", 8, "data_offsets");

    snprintf(h, sizeof h, "{\"a\":{%s},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", E);
    expect_bad(h, 12, "overlap");
    snprintf(h, sizeof h, "{\"b\":{%s},\"a\":{%s}}", E, E); /* same range twice */
    expect_bad(h, 8, "overlap");
    snprintf(h, sizeof h, "{\"a\":{%s},\"a\":{%s}}", E, E);
    expect_bad(h, 16, "duplicate");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "duplicate");

    expect_bad("{\"__metadata__\":5}", 0, "__metadata__");
    expect_bad("{\"__metadata__\":{\"k\":5}}", 0, "__metadata__");
    expect_bad("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "duplicate");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate");

    char longname[400];
    memset(longname, 'n', 300);
    longname[300] = 0;
    snprintf(h, sizeof h, "{\"%s\":{%s}}", longname, E);
    expect_bad(h, 8, "too long");

    /* Accepted on purpose: holes between tensors, trailing data, empty tensors anywhere,
     * unknown keys in an entry, trailing whitespace padding, a scalar (shape []). */
    snprintf(h, sizeof h,
             "{\"a\":{%s},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4],\"extra\":1},"
             "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}   \n",
             E);
    make_file(path, strlen(h), h, 40);
    st_file f;
    dt_error_clear();
    dt_status s = st_open(&f, path);
    CHECK(s == DT_OK && f.n == 4, "holes, empty tensor, scalar accepted");
    if (s == DT_OK) {
        const st_entry *sc = st_find(&f, "s");
        CHECK(sc && sc->ndim == 0 && sc->end - sc->begin == 8, "scalar entry");
        CHECK(st_metadata(&f, "x") == NULL, "no metadata");
    }
    st_close(&f);
    unlink(path);
}

/* ------------------------------------------------------------ atomic_file */

static int file_is(const char *path, const char *want) {
    char *buf = NULL;
    size_t len = 0;
    dt_error_clear();
    if (dt_read_file(path, &buf, &len, 1 << 20) != DT_OK) return 0;
    int ok = len == strlen(want) && memcmp(buf, want, len) == 0;
    free(buf);
    return ok;
}

static void test_atomic(void) {
    char path[256];
    tmp_path(path, sizeof path, "state.json");
    int before = count_dir_entries(g_dir);

    dt_error_clear();
    CHECK(dt_write_file_atomic(path, "old", 3) == DT_OK, "dt_write_file_atomic");
    CHECK(file_is(path, "old"), "content after first write");

    dt_atomic_file af;
    dt_error_clear();
    CHECK(dt_atomic_open(&af, path) == DT_OK, "dt_atomic_open over an existing file");
    CHECK(has_tmp_file(g_dir), "temp file exists while writing");
    CHECK(file_is(path, "old"), "old content visible until commit");
    CHECK(dt_atomic_write(&af, "new ", 4) == DT_OK && dt_atomic_write(&af, "content", 7) == DT_OK, "write");
    CHECK(dt_atomic_commit(&af) == DT_OK, "commit");
    CHECK(file_is(path, "new content"), "commit replaced the file");
    CHECK(!has_tmp_file(g_dir), "no temp file after commit");
    dt_atomic_abort(&af); /* after commit: no-op */
    CHECK(file_is(path, "new content"), "abort after commit is harmless");

    dt_error_clear();
    CHECK(dt_atomic_open(&af, path) == DT_OK, "open for abort");
    CHECK(dt_atomic_write(&af, "garbage", 7) == DT_OK, "write before abort");
    dt_atomic_abort(&af);
    dt_atomic_abort(&af);
    CHECK(file_is(path, "new content"), "abort leaves the old file");
    CHECK(!has_tmp_file(g_dir), "abort removes the temp file");
    CHECK(count_dir_entries(g_dir) == before + 1, "only the final file remains");
    dt_error_clear();
    CHECK(dt_atomic_commit(&af) != DT_OK, "commit after abort fails");

    dt_atomic_file zero;
    memset(&zero, 0, sizeof zero);
    int fd0_open = fcntl(0, F_GETFD) != -1;
    dt_atomic_abort(&zero); /* never opened: must not close fd 0 */
    CHECK((fcntl(0, F_GETFD) != -1) == fd0_open, "abort of a zeroed struct closed fd 0");

    /* a stale temp file from a crashed process with our pid is replaced */
    char stale[1200];
    snprintf(stale, sizeof stale, "%s.tmp.%ld", path, (long)getpid());
    write_raw(stale, "stale", 5);
    dt_error_clear();
    CHECK(dt_write_file_atomic(path, "fresh", 5) == DT_OK && file_is(path, "fresh"), "stale temp file");
    CHECK(access(stale, F_OK) != 0, "stale temp file gone");

    /* a file in the current directory (no slash in the path) */
    char cwd[512];
    CHECK(getcwd(cwd, sizeof cwd) != NULL && chdir(g_dir) == 0, "chdir");
    dt_error_clear();
    CHECK(dt_write_file_atomic("plain.txt", "p", 1) == DT_OK && file_is("plain.txt", "p"), "relative path");
    CHECK(chdir(cwd) == 0, "chdir back");

    /* non-existent directory */
    char bad[256];
    tmp_path(bad, sizeof bad, "no-such-dir/x.bin");
    dt_error_clear();
    dt_status s = dt_atomic_open(&af, bad);
    CHECK((s == DT_ERUNTIME || s == DT_EINPUT) && strstr(dt_error_message(), bad), "open in missing dir");
    dt_atomic_abort(&af); /* safe after a failed open */

    /* unwritable directory (root ignores permissions: fall back to /sys, which refuses creates) */
    char ro[256], ro_file[300];
    tmp_path(ro, sizeof ro, "readonly");
    snprintf(ro_file, sizeof ro_file, "%s/x.bin", ro);
    CHECK(mkdir(ro, 0555) == 0, "mkdir readonly");
    dt_error_clear();
    s = dt_atomic_open(&af, ro_file);
    if (s == DT_OK) {
        dt_atomic_abort(&af);
        snprintf(ro_file, sizeof ro_file, "/sys/dt_test_%ld.bin", (long)getpid());
        dt_error_clear();
        s = dt_atomic_open(&af, ro_file);
        if (s == DT_OK) {
            dt_atomic_abort(&af);
            printf("note: running with write access everywhere; unwritable-dir case skipped\n");
        }
    }
    if (s != DT_OK)
        CHECK((s == DT_ERUNTIME || s == DT_EINPUT) && strstr(dt_error_message(), ro_file),
              "open in unwritable dir names the path");

    dt_error_clear();
    CHECK(dt_atomic_open(&af, "") != DT_OK, "empty path refused");
    char dirpath[300];
    snprintf(dirpath, sizeof dirpath, "%s/", g_dir);
    dt_error_clear();
    CHECK(dt_atomic_open(&af, dirpath) != DT_OK, "directory path refused");

    /* dt_fsync_dir */
    dt_error_clear();
    CHECK(dt_fsync_dir(g_dir) == DT_OK, "fsync dir");
    dt_error_clear();
    CHECK(dt_fsync_dir(bad) == DT_ERUNTIME && strstr(dt_error_message(), bad), "fsync missing dir");
}

static void test_read_file(void) {
    char path[256];
    tmp_path(path, sizeof path, "big.txt");
    size_t n = 10000; /* larger than the first read chunk */
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (char)('a' + i % 26);
    write_raw(path, data, n);
    char *buf = NULL;
    size_t len = 0;
    dt_error_clear();
    CHECK(dt_read_file(path, &buf, &len, n) == DT_OK && len == n && memcmp(buf, data, n) == 0 && buf[n] == 0,
          "read file of exactly max_len bytes");
    free(buf);
    dt_error_clear();
    dt_status s = dt_read_file(path, &buf, &len, n - 1);
    CHECK(s == DT_EINPUT && buf == NULL && strstr(dt_error_message(), path) &&
              strstr(dt_error_message(), "larger"),
          "file too big");
    dt_error_clear();
    s = dt_read_file(path, &buf, &len, 100);
    CHECK(s == DT_EINPUT && buf == NULL, "file much too big");
    free(data);

    write_raw(path, "", 0);
    dt_error_clear();
    CHECK(dt_read_file(path, &buf, &len, 10) == DT_OK && len == 0 && buf && buf[0] == 0, "empty file");
    free(buf);

    char missing[256];
    tmp_path(missing, sizeof missing, "missing.txt");
    dt_error_clear();
    s = dt_read_file(missing, &buf, &len, 10);
    CHECK(s == DT_EINPUT && strstr(dt_error_message(), missing), "missing file names the path");
    dt_error_clear();
    s = dt_read_file(g_dir, &buf, &len, 10);
    CHECK(s == DT_EINPUT && strstr(dt_error_message(), g_dir), "directory is not a file");
    unlink(path);
}

/* Checksums: zlib's CRC-32 per tensor in the metadata, the streamed writer's the same
 * bytes, a flipped data bit caught by st_read and st_verify, files without them read. */
static const void *g_fetch[2];
static dt_status fetch_from(void *ctx, int i, const void **data) {
    (void)ctx;
    *data = g_fetch[i];
    return DT_OK;
}

static void test_checksums(void) {
    const char digits[] = "123456789"; /* CRC-32's check value: cbf43926 */
    float b[2] = {1.0f, -2.0f};
    st_tensor_ref t[2] = {{"b", ST_F32, 1, {2}, b}, {"a", ST_U8, 1, {9}, digits}};
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    char path[256], path2[256];
    tmp_path(path, sizeof path, "crc.safetensors");
    tmp_path(path2, sizeof path2, "crc_fetch.safetensors");
    CHECK(st_write(path, t, 2, mk, mv, 1) == DT_OK, "st_write");
    st_file f;
    CHECK(st_open(&f, path) == DT_OK, "open");
    const st_entry *a = st_find(&f, "a");
    CHECK(a && a->has_crc && a->crc == 0xcbf43926u, "crc of '123456789' is cbf43926");
    CHECK(st_metadata(&f, "crc32.a") && !strcmp(st_metadata(&f, "crc32.a"), "cbf43926"), "metadata crc32.a");
    CHECK(st_metadata(&f, "format") && !strcmp(st_metadata(&f, "format"), "pt"), "caller's metadata kept");
    uint64_t off = f.data_start + (a ? a->begin : 0) + 4;
    st_close(&f);

    /* the streamed writer (data asked for as it is written): the same bytes */
    st_tensor_ref u[2] = {t[0], t[1]};
    u[0].data = u[1].data = NULL;
    g_fetch[0] = b;
    g_fetch[1] = digits;
    CHECK(st_write_fetch(path2, u, 2, mk, mv, 1, fetch_from, NULL) == DT_OK, "st_write_fetch");
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK(dt_read_file(path, &x, &nx, 1 << 20) == DT_OK && dt_read_file(path2, &y, &ny, 1 << 20) == DT_OK &&
              nx == ny && !memcmp(x, y, nx), "streamed file = direct file, byte for byte");

    /* one bit flipped in a's data: a's reads fail naming it, b's still work */
    x[off] ^= 0x04;
    write_raw(path, x, nx);
    free(x);
    free(y);
    CHECK(st_open(&f, path) == DT_OK, "open of a file with damaged data (its header is fine)");
    char buf[16];
    float bb[2];
    dt_error_clear();
    dt_status s = st_read(&f, st_find(&f, "a"), buf, 9);
    CHECK(s == DT_EINPUT && strstr(dt_error_message(), "tensor 'a': checksum mismatch") &&
              strstr(dt_error_message(), path), "st_read of the damaged tensor");
    dt_error_clear();
    s = st_verify(&f, st_find(&f, "a"));
    CHECK(s == DT_EINPUT && strstr(dt_error_message(), "checksum mismatch"), "st_verify of the damaged tensor");
    CHECK(st_read(&f, st_find(&f, "b"), bb, sizeof bb) == DT_OK && bb[1] == -2.0f, "the other tensor reads");
    CHECK(st_verify(&f, st_find(&f, "b")) == DT_OK, "the other tensor verifies");
    CHECK(st_read_range(&f, st_find(&f, "a"), 0, buf, 2) == DT_OK, "a range read does not check (st_verify does)");
    st_close(&f);

    /* no checksums (Hugging Face's files): read as before; a checksum for another name is ignored */
    static const char plain[] = "{\"__metadata__\":{\"crc32.zz\":\"00000000\"},\"x\":{\"dtype\":\"U8\","
                                "\"shape\":[2],\"data_offsets\":[0,2]}}";
    make_file(path, strlen(plain), plain, 2);
    CHECK(st_open(&f, path) == DT_OK && !st_find(&f, "x")->has_crc, "open without checksums");
    CHECK(st_read(&f, st_find(&f, "x"), buf, 2) == DT_OK && st_verify(&f, st_find(&f, "x")) == DT_OK,
          "read without checksums");
    st_close(&f);
    expect_bad("{\"__metadata__\":{\"crc32.x\":\"CBF43926\"},\"x\":{\"dtype\":\"U8\",\"shape\":[2],"
               "\"data_offsets\":[0,2]}}", 2, "checksum");
    expect_bad("{\"__metadata__\":{\"crc32.x\":\"cbf4392\"},\"x\":{\"dtype\":\"U8\",\"shape\":[2],"
               "\"data_offsets\":[0,2]}}", 2, "checksum");
    const char *rk[] = {"crc32.a"}, *rv[] = {"0"};
    dt_error_clear();
    CHECK(st_write(path, t, 2, rk, rv, 1) == DT_EINPUT && strstr(dt_error_message(), "reserved"),
          "a caller's crc32.* metadata key is refused");
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv; /* source dir: unused, all inputs are built here */
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_safetensors_XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "mkdtemp failed: %s\n", strerror(errno));
        return 1;
    }
    test_round_trip();
    test_write_errors();
    test_corrupt();
    test_atomic();
    test_read_file();
    test_checksums();
    check_remove_tree(g_dir);
    return check_finish();
}
