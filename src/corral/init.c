/* corral's compiled init: the job of inner.py, without starting an interpreter.
 *
 * bwrap starts it as `/run/corral/init CONFIG_FD ARGV...` in every sandbox.  It reads the
 * config the launcher wrote with corral.cinit.encode: NUL-terminated "key=value"
 * records; an unknown key fails the run closed, so that the two inits cannot drift
 * apart silently.  Then, in the order inner.py documents:
 *
 *  1. started by root: drops the capability bounding set, becomes uid/gid, empties
 *     every capability set and checks that nothing survived;
 *  2. checks that each re-mount inside a writable tree sits where it should;
 *  3. not dumpable (the payload may not read our descriptors); with egress, listens on
 *     127.0.0.1 (and each relayed loopback address) *before* the fork, so the payload's
 *     first connection never races it (corral/egress/bridge.py says how the bridge
 *     works: it passes each accepted socket to the host's proxy, and reads none of it);
 *     checks that it is the PID the seccomp filter protects, with one thread;
 *  4. forks; the child makes itself the OOM killer's first choice, takes the terminal,
 *     sets umask, working directory and rlimits, sets no_new_privs, applies Landlock,
 *     stacks the payload's seccomp filter, moves the real stderr to fd 2, closes every
 *     other descriptor and execs the payload;
 *  5. the parent reports "started" once the exec succeeded (the report pipe is
 *     close-on-exec: EOF means exec), waits (serving the bridge meanwhile), reports how
 *     the payload ended, and exits the same way.  A setup failure is an "error" event
 *     and exit status 125.
 *
 * Built statically by `make setup` (no dependency on the sandbox's /usr).
 *
 * The same binary, started on the host as
 *     init --join TASKS... [--userns UID GID] [--slave] [--move FD PATH]...
 *          [--devpts OPTIONS] -- BWRAP ARGS...
 * puts itself into the run's cgroups (writing 0 into each v1 tasks or v2 cgroup.procs
 * file), then makes the run's child mounts as corral.mountns.ChildMounts.step does (a
 * private mount namespace, in a user namespace of its own first for a plain user; /
 * made a slave; detached mounts moved into place; a devpts with max=), and execs bwrap:
 * what corral did in a Python preexec_fn, which forces subprocess to fork the whole
 * launcher instead of vfork (about 5 ms a run).  Any failure stops before bwrap runs:
 * nothing starts outside its limits or without its mounts. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#define SETUP_FAILED 125
#define CONFIG_MAX (8 << 20)
#define MAX_ITEMS 4096
#define MAX_LISTEN 64
#define BACKLOG 4096

/* Landlock (include/uapi/linux/landlock.h), spelled out: the build host's headers may
 * be older than the running kernel. */
#define LL_CREATE_RULESET 444
#define LL_ADD_RULE 445
#define LL_RESTRICT_SELF 446
#define LL_VERSION 1u
#define LL_PATH_BENEATH 1
#define FS_WRITE_FILE (1ull << 1)
#define FS_REMOVE_DIR (1ull << 4)
#define FS_REMOVE_FILE (1ull << 5)
#define FS_MAKE_ALL (0x7full << 6) /* char, dir, reg, sock, fifo, block, sym */
#define FS_REFER (1ull << 13)
#define FS_TRUNCATE (1ull << 14)
#define SCOPE_ALL 3ull /* abstract unix sockets, signals (ABI 6) */

struct rule { uint64_t rights; const char *path; };
struct mnt { int hide; uint64_t dev, ino; const char *path; };
struct lim { int resource; rlim_t soft, hard; };
struct listen { int port; const char *host; };

struct config {
    int status_fd, stderr_fd, tty, pid;
    long uid, gid;
    const char *cwd;
    int landlock, min_abi, best_effort, scope;
    struct rule rules[MAX_ITEMS]; int n_rules;
    struct mnt mounts[MAX_ITEMS]; int n_mounts;
    struct lim limits[16]; int n_limits;
    unsigned char *filter; size_t filter_len;
    int bridge_fd; /* the unix socket pair end to the host's proxy; -1: no egress */
    struct listen listens[MAX_LISTEN]; int n_listens; /* the first: the proxy port */
};

