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
 *     other descriptor and execs the payload with the environment of its config (bwrap
 *     gives the init none: corral.bwrap.init_environment);
 *  5. the parent reports "started" once the exec succeeded (the report pipe is
 *     close-on-exec: EOF means exec), waits (serving the bridge meanwhile, and ending the
 *     sandbox if the launcher goes: init_bridge.c's supervise), reports how
 *     the payload ended, and exits the same way.  A setup failure is an "error" event
 *     and exit status 125.
 *
 * Built statically by `make setup` (no dependency on the sandbox's /usr).
 *
 * The same binary, started on the host as
 *     init --join [--keep FD,...] TASKS... [--userns UID GID] [--slave] [--move FD PATH]...
 *          [--devpts OPTIONS] -- BWRAP ARGS...
 * puts itself into the run's cgroups (writing 0 into each v1 tasks or v2 cgroup.procs
 * file), then makes the run's child mounts as corral.mountns.ChildMounts.step does (a
 * private mount namespace, in a user namespace of its own first for a plain user; /
 * made a slave; detached mounts moved into place; a devpts with max=), and execs bwrap:
 * what corral did in a Python preexec_fn, which forces subprocess to fork the whole
 * launcher instead of vfork (about 5 ms a run).  Any failure stops before bwrap runs:
 * nothing starts outside its limits or without its mounts. */
#include "init.h"

/* -- reporting: JSON lines on the status descriptor ------------------------------- */

int launcher_gone; /* a report failed: init_bridge.c's supervise ends the sandbox */

static void send_line(const char *line, size_t n) {
    if (cfg.status_fd < 0) return;
    while (n > 0) {
        ssize_t w = write(cfg.status_fd, line, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { cfg.status_fd = -1; launcher_gone = 1; return; } /* see supervise */
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

/* Into the run's payload cgroups (its CPU cap), before anything of the payload runs: the
 * init stays out of the cap, so that no payload can starve it of the CPU it needs to see
 * the launcher go (corral.limits.PAYLOAD_ONLY).  The launcher opened the files: the kernel
 * checks its right to move this process, not ours. */
static int join_payload_cgroups(void) {
    for (int i = 0; i < cfg.n_payload_cgroups; i++)
        if (write(cfg.payload_cgroups[i], "0", 1) != 1)
            return fail("cannot enter the run's payload cgroup: %s", strerror(errno));
    return 0;
}

static int confine(void) {
    if (join_payload_cgroups() != 0) return -1;
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
    if (confine() == 0) {
        close_others(report_w);
        execve(argv[0], argv, cfg.env); /* the config's variables, never our own */
        fail("cannot execute %s: %s", argv[0], strerror(errno));
    }
    size_t n = strlen(failure);
    if (write(report_w, failure, n) < 0) { /* nothing more can be said */ }
    _exit(SETUP_FAILED);
}

/* SIGKILL every process of this sandbox: kill -1 reaches the whole PID namespace but PID 1,
 * bwrap's, which exits with us.  Only where this process is PID 2 of a namespace whose PID 1
 * is its parent, as bwrap starts it: run anywhere else (the tests run the init on the host),
 * kill -1 would reach every process of its uid, so only ``payload`` (when > 0) is killed. */
void end_sandbox(pid_t payload) {
    if (getpid() == 2 && getppid() == 1) kill(-1, SIGKILL);
    else if (payload > 0) kill(payload, SIGKILL);
}

int wait_for(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return status;
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
    cfg.status_fd = cfg.stderr_fd = cfg.tty = cfg.pid = cfg.bridge_fd = cfg.launcher_fd = -1;
    cfg.bridge_batch = 64;
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
    int status = supervise(pid);
    /* What the payload left (a daemon, a fork bomb's rest) ends with it: bwrap's PID 1 waits
     * for every process of the namespace, and without --die-with-parent nothing else ends
     * them once bwrap's outer process has reported. */
    end_sandbox(0);
    if (status < 0) return SETUP_FAILED; /* no end reported: the launcher says "error" */
    if (WIFSIGNALED(status)) {
        send_int("signaled", "signal", WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    send_int("exited", "code", WEXITSTATUS(status));
    return WEXITSTATUS(status);
}
