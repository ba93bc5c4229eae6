#define _POSIX_C_SOURCE 200809L
#include "launch/hostfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* The tokens of Open MPI's hostfile lexer (hostfile_lex.l): flex picks the longest match,
 * the earlier rule on a tie; the rules below are in its order. */
enum {
    T_DONE, T_ERROR, T_QUOTED, T_EQUAL, T_INT, T_STRING, T_SLOTS, T_SLOTS_MAX, T_USERNAME, T_IPV4, T_HOSTNAME,
    T_NEWLINE, T_SLOT, T_RELATIVE, T_RANK, T_OTHER_KEY, T_PORT, T_BLOCK /* "/ *": a block comment begins */
};

typedef struct {
    const char *s;
    size_t n, p;
    int line, comment;
    int tok_line;
    size_t tok, len; /* the last token's text */
} lexer;

static int white(int c) { return c == ' ' || c == '\t' || c == '\f' || c == '\v'; }
static int digit(int c) { return c >= '0' && c <= '9'; }
static int alpha(int c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static int alnum(int c) { return alpha(c) || digit(c); }
/* [A-za-z0-9_\-,:*@]: A-z takes in [\]^_` too */
static int string_char(int c) { return (c >= 'A' && c <= 'z') || digit(c) || (c && strchr("_-,:*@", c)); }

static const struct {
    const char *word;
    int tok;
} KEYS[] = {
    {"cpu", T_SLOTS}, {"count", T_SLOTS}, {"slots", T_SLOTS}, {"slots-max", T_SLOTS_MAX}, {"slots_max", T_SLOTS_MAX},
    {"max-slots", T_SLOTS_MAX}, {"max_slots", T_SLOTS_MAX}, {"cpu-max", T_SLOTS_MAX}, {"cpu_max", T_SLOTS_MAX},
    {"max-cpu", T_SLOTS_MAX}, {"max_cpu", T_SLOTS_MAX}, {"count-max", T_SLOTS_MAX}, {"count_max", T_SLOTS_MAX},
    {"max-count", T_SLOTS_MAX}, {"max_count", T_SLOTS_MAX}, {"rank", T_RANK}, {"slot", T_SLOT},
    {"username", T_USERNAME}, {"user-name", T_USERNAME}, {"user_name", T_USERNAME}, {"boards", T_OTHER_KEY},
    {"sockets", T_OTHER_KEY}, {"sockets_per_board", T_OTHER_KEY}, {"sockets-per-board", T_OTHER_KEY},
    {"cores", T_OTHER_KEY}, {"cores_per_socket", T_OTHER_KEY}, {"cores-per-socket", T_OTHER_KEY},
    {"cpu_set", T_OTHER_KEY}, {"cpu-set", T_OTHER_KEY}, {"port", T_PORT},
};

/* [A-Za-z0-9][A-Za-z0-9_\-]*"@" at i (with a leading ^ when caret): its length, or 0 */
static size_t user_at(const lexer *x, size_t i, int caret) {
    size_t j = i;
    if (caret && j < x->n && x->s[j] == '^') j++;
    if (j >= x->n || !alnum(x->s[j])) return 0;
    while (j < x->n && (alnum(x->s[j]) || x->s[j] == '_' || x->s[j] == '-')) j++;
    return j < x->n && x->s[j] == '@' ? j + 1 - i : 0;
}

static size_t ipv4_at(const lexer *x, size_t i) {
    size_t j = i;
    for (int part = 0; part < 4; part++) {
        size_t d = 0;
        while (j + d < x->n && digit(x->s[j + d])) d++;
        if (d == 0 || (d > 3 && part < 3)) return 0;
        j += d > 3 ? 3 : d;
        if (part < 3) {
            if (j >= x->n || x->s[j] != '.') return 0;
            j++;
        }
    }
    return j - i;
}

static size_t hostname_at(const lexer *x, size_t i) {
    if (i >= x->n || !alpha(x->s[i])) return 0;
    size_t j = i + 1;
    while (j < x->n && (alnum(x->s[j]) || x->s[j] == '_' || x->s[j] == '-' || x->s[j] == '.')) j++;
    return j - i;
}

/* The next token; x->tok, x->len its text. */
static int lex(lexer *x) {
    const char *s = x->s;
    for (;;) {
        size_t p = x->p, n = x->n;
        x->tok = p;
        x->tok_line = x->line;
        if (p >= n) return T_DONE;
        if (x->comment) { /* inside a block comment */
            if (s[p] == '\n') {
                x->p++, x->line++;
                return T_NEWLINE;
            }
            size_t i = p;
            if (s[p] == '*') {
                while (i < n && s[i] == '*') i++;
                if (i < n && s[i] == '/') {
                    x->p = i + 1;
                    x->comment = 0;
                    return T_NEWLINE;
                }
                while (i < n && s[i] != '*' && s[i] != '/' && s[i] != '\n') i++;
            } else {
                while (i < n && s[i] != '*' && s[i] != '\n') i++;
            }
            x->p = i;
            continue;
        }
        size_t best = 0, len, i;
        int tok = T_ERROR, skip = 0;
#define TRY(L, T, SKIP)                  \
    do {                                 \
        len = (L);                       \
        if (len > best) {                \
            best = len, tok = (T), skip = (SKIP); \
        }                                \
    } while (0)
        for (i = p; i < n && white(s[i]); i++) {}
        TRY(i < n && s[i] == '\n' ? i + 1 - p : 0, T_NEWLINE, 0);
        if (s[p] == '#' || (s[p] == '/' && p + 1 < n && s[p + 1] == '/')) { /* a comment to the end of the line */
            for (i = p; i < n && s[i] != '\n'; i++) {}
            TRY(i < n ? i + 1 - p : 0, T_NEWLINE, 0);
        }
        if (s[p] == '/' && p + 1 < n && s[p + 1] == '*') TRY(2, T_BLOCK, 0);
        if (s[p] == '"') {
            for (i = p + 1; i < n && s[i] != '"'; i++) {}
            TRY(i < n ? i + 1 - p : 0, T_QUOTED, 0);
        }
        for (i = p; i < n && white(s[i]); i++) {}
        TRY(i - p, 0, 1);
        TRY(s[p] == '=' ? 1 : 0, T_EQUAL, 0);
        for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++) {
            size_t kl = strlen(KEYS[k].word);
            TRY(n - p >= kl && !memcmp(s + p, KEYS[k].word, kl) ? kl : 0, KEYS[k].tok, 0);
        }
        if (s[p] == '+' && p + 1 < n) { /* relative nodes: +n0, +e, +e:2 */
            if (s[p + 1] == 'n') {
                for (i = p + 2; i < n && digit(s[i]); i++) {}
                TRY(i > p + 2 ? i - p : 0, T_RELATIVE, 0);
            } else if (s[p + 1] == 'e' || s[p + 1] == 'E') {
                TRY(2, T_RELATIVE, 0);
                if (p + 2 < n && s[p + 2] == ':') {
                    for (i = p + 3; i < n && digit(s[i]); i++) {}
                    TRY(i > p + 3 ? i - p : 0, T_RELATIVE, 0);
                }
            }
        }
        for (i = p; i < n && digit(s[i]); i++) {}
        TRY(i - p, T_INT, 0);
        for (i = p; i < n && string_char((unsigned char)s[i]); i++) {}
        TRY(i - p, T_STRING, 0);
        size_t u = user_at(x, p, 0);
        TRY(ipv4_at(x, p), T_IPV4, 0);
        if (u) TRY(ipv4_at(x, p + u) ? u + ipv4_at(x, p + u) : 0, T_IPV4, 0);
        /* (IPv6 addresses are all [0-9a-fA-F:], which the string rule before takes) */
        TRY(hostname_at(x, p), T_HOSTNAME, 0);
        u = user_at(x, p, 1);
        if (u) TRY(hostname_at(x, p + u) ? u + hostname_at(x, p + u) : 0, T_HOSTNAME, 0);
        TRY(s[p] != '\n' ? 1 : 0, T_ERROR, 0);
#undef TRY
        x->len = best;
        for (i = p; i < p + best; i++)
            if (s[i] == '\n') x->line++;
        x->p = p + best;
        if (skip) continue;
        if (tok == T_BLOCK) {
            x->comment = 1;
            return T_NEWLINE;
        }
        return tok;
    }
}

