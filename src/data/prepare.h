/* Text files -> train/val token files (tokenfile.h layout). */
#ifndef DT_PREPARE_H
#define DT_PREPARE_H
#include <stddef.h>
#include "../core/status.h"
#include "tokenizer.h"

/* Reads each input text file, with `fortune` turns every line that is exactly "%" into an
 * empty line (fortune(6) files separate entries that way), tokenizes each file's text and
 * joins the files with a separator: the eot token when the tokenizer has one (GPT-2's
 * <|endoftext|>, as GPT-2's own data preparation does), else a newline after a file that
 * does not end in one (so two files' lines never run together). The files record the
 * tokenizer (tokenfile.h). The last val_fraction of
 * the token stream goes to "<out_prefix>_val.bin" (at least one token when val_fraction > 0),
 * the rest to "<out_prefix>_train.bin". val_fraction 0 writes no val file and removes a
 * stale one. val_fraction must be in [0, 1). ntrain / nval (may be NULL) get the counts. */
dt_status dt_prepare(const dt_tokenizer *t, const char *const *inputs, int ninputs, const char *out_prefix,
                     double val_fraction, int fortune, size_t *ntrain, size_t *nval);

#endif
