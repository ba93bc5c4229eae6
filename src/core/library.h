/* Libraries opened at run time rather than linked (cuBLASLt, NCCL): loading a large
 * library costs every process, CPU runs included, so only runs that use one open it. */
#ifndef DT_LIBRARY_H
#define DT_LIBRARY_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name; /* the symbol */
    void **slot;      /* where its address goes */
} dt_symbol;

/* Opens the first of names[0..n) the loader finds and looks up every symbol into its
 * slot. Returns the handle, or NULL with why (cap bytes) saying what failed: the loader's
 * message, or the missing symbol (the library is closed again then). */
void *dt_library_open(const char *const *names, size_t n, const dt_symbol *syms, size_t nsyms, char *why,
                      size_t cap);

#ifdef __cplusplus
}
#endif
#endif
