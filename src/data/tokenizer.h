/* Text -> token ids. Two tokenizers: raw bytes (vocab 256) and GPT-2's byte-level BPE
 * (vocab 50257, loaded from the published encoder.json + vocab.bpe).
 *
 * GPT-2 pre-tokenisation follows the reference regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * implemented by hand. ASCII is exact. \p{L} and \p{N} use compact range tables taken
 * from Unicode 17 (Node 20 / ICU 78); \s is ECMAScript's set (as in the JS reference
 * gpt-3-encoder; Python's `regex` differs only on U+0085 and U+FEFF). Bytes that are not
 * valid UTF-8 are kept as-is and classed like punctuation, so encode/decode round-trips
 * any byte string. Merges apply exactly as the reference bpe(): repeatedly the lowest-ranked
 * adjacent pair, all its occurrences left to right.
 * Files: pretokenize.h (the regex and UTF-8), gpt2_files.c (loading encoder.json and
 * vocab.bpe), tokenizer.c (the rest). */
#ifndef DT_TOKENIZER_H
#define DT_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "../core/status.h"

typedef struct dt_tokenizer dt_tokenizer;

/* token = byte value, vocab 256, no eot */
dt_status dt_tokenizer_byte(dt_tokenizer **out);
/* A Hugging Face tokenizer.json of a byte-level BPE model (GPT-2, Llama 3, Qwen2, SmolLM):
 * its vocabulary, merges, added tokens, NFC normalizer and pre-tokenizer regex (run by
 * PCRE2); eot is tokenizer_config.json's eos_token beside it (-1 without one). Anything
 * else (SentencePiece-style byte fallback, other normalizers or pre-tokenizers) is a
 * one-line DT_EINPUT naming it. Its token files record the tokenizer "hf". */
dt_status dt_tokenizer_hf(dt_tokenizer **out, const char *tokenizer_json);
/* GPT-2 byte-level BPE, vocab 50257, eot = 50256. Load errors are DT_EINPUT naming the file. */
dt_status dt_tokenizer_gpt2(dt_tokenizer **out, const char *encoder_json, const char *vocab_bpe);
int dt_tokenizer_vocab(const dt_tokenizer *t);
int dt_tokenizer_eot(const dt_tokenizer *t); /* 50256 for gpt2; -1 for byte */
/* "byte" or "gpt2": data.tokenizer's value, and the token files' tokenizer record */
const char *dt_tokenizer_name(const dt_tokenizer *t);
/* Appends tokens of text[0..len) to *buf (growable; *n used, *cap allocated; realloc'd,
 * release with free()). The text "<|endoftext|>" is encoded as ordinary text, as the reference does. */
dt_status dt_tokenizer_encode(const dt_tokenizer *t, const char *text, size_t len, uint32_t **buf, size_t *n,
                              size_t *cap);
/* Writes the bytes of one token to out and returns how many (<= cap; a token longer than cap
 * is cut at cap, GPT-2 tokens are at most 128 bytes). Unknown token ids give 0 bytes. */
size_t dt_tokenizer_decode(const dt_tokenizer *t, int token, char *out, size_t cap);
void dt_tokenizer_free(dt_tokenizer *t);

#endif
