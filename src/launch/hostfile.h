/* Open MPI hostfiles, read as Open MPI 4.1's mpirun reads them (orte/util/hostfile:
 * `[user@]host [slots=N] [max_slots=N]`, `#` and `//` comments, blank lines; `slots = 2`
 * and count=/cpu= are spellings of slots=; a host listed again counts one more slot and
 * may not then give slots=; `^host` leaves a host out). What mpirun would reject (a CR of
 * Windows line endings, `slots=2abc`, a line without a host, a key it does not know, a
 * comment without a newline at the end of the file) is rejected here, naming the line, so
 * the launcher fails once with exit 2 instead of spending every restart on mpirun's parse
 * error. Pure logic: the text is given. */
#ifndef DT_HOSTFILE_H
#define DT_HOSTFILE_H

#include <stddef.h>

/* The slots the hostfile's n bytes of text offer, or -1 with the error recorded
 * (DT_EINPUT: "launch: hostfile 'PATH' line L: ..."). `self` is this host's name (the
 * hosts localhost, 127.0.0.1 and self are one host, as for mpirun), or NULL. */
int dt_hostfile_slots(const char *text, size_t n, const char *path, const char *self);

typedef struct {
    char name[256];
    int slots;
} dt_hostfile_host;
/* The hosts it offers, in file order, each once with its slots (those left out by `^host`
 * or with no slots omitted): the first `max` into hosts; returns how many there are, or
 * -1 with the error recorded as above. */
int dt_hostfile_hosts(const char *text, size_t n, const char *path, const char *self, dt_hostfile_host *hosts,
                      int max);
/* mpirun's --host list ("a:2,b:1") of slots first .. first + count - 1, counting the
 * hosts' slots in order (a replica job's share of the file); -1: fewer slots, or cap too small. */
int dt_hostfile_take(const dt_hostfile_host *hosts, int n, int first, int count, char *out, size_t cap);

#endif
