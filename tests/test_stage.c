/* The model's stage API (what pipeline schedules run): a model cut into stages of
 * blocks, run micro-batch by micro-batch through activation slots with the boundary
 * activations and gradients copied between stages as a pipeline would send them, gives
 * the whole model's losses and gradients. Blocks and positions bitwise; the tied wte
 * (its gradient is the head's on the last stage plus the embedding's on the first,
 * summed in another order) within 1e-6. Also: each stage holds only its tensors, the
 * position offset reads and writes the right wpe rows, the split backward (B now, W later)
 * equals the fused one (bitwise but wte), interleaved chunks (two ranks holding two
 * block ranges each) give the whole model's losses and gradients, bad slots and shapes
 * fail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/gpt.h"

enum { B = 2, T = 8, MB = 3 };

static const gpt_shape SHAPE = {5, 2, 16, 16, 70, .padded_vocab = 0};

static dt_status make(gpt_model *m, int first, int n, int slots) {
    gpt_layout lay = {.tp = 1, .first_layer = first, .n_layers = n, .slots = slots};
    DT_TRY(gpt_create_layout(m, &SHAPE, dt_ops_cpu(), B, T, 1, &lay));
    gpt_init(m, 7);
    gpt_zero_grad(m);
    return DT_OK;
}

static float *grad_of(gpt_model *m, const char *name) {
    const gpt_tensor *t = gpt_find(m, name);
    return t ? m->grads + t->offset : NULL;
}

int main(void) {
    dt_token tok[MB][B * T], tgt[MB][B * T];
    for (int k = 0; k < MB; k++)
        for (int i = 0; i < B * T; i++) {
            tok[k][i] = (dt_token)((i * 7 + k * 13 + 3) % SHAPE.vocab_size);
            tgt[k][i] = (dt_token)((i * 11 + k * 5 + 1) % SHAPE.vocab_size);
        }
    /* the whole model, micro-batches one after the other (gradient accumulation) */
    gpt_model whole;
    CHECK(make(&whole, 0, 0, 1) == DT_OK, "whole model");
    double want[MB];
    for (int k = 0; k < MB; k++)
        CHECK(gpt_forward_backward(&whole, tok[k], tgt[k], B, T, 0.5f, &want[k]) == DT_OK, "whole fb %d", k);

    /* three stages (2 + 1 + 2 blocks: a count the stages do not divide evenly), GPipe
     * order: every forward, then every backward, activations kept in MB slots */
    gpt_model st[3];
    int first[3] = {0, 2, 3}, n[3] = {2, 1, 2};
    for (int s = 0; s < 3; s++) CHECK(make(&st[s], first[s], n[s], MB) == DT_OK, "stage %d", s);
    CHECK(st[0].has_embed && !st[0].has_head && !st[1].has_embed && !st[1].has_head && st[2].has_head &&
              !st[2].has_embed,
          "stage roles");
    CHECK(gpt_find(&st[0], "wte.weight") && gpt_find(&st[0], "wpe.weight") && !gpt_find(&st[0], "ln_f.weight") &&
              gpt_find(&st[0], "h.1.ln_1.weight") && !gpt_find(&st[0], "h.2.ln_1.weight"),
          "first stage's tensors");
    CHECK(!gpt_find(&st[1], "wte.weight") && gpt_find(&st[1], "h.2.mlp.c_fc.weight") && st[1].ntensors == 12 &&
              st[1].units[0].count == 0 && st[1].units[2].count == 0,
          "middle stage: one block, empty embedding and ln_f units");
    CHECK(gpt_find(&st[2], "wte.weight") && !gpt_find(&st[2], "wpe.weight") && gpt_find(&st[2], "ln_f.bias") &&
              gpt_find(&st[2], "h.4.attn.c_proj.weight"),
          "last stage's tensors (the tied wte too)");
    size_t total = 0;
    for (int s = 0; s < 3; s++) total += st[s].nparams;
    size_t wte = (size_t)gpt_find(&whole, "wte.weight")->numel, wpe = (size_t)gpt_find(&whole, "wpe.weight")->numel;
    CHECK(total == whole.nparams + wte + wpe && st[2].tied_gap == wpe && st[2].units[0].count == st[0].units[0].count,
          "stages hold the model once (wte twice, the last stage's unit 0 padded to the first's): %zu vs %zu", total,
          whole.nparams);
    /* the same initial weights, by name */
    int same = 1;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < st[s].ntensors; i++) {
            const gpt_tensor *a = &st[s].tensors[i], *b = gpt_find(&whole, a->name);
            same &= b && a->numel == b->numel &&
                    !memcmp(st[s].params + a->offset, whole.params + b->offset, a->numel * sizeof(float));
        }
    CHECK(same, "every stage starts from the whole model's weights");

    size_t rows = (size_t)B * T * SHAPE.n_embd;
    double got[MB];
    for (int k = 0; k < MB; k++) {
        for (int s = 0; s < 3; s++) {
            if (s > 0) memcpy(gpt_slot_input(&st[s], k), gpt_slot_output(&st[s - 1], k), rows * sizeof(float));
            CHECK(gpt_forward(&st[s], k, s == 0 ? tok[k] : NULL, B, T, 0) == DT_OK, "forward stage %d mb %d", s, k);
        }
        CHECK(gpt_loss(&st[2], k, tgt[k], 0.5f, &got[k]) == DT_OK, "loss mb %d", k);
    }
    for (int k = 0; k < MB; k++)
        for (int s = 2; s >= 0; s--) {
            if (s < 2) memcpy(gpt_slot_grad(&st[s], k), gpt_slot_grad(&st[s + 1], k), rows * sizeof(float));
            CHECK(gpt_backward(&st[s], k) == DT_OK, "backward stage %d mb %d", s, k);
        }
    for (int k = 0; k < MB; k++) CHECK(got[k] == want[k], "loss of mb %d: %.17g vs %.17g", k, got[k], want[k]);
    int bitwise = 1;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < st[s].ntensors; i++) {
            const gpt_tensor *a = &st[s].tensors[i];
            if (!strcmp(a->name, "wte.weight")) continue;
            int eq = !memcmp(st[s].grads + a->offset, grad_of(&whole, a->name), a->numel * sizeof(float));
            if (!eq) fprintf(stderr, "gradient of %s differs\n", a->name);
            bitwise &= eq;
        }
    CHECK(bitwise, "every gradient but wte's bitwise equal to the whole model's");
    float *dwte = malloc(wte * sizeof(float));
    for (size_t i = 0; i < wte; i++) dwte[i] = grad_of(&st[0], "wte.weight")[i] + grad_of(&st[2], "wte.weight")[i];
    double d = check_rel_diff(grad_of(&whole, "wte.weight"), dwte, wte);
    CHECK(d <= 1e-6, "wte gradient = first stage's + last stage's: %.3g", d);
    free(dwte);

    /* the split backward (zero bubble): every micro-batch's input gradient first, the weight
     * gradients later, gives the fused backward's gradients bitwise */
    gpt_model split;
    gpt_layout sl = {.tp = 1, .slots = MB, .split_backward = 1};
    CHECK(gpt_create_layout(&split, &SHAPE, dt_ops_cpu(), B, T, 1, &sl) == DT_OK, "split model");
    gpt_init(&split, 7);
    gpt_zero_grad(&split);
    for (int k = 0; k < MB; k++) {
        double l;
        CHECK(gpt_forward(&split, k, tok[k], B, T, 0) == DT_OK && gpt_loss(&split, k, tgt[k], 0.5f, &l) == DT_OK &&
                  gpt_backward_input(&split, k) == DT_OK,
              "split F + B, mb %d", k);
    }
    for (int k = 0; k < MB; k++) CHECK(gpt_backward_weight(&split, k) == DT_OK, "W, mb %d", k);
    int same_split = 1; /* wte aside: its head and embedding contributions add up in another order */
    for (int i = 1; i < whole.ntensors; i++) {
        const gpt_tensor *t = &whole.tensors[i];
        same_split &= !memcmp(split.grads + t->offset, whole.grads + t->offset, t->numel * sizeof(float));
    }
    double dw = check_rel_diff(whole.grads, split.grads, whole.tensors[0].numel);
    CHECK(same_split && dw <= 1e-6, "split backward = fused: bitwise but wte (%.3g)", dw);
    CHECK(gpt_backward_input(&whole, 0) == DT_EINPUT, "a split backward on a model without split_backward");
    gpt_destroy(&split);

    double loss;
    gpt_model bad;
    /* interleaved chunks: two ranks holding chunks {[0, 2), [3, 4)} and {[2, 3), [4, 5)},
     * a micro-batch going rank 0, 1, 0, 1 forward and back; slots sized for the largest
     * chunk, one slot per (micro-batch, chunk) pass */
    gpt_model il[2];
    gpt_layout l0 = {.tp = 1, .chunks = 2, .chunk_first = {0, 3}, .chunk_layers = {2, 1}, .slots = 2 * MB};
    gpt_layout l1 = {.tp = 1, .chunks = 2, .chunk_first = {2, 4}, .chunk_layers = {1, 1}, .slots = 2 * MB};
    CHECK(gpt_create_layout(&il[0], &SHAPE, dt_ops_cpu(), B, T, 1, &l0) == DT_OK &&
              gpt_create_layout(&il[1], &SHAPE, dt_ops_cpu(), B, T, 1, &l1) == DT_OK,
          "chunked models");
    CHECK(il[0].has_embed && !il[0].has_head && il[1].has_head && !il[1].has_embed && il[0].nblocks == 3 &&
              gpt_find(&il[0], "h.3.ln_1.weight") && !gpt_find(&il[0], "h.2.ln_1.weight") &&
              gpt_find(&il[1], "h.4.mlp.c_fc.bias") && il[0].units[2].offset < il[0].units[3].offset,
          "chunks hold their blocks, in order, with global names");
    gpt_layout back;
    gpt_stage_layout(&il[0], &back);
    CHECK(back.chunks == 2 && back.chunk_first[1] == 3 && back.chunk_layers[0] == 2, "gpt_stage_layout");
    for (int s = 0; s < 2; s++) {
        gpt_init(&il[s], 7);
        gpt_zero_grad(&il[s]);
    }
    double ilo[MB];
    for (int k = 0; k < MB; k++) {
        for (int g = 0; g < 4; g++) { /* global chunk g: rank g % 2, its chunk g / 2 */
            gpt_model *x = &il[g % 2];
            int slot = 2 * k + g / 2;
            if (g > 0)
                memcpy(gpt_slot_input(x, slot), gpt_slot_output(&il[(g - 1) % 2], 2 * k + (g - 1) / 2),
                       rows * sizeof(float));
            CHECK(gpt_forward_chunk(x, slot, g / 2, tok[k], B, T, 0) == DT_OK, "chunk %d forward, mb %d", g, k);
        }
        CHECK(gpt_loss(&il[1], 2 * k + 1, tgt[k], 0.5f, &ilo[k]) == DT_OK && ilo[k] == want[k], "chunked loss mb %d",
              k);
        CHECK(gpt_loss(&il[0], 2 * k + 1, tgt[k], 0.5f, &loss) == DT_EINPUT, "no loss without the head");
        for (int g = 3; g >= 0; g--) {
            if (g < 3)
                memcpy(gpt_slot_grad(&il[g % 2], 2 * k + g / 2), gpt_slot_grad(&il[(g + 1) % 2], 2 * k + (g + 1) / 2),
                       rows * sizeof(float));
            CHECK(gpt_backward(&il[g % 2], 2 * k + g / 2) == DT_OK, "chunk %d backward, mb %d", g, k);
        }
    }
    int il_same = 1;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < il[s].ntensors; i++) {
            const gpt_tensor *a = &il[s].tensors[i];
            if (strcmp(a->name, "wte.weight"))
                il_same &= !memcmp(il[s].grads + a->offset, grad_of(&whole, a->name), a->numel * sizeof(float));
        }
    CHECK(il_same, "chunked gradients bitwise equal to the whole model's (wte aside)");
    CHECK(gpt_forward_chunk(&il[0], 0, 2, tok[0], B, T, 0) == DT_EINPUT, "a chunk the model does not have");
    gpt_layout overlap = {.tp = 1, .chunks = 2, .chunk_first = {0, 1}, .chunk_layers = {2, 1}};
    CHECK(gpt_create_layout(&bad, &SHAPE, dt_ops_cpu(), B, T, 1, &overlap) == DT_EINPUT, "overlapping chunks");
    gpt_destroy(&bad);
    for (int s = 0; s < 2; s++) gpt_destroy(&il[s]);

    /* the position offset: a micro-batch at positions 5..5+T-1 touches those wpe rows only */
    gpt_model one;
    CHECK(make(&one, 0, 0, 1) == DT_OK, "model for offsets");
    CHECK(gpt_forward(&one, 0, tok[0], B, T, 5) == DT_OK && gpt_loss(&one, 0, tgt[0], 1.0f, &loss) == DT_OK &&
              gpt_backward(&one, 0) == DT_OK,
          "pass at offset 5");
    const float *dwpe = grad_of(&one, "wpe.weight");
    int C = SHAPE.n_embd, outside = 0, inside = 1;
    for (int r = 0; r < SHAPE.seq_len; r++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += fabs(dwpe[r * C + c]);
        if (r >= 5 && r < 5 + T) inside &= s > 0;
        else outside |= s != 0;
    }
    CHECK(inside && !outside, "wpe gradient in rows 5..12 only");
    CHECK(gpt_forward(&one, 0, tok[0], B, T, SHAPE.seq_len - T + 1) == DT_EINPUT, "positions beyond the table");
    CHECK(gpt_forward(&one, 1, tok[0], B, T, 0) == DT_EINPUT, "a slot the layout does not have");
    CHECK(gpt_loss(&st[1], 0, tgt[0], 1.0f, &loss) == DT_EINPUT, "loss on a middle stage");
    CHECK(gpt_forward_backward(&st[0], tok[0], tgt[0], B, T, 1.0f, &loss) == DT_EINPUT, "whole pass on a stage");
    gpt_layout lay = {.tp = 1, .first_layer = 4, .n_layers = 2};
    CHECK(gpt_create_layout(&bad, &SHAPE, dt_ops_cpu(), B, T, 1, &lay) == DT_EINPUT, "blocks beyond the model");
    gpt_destroy(&bad);

    gpt_destroy(&one);
    for (int s = 0; s < 3; s++) gpt_destroy(&st[s]);
    gpt_destroy(&whole);
    return check_finish();
}
