/* Text -> train/val token files of documents (tokenfile.h, version 3; docs/config.md#token-files). */
#ifndef DT_PREPARE_H
#define DT_PREPARE_H
#include <stddef.h>
#include "../core/status.h"
#include "tokenizer.h"

/* What an input file holds, and so what its documents are:
 *   text     each file is a document;
 *   fortune  fortune(6) files: each entry (between lines that are exactly "%") is a
 *            document, the "%" line left as an empty line at its end;
 *   jsonl    JSON Lines, one document per line, its text in the string field `field`;
 *   prompt   JSON Lines with "prompt" and "completion" strings: the completion (and the
 *            end of the document) in the loss, the prompt not;
 *   chat     JSON Lines with "messages": [{"role": ..., "content": ...}, ...], rendered as
 *            "<role>: <content>\n" per message; only the assistant messages' content and
 *            newline (and the end of the document) in the loss. */
typedef enum { DT_PREP_TEXT, DT_PREP_FORTUNE, DT_PREP_JSONL, DT_PREP_PROMPT, DT_PREP_CHAT } dt_prep_format;

typedef struct {
    dt_prep_format format;
    const char *field;   /* jsonl: the text field (NULL: "text") */
    double val_fraction; /* [0, 1): about this fraction of the tokens, whole documents from the end, to val */
} dt_prep_opts;

/* Tokenizes the inputs' documents and joins them: each document ends with the eot token
 * when the tokenizer has one (GPT-2's <|endoftext|>), else with a newline when its text
 * does not end in one (documents' lines never run together). The token stream is what
 * `data.layout stream` trains on; the files also keep where each document starts and,
 * when part of the text is not to be predicted (prompt, chat), a loss mask. The validation
 * file takes the last val_fraction of the tokens, cut at the nearest document boundary
 * when one is within half of that size of the cut, else inside a document; val_fraction 0 writes no val file and
 * removes a stale one. Bad input (a line that is not a JSON object, a missing or empty
 * field, invalid UTF-8, an empty document) is DT_EINPUT naming the file and line (or byte
 * offset), and nothing is written. ntrain / nval / ndocs (may be NULL) get the counts. */
/* The output prefix's directory exists and is writable (named, not a temporary file in it). */
dt_status dt_prepare_check_out(const char *out_prefix);
dt_status dt_prepare(const dt_tokenizer *t, const char *const *inputs, int ninputs, const char *out_prefix,
                     const dt_prep_opts *o, size_t *ntrain, size_t *nval, size_t *ndocs);
/* "text", "fortune", "jsonl", "prompt", "chat" -> *f; -1 for another name. */
int dt_prep_format_of(const char *name, dt_prep_format *f);

#endif