static struct config cfg; /* zeroed (.bss, not in the binary); defaults set by main */
static char failure[4000]; /* why setup failed: one message, sent as the error event */

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failure, sizeof failure, fmt, ap);
    va_end(ap);
    return -1;
}

/* -- reporting: JSON lines on the status descriptor ------------------------------- */

static void send_line(const char *line, size_t n) {
    if (cfg.status_fd < 0) return;
    while (n > 0) {
        ssize_t w = write(cfg.status_fd, line, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { cfg.status_fd = -1; return; } /* the launcher is gone */
        line += w; n -= (size_t)w;
    }
}

static void send_int(const char *event, const char *key, long value) {
    char line[128];
    int n = snprintf(line, sizeof line, "{\"event\": \"%s\", \"%s\": %ld}\n", event, key, value);
    send_line(line, (size_t)n);
}

static void send_error(const char *message) {
    /* Every byte outside printable ASCII as \u00XX: the line stays valid JSON (and
     * UTF-8) whatever a path in the message holds. */
    static char line[sizeof failure * 6 + 64];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"event\": \"error\", \"message\": \"");
    for (const unsigned char *c = (const unsigned char *)message; *c; c++) {
        if (*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\') line[n++] = (char)*c;
        else n += (size_t)snprintf(line + n, 7, "\\u%04x", *c);
    }
    n += (size_t)snprintf(line + n, sizeof line - n, "\"}\n");
    send_line(line, n);
}

/* -- the config ------------------------------------------------------------------- */

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
    if (strcmp(k, "cwd") == 0) { cfg.cwd = v; return 0; }
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
    else if (strcmp(k, "uid") == 0) cfg.uid = (long)n[0];
    else if (strcmp(k, "gid") == 0) cfg.gid = (long)n[0];
    else return fail("corral's init does not know the setting %s; rebuild it (make setup)", k);
    return 0;
}

