/* Token files: round trip, and every malformed file is DT_EINPUT with a message naming
 * the file and the cause. Usage: test_tokenfile SOURCE_DIR */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "data/tokenfile.h"

#include "check.h"


static char g_dir[64];

static void put32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(u >> (8 * i));
}

/* A file with the given header fields followed by body_bytes bytes of token data (all token 1). */
static void write_raw(const char *path, size_t file_bytes_if_short, int32_t magic, int32_t version, int32_t count,
                      size_t body_bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    unsigned char hdr[1024] = {0};
    put32(hdr, magic);
    put32(hdr + 4, version);
    put32(hdr + 8, count);
    if (file_bytes_if_short) {
        fwrite(hdr, 1, file_bytes_if_short, f);
    } else {
        fwrite(hdr, 1, sizeof hdr, f);
        for (size_t i = 0; i < body_bytes; i++) fputc(i % 2 == 0 ? 1 : 0, f);
    }
    fclose(f);
}

/* Expects DT_EINPUT whose message names the file and contains cause. */
static void expect_bad(const char *path, int vocab, const char *cause) {
    dt_tokenfile f;
    dt_error_clear();
    dt_status st = dt_tokenfile_read(&f, path, vocab);
    const char *msg = dt_error_message();
    CHECK(st == DT_EINPUT, "%s: status %d, want DT_EINPUT (%s)", path, st, msg);
    CHECK(strstr(msg, path) != NULL, "message does not name the file: %s", msg);
    CHECK(strstr(msg, cause) != NULL, "message lacks \"%s\": %s", cause, msg);
    CHECK(strchr(msg, '\n') == NULL, "message is not one line: %s", msg);
    CHECK(f.tokens == NULL && f.count == 0, "output not cleared on failure");
    dt_tokenfile_free(&f);
}

