/* Status codes and the one error message that travels up to main().
 * Library code never prints errors or exits: it records a message with
 * dt_fail() and returns the code; main() prints it once. */
#ifndef DT_STATUS_H
#define DT_STATUS_H

typedef enum {
    DT_OK = 0,
    DT_ERUNTIME = 1, /* I/O, communication, out of memory: exit code 1 */
    DT_EINPUT = 2,   /* bad usage, config, data or checkpoint file: exit code 2 */
    DT_EINTERRUPTED = 3, /* stopped by SIGINT/SIGTERM after saving: exit code 128 + signal */
} dt_status;

/* Records "fmt..." as the current error (first failure wins until cleared) and returns code. */
dt_status dt_fail(dt_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Replaces the current message with "prefix: message" (adds context on the way up). */
void dt_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *dt_error_message(void);
/* Records msg as an error this process only learnt of (another rank's failure), so the
 * rank where it happened is the one that reports it. */
dt_status dt_fail_secondary(dt_status code, const char *msg);
int dt_error_is_secondary(void);
void dt_error_clear(void);

#define DT_TRY(expr)                      \
    do {                                  \
        dt_status dt_try_s_ = (expr);     \
        if (dt_try_s_ != DT_OK) return dt_try_s_; \
    } while (0)

#endif
