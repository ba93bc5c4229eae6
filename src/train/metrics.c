#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../backend/ops.h"
#include "../core/dirs.h"

dt_status dt_metrics_open(dt_metrics *m, const char *path, int append) {
    memset(m, 0, sizeof *m);
    m->fail_step = -1;
    if (!path || !*path) return DT_OK;
    snprintf(m->path, sizeof m->path, "%s", path);
    DT_TRY(dt_make_parent_dirs(path, "metrics file"));
    m->fp = fopen(path, append ? "a+" : "w"); /* a+: the last byte is read below */
    if (!m->fp) return dt_fail(DT_EINPUT, "metrics file '%s': cannot open for writing (%s)", path, strerror(errno));
    /* A line cut short (a full disk, a kill mid-write) would get this run's first record
     * glued to it, losing both: end it, so it stays one torn line that readers skip. */
    struct stat st;
    char last = '\n';
    if (append && fstat(fileno(m->fp), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        pread(fileno(m->fp), &last, 1, st.st_size - 1) == 1 && last != '\n')
        fputc('\n', m->fp);
    return DT_OK;
}

/* JSON number, or null for NaN and infinities. */
static const char *num(char *buf, size_t cap, const char *fmt, double v) {
    if (!isfinite(v)) return "null";
    snprintf(buf, cap, fmt, v);
    return buf;
}

/* Closes the object with its wall-clock time (Unix seconds) and flushes the line; the first failure is reported at once on stderr (not through
 * dt_fail: training goes on, the run ends with the error in dt_metrics_close). */
static void end_line(dt_metrics *m, long long step) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(m->fp, ", \"time\": %.3f}\n", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    errno = 0;
    if ((fflush(m->fp) != 0 || ferror(m->fp)) && m->fail_step < 0) {
        m->fail_step = step;
        m->fail_errno = errno ? errno : EIO;
        fprintf(stderr, "dtrain: warning: metrics file '%s': write failed at step %lld (%s); training goes on\n",
                m->path, step, strerror(m->fail_errno));
    }
}

void dt_metrics_step(dt_metrics *m, long long step, double loss, double lr, double grad_norm, long long tokens,
                     long long loss_tokens, double tokens_per_s, double ms, double comm_ms, double mfu, const dt_metrics_io *io,
                     const dt_metrics_traffic *tr) {
    if (!m->fp) return;
    char a[40], b[40], c[40];
    fprintf(m->fp, "{\"step\": %lld, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"tokens\": %lld, ", step,
            num(a, sizeof a, "%.9g", loss), num(b, sizeof b, "%.9g", lr), num(c, sizeof c, "%.9g", grad_norm), tokens);
    fprintf(m->fp, "\"loss_tokens\": %lld, \"tokens_per_s\": %s, \"ms\": %s", loss_tokens, num(a, sizeof a, "%.2f", tokens_per_s),
            num(b, sizeof b, "%.3f", ms));
    if (comm_ms >= 0) fprintf(m->fp, ", \"comm_ms\": %s", num(a, sizeof a, "%.3f", comm_ms));
    if (mfu >= 0) fprintf(m->fp, ", \"mfu\": %s", num(a, sizeof a, "%.5f", mfu));
    if (io && io->on)
        fprintf(m->fp, ", \"offload_read_mb\": %s, \"offload_write_mb\": %s, \"offload_wait_ms\": %s",
                num(a, sizeof a, "%.3f", io->read_mb), num(b, sizeof b, "%.3f", io->write_mb),
                num(c, sizeof c, "%.3f", io->wait_ms));
    if (io && io->on)
        fprintf(m->fp, ", \"offload_ms\": %s, \"offload_grads_early_mb\": %s, \"offload_grads_backward_mb\": %s",
                num(a, sizeof a, "%.3f", io->update_ms), num(b, sizeof b, "%.3f", io->grads_early_mb),
                num(c, sizeof c, "%.3f", io->grads_backward_mb));
    if (tr && tr->on)
        fprintf(m->fp, ", \"grad_comm_bytes\": %s, \"param_comm_bytes\": %s, \"dw_gemms_skipped\": %s",
                num(a, sizeof a, "%.0f", tr->grad_comm_bytes), num(c, sizeof c, "%.0f", tr->param_comm_bytes),
                num(b, sizeof b, "%.0f", tr->dw_gemms_skipped));
    end_line(m, step);
}

void dt_metrics_val(dt_metrics *m, long long step, double val_loss) {
    if (!m->fp) return;
    char a[40];
    fprintf(m->fp, "{\"event\": \"val\", \"step\": %lld, \"val_loss\": %s", step, num(a, sizeof a, "%.9g", val_loss));
    end_line(m, step);
}

void dt_metrics_epoch(dt_metrics *m, long long step, long long epoch) {
    if (!m->fp) return;
    fprintf(m->fp, "{\"event\": \"epoch\", \"step\": %lld, \"epoch\": %lld", step, epoch);
    end_line(m, step);
}

void dt_metrics_resume(dt_metrics *m, long long step, const char *dir) {
    if (!m->fp) return;
    fprintf(m->fp, "{\"event\": \"resume\", \"step\": %lld, \"from\": \"", step);
    for (const char *p = dir; *p; p++) /* a path as a JSON string */
        if (*p == '"' || *p == '\\') fprintf(m->fp, "\\%c", *p);
        else if ((unsigned char)*p < 0x20) fprintf(m->fp, "\\u%04x", *p);
        else fputc(*p, m->fp);
    fputc('"', m->fp);
    end_line(m, step);
}

void dt_metrics_summary(dt_metrics *m, long long steps, long long ran, double final_loss, double tokens_per_s,
                        double mfu, const dt_mem_report *mem, int nranks) {
    if (!m->fp) return;
    char a[40], b[40];
    fprintf(m->fp, "{\"event\": \"summary\", \"steps\": %lld, \"steps_run\": %lld, \"final_loss\": %s, "
            "\"tokens_per_s\": %s, \"mem\": [",
            steps, ran, ran > 0 ? num(a, sizeof a, "%.9g", final_loss) : "null",
            ran > 0 ? num(b, sizeof b, "%.2f", tokens_per_s) : "null");
    for (int r = 0; r < nranks; r++)
        fprintf(m->fp,
                "%s{\"rank\": %d, \"params\": %zu, \"grads\": %zu, \"optim\": %zu, \"activations\": %zu, "
                "\"workspace\": %zu, \"peak_rss\": %zu, \"offload_host\": %zu, \"offload_file\": %zu}",
                r ? ", " : "", r, mem[r].params, mem[r].grads, mem[r].optim, mem[r].activations, mem[r].workspace,
                mem[r].peak_rss, mem[r].offload_host, mem[r].offload_file);
    fputc(']', m->fp);
    if (mfu >= 0 && ran > 0) fprintf(m->fp, ", \"mfu\": %s", num(a, sizeof a, "%.5f", mfu));
    end_line(m, steps);
}

dt_status dt_metrics_close(dt_metrics *m) {
    if (!m->fp) return DT_OK;
    errno = 0;
    int bad = fclose(m->fp) != 0;
    m->fp = NULL;
    if (bad && m->fail_step < 0) {
        m->fail_step = 0;
        m->fail_errno = errno ? errno : EIO;
    }
    if (m->fail_step < 0) return DT_OK;
    return dt_fail(DT_ERUNTIME, "metrics file '%s': writes failed from step %lld on (%s)", m->path, m->fail_step,
                   strerror(m->fail_errno));
}

dt_status dt_metrics_peak_flops(const dt_config *c, int on_gpu, dt_comm *world, double *flops, const char **source) {
    double mine = c->log.peak_gflops * 1e9;
    *source = "log.peak_gflops";
    if (mine <= 0 && on_gpu) {
        mine = dt_gpu_bf16_peak();
        *source = "dense bf16 datasheet";
    } else if (mine <= 0) {
        mine = dt_cpu_sgemm_peak(0.1);
        *source = "measured SGEMM";
    }
    double v[2] = {mine, mine <= 0};
    if (dt_comm_size(world) > 1) DT_TRY(dt_allreduce(world, v, 2, DT_F64, DT_SUM));
    *flops = v[1] > 0 ? 0.0 : v[0];
    return DT_OK;
}
