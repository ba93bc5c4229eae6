/* Opening an input file: a config, token file, tokenizer file, hostfile, metrics file,
 * checkpoint `latest` or any other file dtrain reads. Only a regular file is accepted:
 * a FIFO's open blocks until a writer comes (and SIGTERM does not end it: the signal
 * handlers restart interrupted calls), /dev/zero or a terminal never ends a read. The
 * open is non-blocking, so it cannot hang either; the descriptor is then made blocking. */
#ifndef DT_INPUT_FILE_H
#define DT_INPUT_FILE_H
#include <stddef.h>
#include <stdio.h>

#include "status.h"

/* Opens path read-only (close-on-exec). what names the input in messages: the config key
 * or option ("data.train", "--hostfile"), or NULL where the caller adds that context.
 * Errors (DT_EINPUT): "what: cannot open 'path': reason", "what: 'path' is not a regular
 * file (a FIFO)". */
dt_status dt_input_open(const char *path, const char *what, int *fd);
/* For a caller that treats an unusable file as absent: the descriptor, or -1 with errno
 * set (EINVAL: not a regular file). Records no error. */
int dt_input_open_quiet(const char *path);
/* The same as a stdio stream ("rb"). */
dt_status dt_input_fopen(const char *path, const char *what, FILE **fp);
/* Reads the whole file into a malloc'd, NUL-terminated buffer (free() it); *len (if
 * given) excludes the NUL. Larger than max_len bytes: DT_EINPUT. */
dt_status dt_input_read(const char *path, const char *what, char **out, size_t *len, size_t max_len);
/* What a file of mode st_mode is, for messages: "a directory", "a FIFO", ... */
const char *dt_input_kind(unsigned st_mode);

#endif