typedef struct {
    char name[256];
    long long slots, max;
    int given, excluded;
} node;

typedef struct {
    lexer x;
    const char *path, *self;
    node *nodes;
    int n, cap;
} parser;

/* The token's text for a message: printable, CR and others escaped, at most 40 bytes. */
static const char *shown(const parser *P, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t i = P->x.tok; i < P->x.tok + P->x.len && k + 5 < cap && i - P->x.tok < 40; i++) {
        unsigned char c = (unsigned char)P->x.s[i];
        if (c == '\r') k += (size_t)snprintf(buf + k, cap - k, "\\r");
        else if (c == '\n') k += (size_t)snprintf(buf + k, cap - k, "\\n");
        else if (c < 32 || c >= 127) k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
        else buf[k++] = (char)c;
    }
    buf[k] = 0;
    return buf;
}

static int bad(const parser *P, const char *fmt, const char *what) {
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, what);
    dt_fail(DT_EINPUT, "launch: hostfile '%s' line %d: %s (Open MPI's mpirun would reject it)", P->path, P->x.tok_line,
            msg);
    return -1;
}

/* An unexpected token: the message says why mpirun would not take it. */
static int unexpected(parser *P, int tok, int at_start) {
    char t[256];
    shown(P, t, sizeof t);
    if (tok == T_ERROR && P->x.s[P->x.tok] == '\r')
        return bad(P, "%s", "a carriage return (Windows CRLF line endings): convert the file to Unix line endings");
    if (tok == T_ERROR && P->x.s[P->x.tok] == '#')
        return bad(P, "%s", "a comment needs a newline after it (this one ends the file)");
    if (tok == T_DONE || tok == T_NEWLINE) return bad(P, "%s", "the line ends where a value was expected");
    if (at_start && (tok == T_SLOTS || tok == T_SLOTS_MAX || tok == T_EQUAL))
        return bad(P, "'%s' before any host: a line starts with the host's name", t);
    if (tok == T_RANK) return bad(P, "'%s': rank lines are rankfile syntax (--rankfile), not a hostfile's", t);
    if (tok == T_RELATIVE) return bad(P, "'%s': relative node syntax is not for hostfiles", t);
    if (tok == T_QUOTED) return bad(P, "%s: quoted names are not read", t);
    if (tok == T_EQUAL) return bad(P, "%s", "'=' after a word that is no key (the keys: slots, max_slots)");
    if (tok == T_HOSTNAME || tok == T_IPV4) return bad(P, "'%s': a second host name on the line (one host a line)", t);
    return bad(P, at_start ? "'%s' where a host name was expected" : "unexpected '%s' (the keys: slots=N, max_slots=N)",
               t);
}

