/* corral's compiled init: what its parts share (see init.c for what it does, and why). */
#ifndef CORRAL_INIT_H
#define CORRAL_INIT_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
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
#define MAX_ENV 4096
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
    int launcher_fd; /* a pidfd of the launcher process: readable once it is gone */
    long uid, gid;
    const char *cwd;
    int landlock, min_abi, best_effort, scope;
    struct rule rules[MAX_ITEMS]; int n_rules;
    struct mnt mounts[MAX_ITEMS]; int n_mounts;
    struct lim limits[16]; int n_limits;
    unsigned char *filter; size_t filter_len;
    int bridge_fd; /* the unix socket pair end to the host's proxy; -1: no egress */
    int bridge_batch; /* connections passed per wake-up before the watches come first */
    int payload_cgroups[4]; int n_payload_cgroups; /* cgroup.procs the payload moves into */
    struct listen listens[MAX_LISTEN]; int n_listens; /* the first: the proxy port */
    /* The payload's environment, NAME=VALUE, NULL-terminated: bwrap gives the init none
     * (corral.bwrap.init_environment), it passes these to execve only. */
    char *env[MAX_ENV + 1]; int n_env;
};

extern struct config cfg;       /* init_config.c: parsed by read_config */
extern char failure[4000];      /* why setup failed: one message, sent as the error event */
int fail(const char *fmt, ...); /* sets failure; returns -1 */
int read_config(int fd);
int start_bridge(void);         /* init_bridge.c */
extern int launcher_gone;      /* a status report failed (init.c) */
int supervise(pid_t pid);      /* the payload's wait status; see init_bridge.c */
int join_and_exec(char **argv); /* init_join.c: the host-side --join mode */
int wait_for(pid_t pid);
void end_sandbox(pid_t payload); /* init.c: kill -1, only as bwrap's PID 2 */

#endif
