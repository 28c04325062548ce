/* corral's compiled init: its config, NUL-terminated "key=value" records written by
 * corral.cinit.encode.  An unknown key or a malformed value fails the run closed. */
#include "init.h"

struct config cfg; /* zeroed (.bss, not in the binary); defaults set by main */
char failure[4000];

int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failure, sizeof failure, fmt, ap);
    va_end(ap);
    return -1;
}

static int number(const char *s, long long *out) {
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return (errno || end == s || (*end && *end != ':')) ? -1 : 0;
}

/* "N:N:...:REST": `count` numbers, then the rest (a path); NULL when malformed. */
static const char *fields(const char *s, long long *out, int count) {
    for (int i = 0; i < count; i++) {
        if (number(s, &out[i]) != 0) return NULL;
        s = strchr(s, ':');
        if (s == NULL) return i == count - 1 ? "" : NULL;
        s++;
    }
    return s;
}

static int rlimit_of(const char *name, size_t n) {
    static const struct { const char *name; int res; } names[] = {
        {"nofile", RLIMIT_NOFILE}, {"fsize", RLIMIT_FSIZE}, {"core", RLIMIT_CORE},
        {"cpu", RLIMIT_CPU}, {"nproc", RLIMIT_NPROC}, {"as", RLIMIT_AS}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == n && memcmp(names[i].name, name, n) == 0)
            return names[i].res;
    return -1;
}

static int hexbytes(const char *hex, struct config *c) {
    size_t n = strlen(hex);
    if (n % 16 != 0 || n == 0) return -1; /* whole 8-byte BPF instructions */
    c->filter = malloc(n / 2);
    if (c->filter == NULL) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        c->filter[i] = (unsigned char)v;
    }
    c->filter_len = n / 2;
    return 0;
}

static int record(char *rec) {
    char *eq = strchr(rec, '=');
    if (eq == NULL) return fail("corral's init config is malformed");
    *eq = '\0';
    const char *k = rec, *v = eq + 1;
    long long n[3];
    /* A setting that holds one value may come once: a second one would replace the
       launcher's (a record smuggled into a value must never win; cinit.encode refuses
       NUL bytes in values too). */
    static const char *const single[] = {"cwd", "seccomp", "landlock", "status_fd",
                                         "stderr_fd", "tty", "pid", "bridge_fd", "uid", "gid",
                                         "launcher_fd", "bridge_batch"};
    static unsigned seen;
    for (unsigned i = 0; i < sizeof single / sizeof *single; i++)
        if (strcmp(k, single[i]) == 0) {
            if (seen & (1u << i)) return fail("corral's init config repeats %s", k);
            seen |= 1u << i;
        }
    if (strcmp(k, "cwd") == 0) { cfg.cwd = v; return 0; }
    if (strcmp(k, "env") == 0) {
        if (strchr(v, '=') == NULL || v[0] == '=' || cfg.n_env == MAX_ENV)
            return fail("bad environment variable for the payload");
        cfg.env[cfg.n_env++] = (char *)v;
        return 0;
    }
    if (strcmp(k, "seccomp") == 0)
        return hexbytes(v, &cfg) == 0 ? 0 : fail("the payload's seccomp filter is malformed");
    if (strcmp(k, "rule") == 0) {
        const char *path = fields(v, n, 1);
        if (path == NULL || !*path || cfg.n_rules == MAX_ITEMS) return fail("bad Landlock rule");
        cfg.rules[cfg.n_rules++] = (struct rule){(uint64_t)n[0], path};
        return 0;
    }
    if (strcmp(k, "mount") == 0) {
        const char *path = fields(v, n, 3);
        if (path == NULL || !*path || cfg.n_mounts == MAX_ITEMS) return fail("bad mount check");
        cfg.mounts[cfg.n_mounts++] = (struct mnt){(int)n[0], (uint64_t)n[1], (uint64_t)n[2], path};
        return 0;
    }
    if (strcmp(k, "rlimit") == 0) {
        const char *colon = strchr(v, ':');
        int res = colon ? rlimit_of(v, (size_t)(colon - v)) : -1;
        if (res < 0 || fields(colon + 1, n, 2) == NULL || cfg.n_limits == 16)
            return fail("bad rlimit %s", v);
        cfg.limits[cfg.n_limits++] = (struct lim){res, (rlim_t)n[0], (rlim_t)n[1]};
        return 0;
    }
    if (strcmp(k, "payload_cgroup") == 0) {
        if (number(v, n) != 0 || n[0] < 0 || n[0] > INT_MAX || cfg.n_payload_cgroups == 4)
            return fail("bad payload cgroup %s", v);
        cfg.payload_cgroups[cfg.n_payload_cgroups++] = (int)n[0];
        return 0;
    }
    if (strcmp(k, "listen") == 0) {
        const char *host = fields(v, n, 1);
        if (host == NULL || !*host || n[0] < 1 || n[0] > 65535 || cfg.n_listens == MAX_LISTEN)
            return fail("bad bridge address %s", v);
        cfg.listens[cfg.n_listens++] = (struct listen){(int)n[0], host};
        return 0;
    }
    if (strcmp(k, "landlock") == 0) {
        if (fields(v, n, 3) == NULL) return fail("bad Landlock settings");
        cfg.landlock = 1;
        cfg.min_abi = (int)n[0]; cfg.best_effort = (int)n[1]; cfg.scope = (int)n[2];
        return 0;
    }
    if (number(v, n) != 0) return fail("corral's init config: %s is not a number", k);
    if (strcmp(k, "status_fd") == 0) cfg.status_fd = (int)n[0];
    else if (strcmp(k, "stderr_fd") == 0) cfg.stderr_fd = (int)n[0];
    else if (strcmp(k, "tty") == 0) cfg.tty = (int)n[0];
    else if (strcmp(k, "pid") == 0) cfg.pid = (int)n[0];
    else if (strcmp(k, "bridge_fd") == 0) cfg.bridge_fd = (int)n[0];
    else if (strcmp(k, "launcher_fd") == 0) cfg.launcher_fd = (int)n[0];
    else if (strcmp(k, "bridge_batch") == 0 && n[0] >= 1 && n[0] <= INT_MAX)
        cfg.bridge_batch = (int)n[0];
    else if (strcmp(k, "uid") == 0) cfg.uid = (long)n[0];
    else if (strcmp(k, "gid") == 0) cfg.gid = (long)n[0];
    else return fail("corral's init does not know the setting %s; rebuild it (make setup)", k);
    return 0;
}

int read_config(int fd) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (buf == NULL) return fail("out of memory reading the config");
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return fail("cannot read the config: %s", strerror(errno));
        if (r == 0) break;
        len += (size_t)r;
        if (len == cap) {
            if (cap >= CONFIG_MAX) return fail("corral's init config is too large");
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    close(fd);
    buf[len] = '\0';
    /* status_fd first, so that a later bad record can still be reported */
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
        if (strncmp(buf + i, "status_fd=", 10) == 0) cfg.status_fd = atoi(buf + i + 10);
    for (size_t i = 0, n; i < len; i += n + 1) {
        n = strlen(buf + i); /* before record() splits it at its '=' */
        if (record(buf + i) != 0) return -1;
    }
    return 0;
}