/* "= INT" after a key; the value, or -1 */
static long long value(parser *P) {
    if (lex(&P->x) != T_EQUAL) return -1;
    int t = lex(&P->x);
    if (t != T_INT) return -1;
    char buf[32];
    if (P->x.len > 9) return -2; /* more slots than anyone has */
    memcpy(buf, P->x.s + P->x.tok, P->x.len);
    buf[P->x.len] = 0;
    return atoll(buf);
}

static int local_name(const parser *P, const char *h) {
    return !strcmp(h, "localhost") || !strcmp(h, "127.0.0.1") || !strcmp(h, "::1") || (P->self && !strcmp(h, P->self));
}

/* One host line, its first token read (hostfile_parse_line); 0, or -1 with the error */
static int host_line(parser *P, int tok) {
    if (tok == T_RELATIVE || tok == T_RANK) return unexpected(P, tok, 1);
    char name[256], t[640];
    size_t len = P->x.len < sizeof name - 1 ? P->x.len : sizeof name - 1;
    memcpy(name, P->x.s + P->x.tok, len);
    name[len] = 0;
    char *at = strchr(name, '@'), *host = name;
    if (at) {
        if (strchr(at + 1, '@')) return bad(P, "'%s': more than one '@' (user@host)", shown(P, t, sizeof t));
        host = at + 1;
    }
    int ip = strchr(host, ':') != NULL || strspn(host, "0123456789.") == strlen(host);
    if (!ip && strchr(host, '.')) *strchr(host, '.') = 0; /* mpirun drops the domain */
    int excluded = host[0] == '^';
    if (excluded) host++;
    if (!*host) return bad(P, "'%s': no host name", shown(P, t, sizeof t));
    if (local_name(P, host)) host = "localhost";
    if (excluded) { /* mpirun reads no more of the line for it: what follows is a new line */
        if (P->n == P->cap) {
            P->cap = P->cap ? 2 * P->cap : 16;
            node *nn = realloc(P->nodes, (size_t)P->cap * sizeof *nn);
            if (!nn) return dt_fail(DT_ERUNTIME, "out of memory"), -1;
            P->nodes = nn;
        }
        node *e = &P->nodes[P->n++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", host);
        e->excluded = 1;
        return 0;
    }
    node *nd = NULL;
    for (int i = 0; i < P->n; i++)
        if (!P->nodes[i].excluded && !strcmp(P->nodes[i].name, host)) nd = &P->nodes[i];
    if (nd) { /* listed again: one more slot, and its count counts as given */
        nd->slots++;
        nd->given = 1;
    } else {
        if (P->n == P->cap) {
            P->cap = P->cap ? 2 * P->cap : 16;
            node *nn = realloc(P->nodes, (size_t)P->cap * sizeof *nn);
            if (!nn) return dt_fail(DT_ERUNTIME, "out of memory"), -1;
            P->nodes = nn;
        }
        nd = &P->nodes[P->n++];
        memset(nd, 0, sizeof *nd);
        snprintf(nd->name, sizeof nd->name, "%s", host);
        nd->slots = 1;
    }
    int got_max = 0;
    for (;;) {
        tok = lex(&P->x);
        if (tok == T_DONE || tok == T_NEWLINE) break;
        if (tok == T_STRING || tok == T_INT) continue; /* mpirun ignores a bare word */
        if (tok == T_USERNAME) { /* username=NAME: mpirun takes the next two tokens, whatever they are */
            if (lex(&P->x) == T_EQUAL) lex(&P->x);
            continue;
        }
        if (tok != T_SLOTS && tok != T_SLOTS_MAX && tok != T_PORT) return unexpected(P, tok, 0);
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)P->x.len, P->x.s + P->x.tok);
        int key_line = P->x.tok_line;
        long long v = value(P);
        if (v == -2) return bad(P, "%s: more than 999999999 slots", key);
        if (v < 0) {
            P->x.tok_line = key_line;
            char msg[160];
            snprintf(msg, sizeof msg, "%s needs '=' and a whole number (as %s=2), got '%%s'", key, key);
            return bad(P, msg, shown(P, t, sizeof t));
        }
        if (tok == T_PORT) continue; /* ssh's port */
        if (tok == T_SLOTS) {
            if (nd->given) {
                snprintf(t, sizeof t, "host '%s' given its slots twice (a host listed again counts as one more slot, "
                         "and then takes no slots=)", nd->name);
                return bad(P, "%s", t);
            }
            nd->slots = v;
            nd->given = 1;
            if (nd->max && nd->max < nd->slots) nd->max = nd->slots;
        } else {
            if (v < nd->slots) {
                snprintf(t, sizeof t, "%s=%lld is less than the host's slots (%lld)", key, v, nd->slots);
                return bad(P, "%s", t);
            }
            if (nd->max != v) got_max = 1;
            nd->max = v;
        }
    }
    if (got_max && !nd->given) { /* max_slots alone: that many slots */
        nd->slots = nd->max;
        nd->given = 1;
    }
    return 0;
}

