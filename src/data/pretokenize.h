/* GPT-2 pre-tokenisation (tokenizer.h's regex, by hand) and the UTF-8 decoding it runs
 * on: the pieces that BPE then merges, each independently. */
#ifndef DT_PRETOKENIZE_H
#define DT_PRETOKENIZE_H
#include <stddef.h>
#include <stdint.h>

#define DT_CP_INVALID 0x110000u /* a byte that is not valid UTF-8: classed as other */

/* One code point at s[i] (i < n) and its width; invalid/overlong/truncated sequences and
 * surrogates give DT_CP_INVALID with width 1, so every byte is consumed exactly once. */
uint32_t dt_utf8_at(const unsigned char *s, size_t n, size_t i, size_t *w);
/* End of the regex match starting at s[i] (i < n): the next pre-token is s[i .. end). */
size_t dt_pretoken_end(const unsigned char *s, size_t n, size_t i);

#endif