static int dir_entries(void) {
    int n = 0;
    DIR *d = opendir(g_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_tokenfile_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[256];

    /* Round trip, including the extreme token values and the exact byte layout. */
    {
        enum { N = 10007 };
        static uint16_t tok[N];
        uint32_t x = 12345;
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            tok[i] = (uint16_t)((x >> 8) % 50257);
        }
        tok[0] = 0;
        tok[N - 1] = 50256;
        snprintf(path, sizeof path, "%s/rt.bin", g_dir);
        dt_status st = dt_tokenfile_write(path, tok, N);
        CHECK(st == DT_OK, "write: %s", dt_error_message());
        CHECK(dir_entries() == 1, "temporary file left behind (%d entries)", dir_entries());
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && sb.st_size == 1024 + 2 * N, "size %lld", (long long)sb.st_size);
        FILE *fp = fopen(path, "rb");
        unsigned char raw[1030] = {0};
        CHECK(fp && fread(raw, 1, sizeof raw, fp) == sizeof raw, "raw read");
        if (fp) fclose(fp);
        CHECK(raw[0] == 0x88 && raw[1] == 0xD8 && raw[2] == 0x34 && raw[3] == 0x01, "magic bytes"); /* 20240520 LE */
        CHECK(raw[4] == 1 && raw[5] == 0 && raw[8] == (N & 0xFF) && raw[9] == (N >> 8), "version/count bytes");
        CHECK(raw[16] == 0 && raw[1023] == 0, "header padding not zero");
        CHECK(raw[1024] == 0 && raw[1025] == 0 && raw[1026] == (tok[1] & 0xFF) && raw[1027] == (tok[1] >> 8),
              "token bytes not little-endian uint16");
        dt_tokenfile f;
        st = dt_tokenfile_read(&f, path, 50257);
        CHECK(st == DT_OK, "read: %s", dt_error_message());
        CHECK(f.count == N, "count %zu", f.count);
        CHECK(f.tokens && memcmp(f.tokens, tok, sizeof tok) == 0, "tokens differ");
        CHECK(strcmp(f.path, path) == 0, "path %s", f.path);
        dt_tokenfile_free(&f);
        CHECK(f.tokens == NULL && f.count == 0, "free clears");
        dt_tokenfile_free(&f); /* idempotent */

        /* Overwrite in place with a different length; empty files are valid. */
        st = dt_tokenfile_write(path, tok, 3);
        CHECK(st == DT_OK && dt_tokenfile_read(&f, path, 50257) == DT_OK && f.count == 3 &&
                  memcmp(f.tokens, tok, 6) == 0,
              "overwrite: %s", dt_error_message());
        dt_tokenfile_free(&f);
        st = dt_tokenfile_write(path, NULL, 0);
        CHECK(st == DT_OK && dt_tokenfile_read(&f, path, 256) == DT_OK && f.count == 0, "empty: %s",
              dt_error_message());
        dt_tokenfile_free(&f);
        CHECK(dir_entries() == 1, "temporary file left behind");
    }

    /* Write failure: directory does not exist -> error, nothing left behind. */
    {
        uint16_t t1 = 1;
        snprintf(path, sizeof path, "%s/nodir/x.bin", g_dir);
        dt_error_clear();
        CHECK(dt_tokenfile_write(path, &t1, 1) == DT_ERUNTIME, "write into missing dir");
        CHECK(strstr(dt_error_message(), "nodir") != NULL, "msg: %s", dt_error_message());
    }

    /* Every bad case. */
    snprintf(path, sizeof path, "%s/missing.bin", g_dir);
    expect_bad(path, 256, "cannot open");

    snprintf(path, sizeof path, "%s/empty.bin", g_dir);
    FILE *fp = fopen(path, "wb");
    if (fp) fclose(fp);
    expect_bad(path, 256, "too short");

    snprintf(path, sizeof path, "%s/short.bin", g_dir);
    write_raw(path, 100, 20240520, 1, 0, 0);
    expect_bad(path, 256, "too short");

    snprintf(path, sizeof path, "%s/magic.bin", g_dir);
    write_raw(path, 0, 20240521, 1, 4, 8);
    expect_bad(path, 256, "bad magic");

    snprintf(path, sizeof path, "%s/version.bin", g_dir);
    write_raw(path, 0, 20240520, 2, 4, 8);
    expect_bad(path, 256, "version");

    snprintf(path, sizeof path, "%s/negative.bin", g_dir);
    write_raw(path, 0, 20240520, 1, -5, 0);
    expect_bad(path, 256, "negative");

    snprintf(path, sizeof path, "%s/truncated.bin", g_dir);
    write_raw(path, 0, 20240520, 1, 10, 19);
    expect_bad(path, 256, "truncated");

    snprintf(path, sizeof path, "%s/huge_count.bin", g_dir);
    write_raw(path, 0, 20240520, 1, 0x7FFFFFFF, 4);
    expect_bad(path, 256, "truncated");

    snprintf(path, sizeof path, "%s/trailing.bin", g_dir);
    write_raw(path, 0, 20240520, 1, 10, 21);
    expect_bad(path, 256, "trailing bytes");

    snprintf(path, sizeof path, "%s/trailing2.bin", g_dir);
    write_raw(path, 0, 20240520, 1, 0, 2);
    expect_bad(path, 256, "trailing bytes");

    /* token >= vocab: the first bad one is named by position and value. */
    {
        uint16_t tok[8] = {0, 1, 255, 300, 7, 999, 2, 3};
        snprintf(path, sizeof path, "%s/vocab.bin", g_dir);
        CHECK(dt_tokenfile_write(path, tok, 8) == DT_OK, "write: %s", dt_error_message());
        expect_bad(path, 256, "token 300 at position 3");
        expect_bad(path, 256, ">= vocab size 256");
        dt_tokenfile f;
        CHECK(dt_tokenfile_read(&f, path, 1000) == DT_OK && f.count == 8, "vocab 1000 accepts");
        dt_tokenfile_free(&f);
        expect_bad(path, 999, "token 999 at position 5");
        expect_bad(path, 0, "invalid vocab size");
    }

    /* Not a regular file. */
    expect_bad(g_dir, 256, "not a readable regular file");

    check_remove_tree(g_dir);
    return check_finish();
}
