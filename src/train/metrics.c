#include "metrics.h"

#include <errno.h>
#include <string.h>

dt_status dt_metrics_open(dt_metrics *m, const char *path, int append) {
    m->fp = NULL;
    if (!path || !*path) return DT_OK;
    m->fp = fopen(path, append ? "a" : "w");
    if (!m->fp) return dt_fail(DT_EINPUT, "metrics file '%s': cannot open for writing (%s)", path, strerror(errno));
    return DT_OK;
}

void dt_metrics_step(dt_metrics *m, long long step, double loss, double lr, double grad_norm, double tokens_per_s,
                     double ms, double comm_ms) {
    if (!m->fp) return;
    fprintf(m->fp,
            "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens_per_s\": %.2f, \"ms\": %.3f",
            step, loss, lr, grad_norm, tokens_per_s, ms);
    if (comm_ms >= 0) fprintf(m->fp, ", \"comm_ms\": %.3f", comm_ms);
    fputs("}\n", m->fp);
    fflush(m->fp);
}

void dt_metrics_val(dt_metrics *m, long long step, double val_loss) {
    if (!m->fp) return;
    fprintf(m->fp, "{\"event\": \"val\", \"step\": %lld, \"val_loss\": %.9g}\n", step, val_loss);
    fflush(m->fp);
}

void dt_metrics_summary(dt_metrics *m, long long steps, double final_loss, double tokens_per_s,
                        const dt_mem_report *mem, int nranks) {
    if (!m->fp) return;
    fprintf(m->fp, "{\"event\": \"summary\", \"steps\": %lld, \"final_loss\": %.9g, \"tokens_per_s\": %.2f, \"mem\": [",
            steps, final_loss, tokens_per_s);
    for (int r = 0; r < nranks; r++)
        fprintf(m->fp,
                "%s{\"rank\": %d, \"params\": %zu, \"grads\": %zu, \"optim\": %zu, \"activations\": %zu, "
                "\"workspace\": %zu, \"peak_rss\": %zu}",
                r ? ", " : "", r, mem[r].params, mem[r].grads, mem[r].optim, mem[r].activations, mem[r].workspace,
                mem[r].peak_rss);
    fprintf(m->fp, "]}\n");
    fflush(m->fp);
}

void dt_metrics_close(dt_metrics *m) {
    if (m->fp) fclose(m->fp);
    m->fp = NULL;
}