static int read_config(int fd) {
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

/* -- setup in the init ------------------------------------------------------------ */

static int read_small(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = '\0';
    return 0;
}

static int drop_to(uid_t uid, gid_t gid) {
    char buf[8192];
    if (read_small("/proc/sys/kernel/cap_last_cap", buf, sizeof buf) != 0)
        return fail("cannot read cap_last_cap: %s", strerror(errno));
    int last = atoi(buf);
    for (int cap = 0; cap <= last; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
            return fail("could not drop capability %d from the bounding set", cap);
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
        return fail("could not become uid %u, gid %u: %s", uid, gid, strerror(errno));
    uid_t r, e, s;
    gid_t gr, ge, gs;
    if (getresuid(&r, &e, &s) || getresgid(&gr, &ge, &gs) || r != uid || e != uid || s != uid
        || gr != gid || ge != gid || gs != gid)
        return fail("could not become uid %u, gid %u", uid, gid);
    /* setresuid cleared permitted and effective; bwrap's --cap-add left these
     * inheritable: empty every set. */
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
    if (syscall(SYS_capset, &head, data) != 0) return fail("capset: %s", strerror(errno));
    if (read_small("/proc/self/status", buf, sizeof buf) != 0)
        return fail("cannot read /proc/self/status");
    static const char *const sets[] = {"\nCapInh:\t", "\nCapPrm:\t", "\nCapEff:\t"};
    for (int i = 0; i < 3; i++) {
        const char *at = strstr(buf, sets[i]);
        if (at == NULL || strtoull(at + strlen(sets[i]), NULL, 16) != 0)
            return fail("capabilities survived the drop to an unprivileged uid");
    }
    return 0;
}

/* A mountinfo mount point, its octal escapes (\040 and the like) undone in place. */
static char *unescape(char *s) {
    char *out = s;
    for (char *in = s; *in; out++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7'
            && in[3] >= '0' && in[3] <= '7') {
            *out = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out = *in++;
        }
    }
    *out = '\0';
    return s;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The mount points of mountinfo (field 5 of each line), unescaped in place and sorted, so
 * that each check is a binary search: an agent's sandbox may hold 4,000 re-mounts. */
static char **mount_points(char *info, size_t *count) {
    size_t lines = 1, n = 0;
    for (char *c = info; *c; c++) lines += *c == '\n';
    char **points = malloc(lines * sizeof *points);
    if (points == NULL) return NULL;
    for (char *line = info; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *f = line;
        for (int i = 0; i < 4 && f; i++) { f = strchr(f, ' '); if (f) f++; }
        char *end = f ? strchr(f, ' ') : NULL;
        if (end) {
            *end = '\0';
            points[n++] = unescape(f);
        }
        line = next;
    }
    qsort(points, n, sizeof *points, by_name);
    *count = n;
    return points;
}

static char *slurp(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (ssize_t r; buf; len += (size_t)r) {
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
        if (!buf || (r = read(fd, buf + len, cap - len)) <= 0) break;
    }
    close(fd);
    if (buf) buf[len] = '\0';
    return buf;
}

/* Every re-mount inside a writable tree landed exactly where it should (inner.py's
 * check_mounts says why: bwrap 0.8 follows links while it sets up). */
static int check_mounts(void) {
    if (cfg.n_mounts == 0) return 0;
    char *info = slurp("/proc/self/mountinfo");
    size_t n_points = 0;
    char **points = info ? mount_points(info, &n_points) : NULL;
    if (points == NULL) return fail("cannot read /proc/self/mountinfo");
    for (int i = 0; i < cfg.n_mounts; i++) {
        const struct mnt *m = &cfg.mounts[i];
        struct stat st;
        if (lstat(m->path, &st) != 0)
            return fail("%s is not in place inside the sandbox (%s)", m->path, strerror(errno));
        int same = (uint64_t)st.st_dev == m->dev && (uint64_t)st.st_ino == m->ino;
        const char *key = m->path;
        if (!bsearch(&key, points, n_points, sizeof *points, by_name) || same != !m->hide)
            return fail("%s was not re-mounted where it belongs: something changed the project "
                        "while the sandbox was being set up", m->path);
    }
    free(points);
    free(info);
    return 0;
}

static int check_alone(void) {
    if (cfg.pid < 0) return 0;
    int threads = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) threads += e->d_name[0] != '.';
    if (d) closedir(d);
    if (getpid() != cfg.pid || threads != 1)
        return fail("corral's init is PID %d with %d thread(s), not PID %d with one; the "
                    "seccomp filter keeps the payload away from that PID only, so it could "
                    "change the init's limits; report this with 'bwrap --version', or pass "
                    "--allow no-seccomp", getpid(), threads, cfg.pid);
    return 0;
}

/* -- the egress bridge ------------------------------------------------------------ */

static int listeners[MAX_LISTEN];

static int open_listener(const struct listen *l) {
    int v6 = strchr(l->host, ':') != NULL, one = 1;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)l->port)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)l->port)};
    if (inet_pton(v6 ? AF_INET6 : AF_INET, l->host, v6 ? (void *)&a6.sin6_addr
                                                       : (void *)&a4.sin_addr) != 1)
        return fail("bad bridge address %s", l->host);
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0
        || bind(fd, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
                v6 ? sizeof a6 : sizeof a4) != 0
        || listen(fd, BACKLOG) != 0)
        return fail("the egress bridge cannot listen on %s port %d: %s", l->host, l->port,
                    strerror(errno));
    return fd;
}

static int start_bridge(void) {
    if (cfg.bridge_fd < 0) return 0;
    if (cfg.n_listens == 0 || fcntl(cfg.bridge_fd, F_SETFD, FD_CLOEXEC) != 0)
        return fail("the egress bridge has no address or no descriptor to the proxy");
    for (int i = 0; i < cfg.n_listens; i++)
        if ((listeners[i] = open_listener(&cfg.listens[i])) < 0) return -1;
    return 0;
}

/* Accept one waiting connection and pass the socket itself to the proxy; 0 when none
 * was waiting (or accept failed: EMFILE and the like reset the client). */
