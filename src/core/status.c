#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static char g_msg[1024];
static int g_set, g_secondary;

dt_status dt_fail(dt_status code, const char *fmt, ...) {
    if (!g_set) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_msg, sizeof g_msg, fmt, ap);
        va_end(ap);
        /* keep the message on one line */
        for (char *p = g_msg; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
        g_set = 1;
    }
    return code;
}

void dt_error_context(const char *fmt, ...) {
    char prefix[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    /* truncation is acceptable: the message stays one bounded line */
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    g_msg[n] = ':';
    g_msg[n + 1] = ' ';
    size_t rest = sizeof g_msg - n - 3;
    size_t m = strnlen(old, rest);
    memcpy(g_msg + n + 2, old, m);
    g_msg[n + 2 + m] = 0;
    g_set = 1;
}

const char *dt_error_message(void) { return g_set ? g_msg : "unknown error"; }

void dt_error_clear(void) {
    g_msg[0] = 0;
    g_set = 0;
    g_secondary = 0;
}

dt_status dt_fail_secondary(dt_status code, const char *msg) {
    if (!g_set) g_secondary = 1;
    return dt_fail(code, "%s", msg);
}

int dt_error_is_secondary(void) { return g_set && g_secondary; }
