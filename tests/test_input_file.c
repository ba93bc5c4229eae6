/* src/core/input_file.c: every input is a regular file, opened without blocking. A FIFO
 * with no writer, /dev/zero and a directory are refused at once, naming the key and the
 * file; a regular file is read whole, within its size limit, through a blocking fd. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/input_file.h"

#include "check.h"

/* Expects DT_EINPUT with a one-line message containing each of the given parts. */
static void expect_refused(dt_status st, const char *a, const char *b, const char *c) {
    const char *msg = dt_error_message();
    CHECK(st == DT_EINPUT, "status %d, want DT_EINPUT", st);
    CHECK(strstr(msg, a) && strstr(msg, b) && strstr(msg, c), "message lacks '%s', '%s' or '%s': %s", a, b, c, msg);
    CHECK(!strchr(msg, '\n'), "one line: %s", msg);
    dt_error_clear();
}

int main(void) {
    char dir[] = "/tmp/dt_input_file_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char reg[300], fifo[300], missing[300];
    snprintf(reg, sizeof reg, "%s/a.json", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(missing, sizeof missing, "%s/nope", dir);
    FILE *f = fopen(reg, "w");
    CHECK(f && fputs("{\"x\": 1}\n", f) >= 0 && fclose(f) == 0, "write a regular file");
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");

    /* a regular file: read whole; the fd handed out blocks again (no EAGAIN surprises) */
    char *text = NULL;
    size_t len = 0;
    CHECK(dt_input_read(reg, "data.x", &text, &len, 100) == DT_OK && len == 9 && !strcmp(text, "{\"x\": 1}\n"),
          "regular file read");
    free(text);
    int fd = -1;
    CHECK(dt_input_open(reg, "data.x", &fd) == DT_OK && fd >= 0, "open a regular file");
    CHECK(fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK), "O_NONBLOCK cleared");
    if (fd >= 0) close(fd);
    FILE *fp = NULL;
    CHECK(dt_input_fopen(reg, NULL, &fp) == DT_OK && fp && fgetc(fp) == '{', "fopen a regular file");
    if (fp) fclose(fp);

    /* the size limit */
    text = NULL;
    expect_refused(dt_input_read(reg, "data.x", &text, &len, 4), "data.x: ", reg, "larger than the limit of 4 bytes");
    CHECK(text == NULL, "no buffer on failure");

    /* what is not a regular file, with and without a key: at once, never blocking */
    expect_refused(dt_input_read(fifo, "data.train", &text, &len, 100), "data.train: '", fifo,
                   "' is not a regular file (a FIFO)");
    expect_refused(dt_input_open("/dev/zero", "data.val", &fd), "data.val: '/dev/zero'", "not a regular file",
                   "(a character device)");
    CHECK(fd == -1, "no fd on failure");
    expect_refused(dt_input_fopen(dir, "--config", &fp), "--config: '", dir, "(a directory)");
    CHECK(fp == NULL, "no FILE on failure");
    expect_refused(dt_input_open(missing, "--hostfile", &fd), "--hostfile: cannot open '", missing,
                   "No such file");
    expect_refused(dt_input_open("", "--hostfile", &fd), "--hostfile: ", "cannot open", "empty path");
    expect_refused(dt_read_file(fifo, &text, &len, 100), "'", fifo, "is not a regular file (a FIFO)");
    CHECK(strncmp(dt_error_message(), "unknown", 7) == 0, "cleared");

    /* the quiet variant, for callers that treat an unusable file as absent */
    errno = 0;
    CHECK(dt_input_open_quiet(fifo) == -1 && errno == EINVAL, "quiet: FIFO is EINVAL");
    errno = 0;
    CHECK(dt_input_open_quiet(missing) == -1 && errno == ENOENT, "quiet: missing is ENOENT");
    CHECK(!strncmp(dt_error_message(), "unknown", 7), "quiet records no error: %s", dt_error_message());
    fd = dt_input_open_quiet(reg);
    CHECK(fd >= 0, "quiet: a regular file opens");
    if (fd >= 0) close(fd);

    CHECK(!strcmp(dt_input_kind(S_IFSOCK), "a socket") && !strcmp(dt_input_kind(S_IFBLK), "a block device"),
          "kinds");
    check_remove_tree(dir);
    return check_finish();
}
