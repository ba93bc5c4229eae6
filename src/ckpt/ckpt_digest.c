/* The weights digest: SHA-256 over every parameter, in name order, as its full fp32
 * little-endian tensor (what bitwise-parity checks compare). */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt_internal.h"

/* SHA-256 over the tensors in name order, each from the views or asked of src. */
static dt_status digest(const gpt_model *m, const dt_ckpt_source *src, char hex[65]) {
    int *order = malloc((size_t)m->ntensors * sizeof(int) + 1);
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    dt_status s = order && ctx ? DT_OK : dt_fail(DT_ERUNTIME, "out of memory (digest)");
    if (s == DT_OK) EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    if (s == DT_OK) gpt_sorted_order(m, order);
    for (int i = 0; s == DT_OK && i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[order[i]];
        const float *p = NULL;
        if (src) s = src->get(src->ctx, 0, order[i], &p);
        else p = ckpt_in_view(m, m->unit_params, order[i]);
        if (s == DT_OK) EVP_DigestUpdate(ctx, p, (size_t)ckpt_saved_numel(t) * sizeof(float));
    }
    if (s == DT_OK) EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    free(order);
    hex[0] = 0;
    for (int i = 0; s == DT_OK && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return s;
}

void dt_weights_digest(const gpt_model *m, char hex[65]) { (void)digest(m, NULL, hex); }

dt_status dt_weights_digest_stream(const gpt_model *m, const dt_ckpt_source *src, char hex[65]) {
    return digest(m, src, hex);
}
