/* corral's compiled init, on the host: `init --join ...` (see init.c's head). */
#include "init.h"

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

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#define MAX_KEEP 256

static int kept(const int *keep, int n, int fd) {
    for (int k = 0; k < n; k++)
        if (keep[k] == fd) return 1;
    return 0;
}

/* `--keep FD,FD,...`: what subprocess's cwd="/" and close_fds=True did, for a launcher
 * that starts this with posix_spawn (corral.launch.Spawned): the working directory is /,
 * and every descriptor above 2 but the listed ones (bwrap's) is closed, whatever else the
 * launcher's process held without close-on-exec.  A listed one that is not open fails the
 * start: bwrap would read another descriptor in its place. */
static int keep_only(const char *list) {
    int keep[MAX_KEEP], n = 0;
    for (const char *p = list; *p;) {
        char *end;
        long fd = strtol(p, &end, 10);
        if (end == p || fd < 3 || fd > INT_MAX || n == MAX_KEEP || (*end && *end != ','))
            JOIN_FAIL("--keep: bad descriptor list %s\n", list);
        keep[n++] = (int)fd;
        p = *end ? end + 1 : end;
    }
    for (int k = 0; k < n; k++)
        if (fcntl(keep[k], F_GETFD) < 0)
            JOIN_FAIL("descriptor %d for bwrap is not open: %s\n", keep[k], strerror(errno));
    if (chdir("/") != 0)
        JOIN_FAIL("chdir /: %s\n", strerror(errno));
    int lo = 3;
    for (;;) { /* close [lo, next kept one), then go on after it */
        int next = -1;
        for (int k = 0; k < n; k++)
            if (keep[k] >= lo && (next < 0 || keep[k] < next)) next = keep[k];
        unsigned hi = next < 0 ? ~0u : (unsigned)next - 1;
        if ((next < 0 || next > lo) && syscall(SYS_close_range, (unsigned)lo, hi, 0) != 0) {
            if (errno != ENOSYS)
                JOIN_FAIL("close_range: %s\n", strerror(errno));
            DIR *d = opendir("/proc/self/fd"); /* before Linux 5.9 */
            if (!d) JOIN_FAIL("cannot list /proc/self/fd: %s\n", strerror(errno));
            int self = dirfd(d);
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                int fd = atoi(e->d_name);
                if (e->d_name[0] != '.' && fd >= 3 && fd != self && !kept(keep, n, fd))
                    close(fd);
            }
            closedir(d);
            return 0;
        }
        if (next < 0) return 0;
        lo = next + 1;
    }
}

/* bwrap, and through it the init and the payload, start with every signal at its default
 * and none blocked, whatever the launcher's process had: exec keeps what is ignored and
 * the mask.  A caller that ignored SIGCHLD had its children reaped unseen, bwrap's among
 * them, and the run hung; glibc's posix_spawn (corral.launch.spawn) leaves its internal
 * signals, 32 and 33, ignored in the child (review 11).  The libc's own calls refuse the
 * numbers it reserves, so this is the raw call: an all-zero kernel sigaction is SIG_DFL,
 * no flags, an empty mask, whatever the field order. */
static int default_signals(void) {
    for (int sig = 1; sig <= 64; sig++) {
        unsigned long act[4] = {0, 0, 0, 0};
        if (sig != SIGKILL && sig != SIGSTOP
            && syscall(SYS_rt_sigaction, sig, act, NULL, 8) != 0)
            JOIN_FAIL("cannot reset signal %d: %s\n", sig, strerror(errno));
    }
    unsigned long none = 0;
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8) != 0)
        JOIN_FAIL("cannot unblock signals: %s\n", strerror(errno));
    return 0;
}

int join_and_exec(char **argv) {
    int i = 2;
    if (default_signals() != 0)
        return SETUP_FAILED;
    if (argv[i] && strcmp(argv[i], "--keep") == 0) {
        if (!argv[i + 1] || keep_only(argv[i + 1]) != 0)
            return SETUP_FAILED;
        i += 2;
    }
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
