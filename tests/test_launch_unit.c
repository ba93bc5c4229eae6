/* The launcher's pure logic: hostfiles read as Open MPI's mpirun reads them (slots, or
 * exit-2 errors naming the line), and the start-up watchdog's verdict. */
#include <stdlib.h>

#include "check.h"
#include "launch/heartbeat.h"
#include "launch/hostfile.h"

/* slots of text, or -1; the error (if any) in err */
static int hf(const char *text, char *err, size_t cap) {
    dt_error_clear();
    int k = dt_hostfile_slots(text, strlen(text), "H", "node0");
    snprintf(err, cap, "%s", k < 0 ? dt_error_message() : "");
    return k;
}

int main(void) {
    char e[1024];
    /* accepted, with mpirun's count */
    static const struct {
        const char *text;
        int slots;
    } ok[] = {
        {"", 0},
        {"localhost slots=2\n", 2},
        {"localhost slots=2", 2},                 /* no newline at the end */
        {"localhost slots = 2\n", 2},             /* spaces around = */
        {"localhost\tslots=2\tmax_slots=4\n", 2},
        {"# cluster\n\n  \nlocalhost slots=2 # two GPUs\n", 2},
        {"a slots=2\nb slots=3\n", 5},
        {"a\na\nb\n", 3},                        /* a host again: one more slot */
        {"a max_slots=4\n", 4},                  /* max alone: that many */
        {"a count=3\n", 3},
        {"a cpu=3\n", 3},
        {"user@a slots=2\n", 2},
        {"10.0.0.1 slots=2\n10.0.0.2 slots=2\n", 4},
        {"a.example.com slots=2\n", 2},
        {"a slots=2 // comment\n", 2},
        {"/* block\n comment */ a slots=2\n", 2},
        {"a slots=2 gpu\n", 2},                  /* a bare word: mpirun ignores it */
        {"a slots=2\nb slots=3\n^b\n", 2},       /* ^host: left out */
        {"localhost slots=1\nnode0.example\n", 2}, /* this host again (its own name): one more slot */
        {"a slots=2 port=2222\n", 2},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int k = hf(ok[i].text, e, sizeof e);
        CHECK(k == ok[i].slots, "'%s': %d slots, want %d (%s)", ok[i].text, k, ok[i].slots, e);
    }
    /* rejected: exit 2 naming the file, the line and the cause */
    static const struct {
        const char *text, *want;
    } no[] = {
        {"a slots=2\r\n", "line 1: a carriage return (Windows CRLF"},
        {"a slots=2\n\r\nb\n", "line 2: a carriage return"},
        {"a slots=2abc\n", "line 1: slots needs '=' and a whole number (as slots=2), got '2abc'"},
        {"a slots=-1\n", "line 1: slots needs '=' and a whole number"},
        {"a slots=\n", "line 1: slots needs '=' and a whole number"},
        {"a slots\nb\n", "line 1: slots needs '='"},
        {"a\nslots=2\n", "line 2: 'slots' before any host"},
        {"=2\n", "line 1: '=' before any host"},
        {"a slot=2\n", "line 1: unexpected 'slot'"},
        {"a solts=2\n", "line 1: '=' after a word that is no key"},
        {"a slots=2 slots=3\n", "line 1: host 'a' given its slots twice"},
        {"a\na slots=2\n", "line 2: host 'a' given its slots twice"},
        {"localhost\n127.0.0.1 slots=2\n", "line 2: host 'localhost' given its slots twice"},
        {"a slots=4 max_slots=2\n", "line 1: max_slots=2 is less than the host's slots (4)"},
        {"a # last line\n# no newline", "line 2: a comment needs a newline after it"},
        {"a # no newline", "line 1: a comment needs a newline after it"},
        {"\"a\" slots=2\n", "line 1: \"a\": quoted names"},
        {"a b.example\n", "line 1: 'b.example': a second host name"},
        {"a slots=2 boards=1\n", "line 1: unexpected 'boards'"},
        {"a slots=9999999999\n", "line 1: slots: more than 999999999 slots"},
        {"\n\n\na slots=2x\n", "line 4: slots needs"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        int k = hf(no[i].text, e, sizeof e);
        CHECK(k == -1 && strstr(e, "launch: hostfile 'H' ") && strstr(e, no[i].want) &&
                  strstr(e, "(Open MPI's mpirun would reject it)"),
              "'%s': %d, '%s', want '%s'", no[i].text, k, e, no[i].want);
    }

    /* the hosts in file order, and a replica job's share of their slots */
    dt_hostfile_host h[4];
    const char *two = "a slots=2\nb slots=3\n^c\nc slots=4\nd slots=0\n";
    CHECK(dt_hostfile_hosts(two, strlen(two), "H", NULL, h, 4) == 2 && !strcmp(h[0].name, "a") && h[0].slots == 2 &&
              !strcmp(h[1].name, "b") && h[1].slots == 3, "hosts: a:2 b:3 (c left out, d no slots)");
    char list[64];
    CHECK(!dt_hostfile_take(h, 2, 0, 2, list, sizeof list) && !strcmp(list, "a:2"), "take 0+2: %s", list);
    CHECK(!dt_hostfile_take(h, 2, 1, 3, list, sizeof list) && !strcmp(list, "a:1,b:2"), "take 1+3: %s", list);
    CHECK(!dt_hostfile_take(h, 2, 4, 1, list, sizeof list) && !strcmp(list, "b:1"), "take 4+1: %s", list);
    CHECK(dt_hostfile_take(h, 2, 4, 2, list, sizeof list) == -1, "take past the slots");
    CHECK(dt_hostfile_take(h, 2, 0, 5, list, 4) == -1, "take into too small a buffer");

    /* start-up: a rank that has finished no step within the allowance (from `started`) */
    char msg[512];
    dt_beat b[3] = {{0, 7, 11, 105.0, 0}, {1, 0, 12, 101.0, 1}, {2, 3, 13, 50.0, 0} /* the last attempt's */};
    CHECK(!dt_heartbeat_startup_verdict(b, 3, 3, 100.0, 109.0, 10.0, msg, sizeof msg), "within the allowance");
    CHECK(dt_heartbeat_startup_verdict(b, 3, 3, 100.0, 111.0, 10.0, msg, sizeof msg) &&
              !strcmp(msg, "no step within 10 s of the start (--startup-timeout): rank 1 started but finished no step; "
                           "rank 2 not started; the others: rank 0 at step 7"),
          "verdict: %s", msg);
    dt_beat all[2] = {{0, 7, 11, 105.0, 0}, {1, 8, 12, 106.0, 0}};
    CHECK(!dt_heartbeat_startup_verdict(all, 2, 2, 100.0, 1000.0, 10.0, msg, sizeof msg), "every rank stepped");
    CHECK(dt_heartbeat_startup_verdict(all, 2, 4, 100.0, 111.0, 10.0, msg, sizeof msg) &&
              strstr(msg, ": ranks 2, 3 not started; the others: rank 0 at step 7, rank 1 at step 8"),
          "ranks absent: %s", msg);
    /* a start beat arms no step watchdog: a long load is the start-up's business */
    dt_beat loading[1] = {{0, 0, 11, 101.0, 1}};
    CHECK(!dt_heartbeat_verdict(loading, 1, 100.0, 200.0, 3.0, msg, sizeof msg), "start beat: not armed");
    return check_finish();
}