static int forward(int listener) {
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return 0;
    char byte = 'c'; /* one byte per passed socket; the descriptor is the message */
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(cfg.bridge_fd, &msg, MSG_NOSIGNAL) < 0) { /* the proxy is gone: a reset */ }
    close(fd);
    return 1;
}

static int wait_for(pid_t pid);

/* Forward connections until the payload ends; its wait status. */
static int serve_bridge(pid_t pid) {
    struct pollfd fds[MAX_LISTEN + 1];
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) return wait_for(pid); /* no pidfd (Linux < 5.3): no forwarding */
    for (int i = 0; i < cfg.n_listens; i++) fds[i] = (struct pollfd){listeners[i], POLLIN, 0};
    fds[cfg.n_listens] = (struct pollfd){pidfd, POLLIN, 0};
    for (;;) {
        if (poll(fds, (nfds_t)cfg.n_listens + 1, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[cfg.n_listens].revents) break;
        for (int i = 0; i < cfg.n_listens; i++)
            if (fds[i].revents)
                while (forward(fds[i].fd)) {}
    }
    close(pidfd);
    for (int i = 0; i < cfg.n_listens; i++) close(listeners[i]);
    close(cfg.bridge_fd);
    return wait_for(pid);
}

/* -- the payload's confinement, in the forked child ------------------------------- */

static uint64_t write_access(int abi) {
    uint64_t a = FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_ALL;
    if (abi >= 2) a |= FS_REFER;
    if (abi >= 3) a |= FS_TRUNCATE;
    return a;
}

static int apply_landlock(void) {
    long abi = syscall(LL_CREATE_RULESET, NULL, 0, LL_VERSION);
    if (abi < 0) abi = 0;
    if (abi < cfg.min_abi)
        return cfg.best_effort ? 0 : fail("Landlock ABI %d is required but the kernel offers %ld",
                                          cfg.min_abi, abi);
    uint64_t handled = write_access((int)abi);
    struct { uint64_t fs, net, scoped; } attr = {handled, 0, 0};
    if (abi >= 6 && cfg.scope) attr.scoped = SCOPE_ALL;
    size_t size = abi < 4 ? 8 : abi < 6 ? 16 : 24;
    int ruleset = (int)syscall(LL_CREATE_RULESET, &attr, size, 0);
    if (ruleset < 0) return fail("landlock_create_ruleset failed: %s", strerror(errno));
    for (int i = 0; i < cfg.n_rules; i++) {
        int fd = open(cfg.rules[i].path, O_PATH | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) continue; /* nothing there, nothing to allow */
        if (fd < 0) return fail("landlock: cannot open %s: %s", cfg.rules[i].path, strerror(errno));
        struct stat st;
        uint64_t rights = cfg.rules[i].rights & handled;
        if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode))
            rights &= FS_WRITE_FILE | FS_TRUNCATE; /* directory rights on a file: EINVAL */
        struct __attribute__((packed)) { uint64_t allowed; int32_t parent; } r = {rights, fd};
        if (syscall(LL_ADD_RULE, ruleset, LL_PATH_BENEATH, &r, 0) != 0)
            return fail("landlock_add_rule %s: %s", cfg.rules[i].path, strerror(errno));
        close(fd);
    }
    if (syscall(LL_RESTRICT_SELF, ruleset, 0) != 0)
        return fail("landlock_restrict_self: %s", strerror(errno));
    close(ruleset);
    return 0;
}

static int install_filter(void) {
    struct sock_fprog prog = {(unsigned short)(cfg.filter_len / 8),
                              (struct sock_filter *)cfg.filter};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
        return fail("cannot install the payload's seccomp filter: %s", strerror(errno));
    return 0;
}

/* The OOM killer's first choice is the payload, never the init (which must report). */
static int prefer_oom_kill(void) {
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0); /* /proc/self is root's while not dumpable */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "1000", 4) != 4)
        return fail("cannot set the payload's oom_score_adj: %s", strerror(errno));
    close(fd);
    return 0;
}

