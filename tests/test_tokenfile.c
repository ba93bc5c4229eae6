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
/* A file of exactly these bytes. */
static void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(buf, 1, n, fp) == n, "write %s", path);
    if (fp) fclose(fp);
}

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
        dt_status st = dt_tokenfile_write(path, tok, N, NULL, 0);
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
        st = dt_tokenfile_write(path, tok, 3, NULL, 0);
        CHECK(st == DT_OK && dt_tokenfile_read(&f, path, 50257) == DT_OK && f.count == 3 &&
                  memcmp(f.tokens, tok, 6) == 0,
              "overwrite: %s", dt_error_message());
        dt_tokenfile_free(&f);
        st = dt_tokenfile_write(path, NULL, 0, NULL, 0);
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
        CHECK(dt_tokenfile_write(path, &t1, 1, NULL, 0) == DT_ERUNTIME, "write into missing dir");
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
        CHECK(dt_tokenfile_write(path, tok, 8, NULL, 0) == DT_OK, "write: %s", dt_error_message());
        expect_bad(path, 256, "token 300 at position 3");
        expect_bad(path, 256, ">= vocab size 256");
        dt_tokenfile f;
        CHECK(dt_tokenfile_read(&f, path, 1000) == DT_OK && f.count == 8, "vocab 1000 accepts");
        dt_tokenfile_free(&f);
        expect_bad(path, 999, "token 999 at position 5");
        expect_bad(path, 0, "invalid vocab size");
    }

    /* The tokenizer record: header bytes 12..19 the name, 20..23 the vocabulary; read back,
     * with the largest id; a file of llm.c (zeros there) has none. */
    {
        uint16_t tok[4] = {10, 200, 65, 3};
        snprintf(path, sizeof path, "%s/rec.bin", g_dir);
        CHECK(dt_tokenfile_write(path, tok, 4, "byte", 256) == DT_OK, "write: %s", dt_error_message());
        unsigned char raw[24] = {0};
        FILE *fp = fopen(path, "rb");
        CHECK(fp && fread(raw, 1, sizeof raw, fp) == sizeof raw, "raw read");
        if (fp) fclose(fp);
        CHECK(raw[4] == 1 && !memcmp(raw + 12, "byte\0\0\0\0", 8) && raw[20] == 0 && raw[21] == 1 && raw[22] == 0,
              "record bytes: version 1, 'byte' at 12, 256 at 20");
        dt_tokenfile f;
        CHECK(dt_tokenfile_read(&f, path, 256) == DT_OK, "read: %s", dt_error_message());
        CHECK(!strcmp(f.tokenizer, "byte") && f.tokenizer_vocab == 256 && f.max_token == 200, "record '%s' %d max %u",
              f.tokenizer, f.tokenizer_vocab, f.max_token);
        char note[512];
        dt_error_clear();
        CHECK(dt_tokenfile_check(&f, "data.train", "byte", 256, note, sizeof note) == DT_OK && !note[0],
              "byte data, byte run: %s", dt_error_message());
        /* byte data, GPT-2's tokenizer or vocabulary: exit 2 naming the file and both */
        const char *runs[3][2] = {{"gpt2", "50257"}, {"byte", "50257"}, {"byte", "128"}};
        for (int i = 0; i < 3; i++) {
            dt_error_clear();
            dt_status st = dt_tokenfile_check(&f, "data.train", runs[i][0], atoi(runs[i][1]), note, sizeof note);
            const char *msg = dt_error_message();
            char want[64];
            snprintf(want, sizeof want, "data.tokenizer %s and model.vocab_size %s", runs[i][0], runs[i][1]);
            CHECK(st == DT_EINPUT && strstr(msg, path) && strstr(msg, "the byte tokenizer (vocab 256)") &&
                      strstr(msg, want) && strstr(msg, "data.train"),
                  "mismatch %s/%s: %s", runs[i][0], runs[i][1], msg);
        }
        dt_tokenfile_free(&f);
        /* GPT-2 data may run with a padded vocabulary (llm.c's 50304), not a far larger one */
        CHECK(dt_tokenfile_write(path, tok, 4, "gpt2", 50257) == DT_OK && dt_tokenfile_read(&f, path, 65536) == DT_OK,
              "gpt2 record: %s", dt_error_message());
        CHECK(dt_tokenfile_check(&f, "data.val", "gpt2", 50304, note, sizeof note) == DT_OK, "padded 50304: %s",
              dt_error_message());
        CHECK(dt_tokenfile_check(&f, "data.val", "gpt2", 51200, note, sizeof note) == DT_OK, "padded 51200");
        CHECK(dt_tokenfile_check(&f, "data.val", "gpt2", 65536, note, sizeof note) == DT_EINPUT, "65536 refused");
        CHECK(dt_tokenfile_check(&f, "data.val", "gpt2", 50256, note, sizeof note) == DT_EINPUT, "50256 refused");
        dt_tokenfile_free(&f);
        /* no record (llm.c's files, older dtrain's): accepted; a note when the ids stay far below */
        CHECK(dt_tokenfile_write(path, tok, 4, NULL, 0) == DT_OK && dt_tokenfile_read(&f, path, 50257) == DT_OK &&
                  !f.tokenizer[0] && f.tokenizer_vocab == 0,
              "unrecorded: %s", dt_error_message());
        CHECK(dt_tokenfile_check(&f, "data.train", "gpt2", 50257, note, sizeof note) == DT_OK &&
                  strstr(note, path) && strstr(note, "largest token id 200") && strstr(note, "50257") &&
                  !strchr(note, '\n'),
              "far below: note '%s'", note);
        CHECK(dt_tokenfile_check(&f, "data.train", "byte", 256, note, sizeof note) == DT_OK && !note[0],
              "200 of 256: no note '%s'", note);
        CHECK(dt_tokenfile_check(&f, "data.train", "byte", 800, note, sizeof note) == DT_OK && !note[0],
              "200 of 800 (not below a quarter): no note '%s'", note);
        CHECK(dt_tokenfile_check(&f, "data.train", "byte", 801, note, sizeof note) == DT_OK && note[0],
              "200 of 801: a note");
        dt_tokenfile_free(&f);
        /* a header that is neither zeros nor a record */
        unsigned char hdr[1028] = {0};
        put32(hdr, 20240520);
        put32(hdr + 4, 1);
        put32(hdr + 8, 2);
        memcpy(hdr + 12, "BYTE", 4);
        put32(hdr + 20, 256);
        write_bytes(path, hdr, sizeof hdr);
        expect_bad(path, 256, "not a tokenizer record");
        memcpy(hdr + 12, "byte", 4);
        put32(hdr + 20, 0);
        write_bytes(path, hdr, sizeof hdr);
        expect_bad(path, 256, "not a tokenizer record");
        CHECK(dt_tokenfile_write(path, tok, 4, "much-too-long", 256) == DT_EINPUT, "a name over 8 bytes refused");
    }

    /* Not a regular file: a directory; a FIFO, whose open must not block (no writer ever
     * comes); /dev/zero, which never ends. */
    expect_bad(g_dir, 256, "is not a regular file (a directory)");
    snprintf(path, sizeof path, "%s/fifo.bin", g_dir);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    expect_bad(path, 256, "is not a regular file (a FIFO)");
    unlink(path);
    expect_bad("/dev/zero", 256, "is not a regular file (a character device)");

    check_remove_tree(g_dir);
    return check_finish();
}