int dt_hostfile_hosts(const char *text, size_t n, const char *path, const char *self, dt_hostfile_host *hosts,
                      int max) {
    parser P;
    memset(&P, 0, sizeof P);
    P.x.s = text;
    P.x.n = n;
    P.x.line = 1;
    P.path = path;
    P.self = self;
    int rc = 0;
    for (;;) {
        int tok = lex(&P.x);
        if (tok == T_DONE) break;
        if (tok == T_NEWLINE) continue;
        /* (mpirun stops reading at a bad token here, saying so, and runs on the hosts before
         * it: an error all the same) */
        if (tok != T_STRING && tok != T_INT && tok != T_HOSTNAME && tok != T_IPV4 && tok != T_RELATIVE &&
            tok != T_RANK) {
            rc = unexpected(&P, tok, 1);
            break;
        }
        if ((rc = host_line(&P, tok)) < 0) break;
    }
    int count = 0;
    for (int i = 0; rc == 0 && i < P.n; i++) {
        if (P.nodes[i].excluded) continue;
        int out = 0;
        for (int j = 0; j < P.n; j++)
            if (P.nodes[j].excluded && !strcmp(P.nodes[j].name, P.nodes[i].name)) out = 1;
        if (out || P.nodes[i].slots < 1) continue;
        if (count < max) {
            snprintf(hosts[count].name, sizeof hosts[count].name, "%s", P.nodes[i].name);
            hosts[count].slots = P.nodes[i].slots > (1 << 24) ? 1 << 24 : (int)P.nodes[i].slots;
        }
        count++;
    }
    free(P.nodes);
    return rc < 0 ? -1 : count;
}

int dt_hostfile_slots(const char *text, size_t n, const char *path, const char *self) {
    enum { MAX = 4096 };
    dt_hostfile_host *h = malloc(MAX * sizeof *h);
    if (!h) return dt_fail(DT_ERUNTIME, "out of memory"), -1;
    int count = dt_hostfile_hosts(text, n, path, self, h, MAX);
    long long slots = 0;
    for (int i = 0; i < count && i < MAX; i++) slots += h[i].slots;
    free(h);
    if (count < 0) return -1;
    return slots > (1 << 24) ? 1 << 24 : (int)slots;
}

int dt_hostfile_take(const dt_hostfile_host *hosts, int n, int first, int count, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0, at = 0; i < n && count > 0; at += hosts[i].slots, i++) {
        int lo = first > at ? first : at, hi = at + hosts[i].slots < first + count ? at + hosts[i].slots : first + count;
        if (hi <= lo) continue;
        int w = snprintf(out + len, cap - len, "%s%s:%d", len ? "," : "", hosts[i].name, hi - lo);
        if (w < 0 || (size_t)w >= cap - len) return -1;
        len += (size_t)w;
    }
    int total = 0;
    for (int i = 0; i < n; i++) total += hosts[i].slots;
    return first + count <= total ? 0 : -1;
}
