#include "library.h"

#include <dlfcn.h>
#include <stdio.h>

void *dt_library_open(const char *const *names, size_t n, const dt_symbol *syms, size_t nsyms, char *why,
                      size_t cap) {
    void *h = NULL;
    for (size_t i = 0; i < n && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, cap, "%s", e ? e : "no library name given");
        return NULL;
    }
    for (size_t i = 0; i < nsyms; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
            snprintf(why, cap, "missing symbol %s", syms[i].name);
            dlclose(h);
            return NULL;
        }
    return h;
}
