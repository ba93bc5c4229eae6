/* A token id as the model and the kernels take it: 32-bit, so vocabularies over 65,536
 * fit (token files keep 16-bit ids where the vocabulary allows: tokenfile.h). As a
 * target, DT_IGNORE means "not in the loss" (a prompt, padding, the token after a
 * document's end in a packed row): its loss and its gradient are zero. */
#ifndef DT_TOKEN_H
#define DT_TOKEN_H
#include <stdint.h>

typedef int32_t dt_token;
#define DT_IGNORE (-1)

#endif
