/* Run-time libraries (src/core/library.c): the first name the loader finds is opened and
 * its symbols looked up; a missing library or symbol is reported by name, no handle kept. */
#include <dlfcn.h>
#include <math.h>

#include "check.h"
#include "core/library.h"

int main(void) {
    char why[256];
    double (*cosine)(double) = NULL;
    const char *names[] = {"libdtrain-no-such-library.so.0", "libm.so.6"};
    dt_symbol ok[] = {{"cos", (void **)&cosine}};
    void *h = dt_library_open(names, 2, ok, 1, why, sizeof why);
    CHECK(h && cosine && cosine(0.0) == 1.0, "the second name opens and cos is found: %s", h ? "" : why);

    void *other = NULL;
    dt_symbol missing[] = {{"cos", (void **)&cosine}, {"dtrain_no_such_symbol", &other}};
    CHECK(!dt_library_open(names + 1, 1, missing, 2, why, sizeof why) && strstr(why, "dtrain_no_such_symbol"),
          "a missing symbol is named: %s", why);
    CHECK(!dt_library_open(names, 1, ok, 1, why, sizeof why) && strstr(why, "libdtrain-no-such-library"),
          "a missing library is named: %s", why);
    if (h) dlclose(h);
    return check_finish();
}
