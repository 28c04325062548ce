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

int join_and_exec(char **argv) {
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