static int confine(void) {
    if (prefer_oom_kill() != 0) return -1; /* first: a plain user's watcher reads our fds */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (cfg.tty >= 0 && (setsid() < 0 || ioctl(cfg.tty, TIOCSCTTY, 0) != 0))
        return fail("cannot take corral's terminal: %s", strerror(errno));
    umask(022);
    if (chdir(cfg.cwd) != 0) return fail("cannot change to %s: %s", cfg.cwd, strerror(errno));
    for (int i = 0; i < cfg.n_limits; i++) {
        struct rlimit rl = {cfg.limits[i].soft, cfg.limits[i].hard};
        if (setrlimit(cfg.limits[i].resource, &rl) != 0)
            return fail("setrlimit: %s", strerror(errno));
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("no_new_privs: %s", strerror(errno));
    if (cfg.landlock && apply_landlock() != 0) return -1;
    if (cfg.filter && install_filter() != 0) return -1;
    if (cfg.stderr_fd >= 0 && dup2(cfg.stderr_fd, 2) < 0)
        return fail("cannot move stderr: %s", strerror(errno));
    return 0;
}

static void close_others(int keep) {
    if (keep > 3 && syscall(SYS_close_range, 3, keep - 1, 0) != 0)
        for (int fd = 3; fd < keep; fd++) close(fd);
    if (syscall(SYS_close_range, keep + 1, ~0u, 0) != 0)
        for (int fd = keep + 1; fd < 1 << 20; fd++) close(fd);
}

static void exec_payload(char **argv, int report_w) {
    extern char **environ;
    if (confine() == 0) {
        close_others(report_w);
        execve(argv[0], argv, environ);
        fail("cannot execute %s: %s", argv[0], strerror(errno));
    }
    size_t n = strlen(failure);
    if (write(report_w, failure, n) < 0) { /* nothing more can be said */ }
    _exit(SETUP_FAILED);
}

static int wait_for(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return status;
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    size_t n = strlen(text);
    int ok = fd >= 0 && write(fd, text, n) == (ssize_t)n;
    if (fd >= 0) close(fd);
    return ok ? 0 : -1;
}

#define JOIN_FAIL(...) do { dprintf(2, "corral-join: " __VA_ARGS__); return SETUP_FAILED; } while (0)

/* The child mounts (corral.mountns.ChildMounts.step, in the same order); i at the first
 * option after the cgroup files; returns the index of "--", or -1 after saying why. */
static int child_mounts(char **argv, int i) {
    int userns = argv[i] && strcmp(argv[i], "--userns") == 0, unshared = 0;
    if (userns && (!argv[i + 1] || !argv[i + 2])) {
        dprintf(2, "corral-join: --userns needs UID GID\n");
        return -1;
    }
    for (; argv[i] && strcmp(argv[i], "--") != 0; i++) {
        if (!unshared) {
            if (unshare(CLONE_NEWNS | (userns ? CLONE_NEWUSER : 0)) != 0) {
                dprintf(2, "corral-join: unshare: %s\n", strerror(errno));
                return -1;
            }
            unshared = 1;
        }
        if (strcmp(argv[i], "--userns") == 0) { /* map only our own uid and gid */
            char map[64];
            snprintf(map, sizeof map, "%s %s 1", argv[i + 1], argv[i + 1]);
            int ok = write_file("/proc/self/setgroups", "deny") == 0
                && write_file("/proc/self/uid_map", map) == 0;
            snprintf(map, sizeof map, "%s %s 1", argv[i + 2], argv[i + 2]);
            if (!ok || write_file("/proc/self/gid_map", map) != 0) {
                dprintf(2, "corral-join: cannot map the user namespace: %s\n", strerror(errno));
                return -1;
            }
            i += 2;
        } else if (strcmp(argv[i], "--slave") == 0) { /* nothing may propagate to the host */
            if (mount("none", "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) {
                dprintf(2, "corral-join: make / a slave: %s\n", strerror(errno));
                return -1;
            }
        } else if (strcmp(argv[i], "--move") == 0 && argv[i + 1] && argv[i + 2]) {
            int fd = atoi(argv[i + 1]);
            if (syscall(SYS_move_mount, fd, "", AT_FDCWD, argv[i + 2], 4 /* F_EMPTY_PATH */)
                != 0) {
                dprintf(2, "corral-join: move_mount %s: %s\n", argv[i + 2], strerror(errno));
                return -1;
            }
            close(fd); /* bwrap and the sandbox need only the mount, not its descriptor */
            i += 2;
        } else if (strcmp(argv[i], "--devpts") == 0 && argv[i + 1]) {
            if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, argv[i + 1]) != 0) {
                dprintf(2, "corral-join: mount devpts: %s\n", strerror(errno));
                return -1;
            }
            i += 1;
        } else {
            dprintf(2, "corral-join: unknown option %s\n", argv[i]);
            return -1;
        }
    }
    return argv[i] ? i : -1;
}

static int join_and_exec(char **argv) {
    int i = 2;
    for (; argv[i] && strcmp(argv[i], "--") != 0 && strncmp(argv[i], "--", 2) != 0; i++) {
        if (write_file(argv[i], "0") != 0)
            JOIN_FAIL("cannot enter %s: %s\n", argv[i], strerror(errno));
    }
    if (argv[i] && strcmp(argv[i], "--") != 0 && (i = child_mounts(argv, i)) < 0)
        return SETUP_FAILED;
    if (!argv[i] || !argv[i + 1]) {
        dprintf(2, "corral-join: usage: init --join TASKS... -- COMMAND...\n");
        return SETUP_FAILED;
    }
    execv(argv[i + 1], argv + i + 1);
    dprintf(2, "corral-join: cannot execute %s: %s\n", argv[i + 1], strerror(errno));
    return SETUP_FAILED;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--join") == 0) return join_and_exec(argv);
    if (argc < 3) {
        static const char usage[] = "corral init: usage: init CONFIG_FD ARGV...\n";
        if (write(2, usage, sizeof usage - 1) < 0) { /* exit status says it */ }
        return SETUP_FAILED;
    }
    int pipe_fds[2];
    pid_t pid = -1;
    cfg.status_fd = cfg.stderr_fd = cfg.tty = cfg.pid = cfg.bridge_fd = -1;
    /* As Python does for inner.py: a write to a launcher that is gone is EPIPE, never death
     * (the payload's child sets both back to the default before exec). */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    cfg.uid = cfg.gid = -1;
    cfg.cwd = "/";
    if (read_config(atoi(argv[1])) != 0
        || (cfg.uid >= 0 && getuid() == 0 && drop_to((uid_t)cfg.uid, (gid_t)cfg.gid) != 0)
        || check_mounts() != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
        || start_bridge() != 0 || check_alone() != 0 || pipe2(pipe_fds, O_CLOEXEC) != 0
        || (pid = fork()) < 0) {
        if (!failure[0]) snprintf(failure, sizeof failure, "%s", strerror(errno));
        send_error(failure);
        return SETUP_FAILED;
    }
    if (pid == 0) {
        close(pipe_fds[0]);
        exec_payload(argv + 2, pipe_fds[1]);
    }
    close(pipe_fds[1]);
    size_t got = 0;
    for (ssize_t r; got < sizeof failure - 1; got += (size_t)r) {
        r = read(pipe_fds[0], failure + got, sizeof failure - 1 - got);
        if (r < 0 && errno == EINTR) { r = 0; continue; }
        if (r <= 0) break;
    }
    close(pipe_fds[0]);
    if (got > 0) {
        failure[got] = '\0';
        wait_for(pid);
        send_error(failure);
        return SETUP_FAILED;
    }
    send_int("started", "pid", pid);
    int status = cfg.bridge_fd >= 0 ? serve_bridge(pid) : wait_for(pid);
    if (status < 0) return SETUP_FAILED; /* no end reported: the launcher says "error" */
    if (WIFSIGNALED(status)) {
        send_int("signaled", "signal", WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    send_int("exited", "code", WEXITSTATUS(status));
    return WEXITSTATUS(status);
}
