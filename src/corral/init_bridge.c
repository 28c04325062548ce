/* corral's compiled init: the egress bridge (corral/egress/bridge.py says how it works). */
#include "init.h"

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

int start_bridge(void) {
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

/* Wait for the payload, forwarding the bridge's connections meanwhile; its wait status.
 *
 * The launcher is watched too, through a pidfd of its process (config launcher_fd),
 * readable once it has exited, SIGKILLed or crashed; a status report that failed says the
 * same.  Where the payload cannot stop the init (corral.resolve.init_shielded), corral
 * does not use bwrap's --die-with-parent, which leaves bwrap's sandbox child
 * blocked for ever when the launcher dies while bwrap sets up (bubblewrap.c: the parent
 * arms it, then lets the child go on), and follows the launcher's thread, not its process.
 * Then every process of the sandbox is killed (init.c's end_sandbox). */
int supervise(pid_t pid) {
    struct pollfd fds[MAX_LISTEN + 2];
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) return wait_for(pid); /* no pidfd (Linux < 5.3): neither watch */
    int n = cfg.bridge_fd >= 0 ? cfg.n_listens : 0;
    for (int i = 0; i < n; i++) fds[i] = (struct pollfd){listeners[i], POLLIN, 0};
    fds[n] = (struct pollfd){pidfd, POLLIN, 0};
    fds[n + 1] = (struct pollfd){cfg.launcher_fd, POLLIN, 0}; /* -1 (none) is skipped */
    for (;;) {
        if (launcher_gone || fds[n + 1].revents) {
            end_sandbox(pid); /* the launcher is gone */
            break;
        }
        if (poll(fds, (nfds_t)n + 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[n].revents) break;
        /* At most bridge_batch connections, then poll again: a payload that keeps the
         * accept queue full (connect and close in a loop, from many processes) must not
         * keep the init from seeing the launcher go, or the payload end. */
        for (int i = 0; i < n; i++)
            for (int k = 0; fds[i].revents && k < cfg.bridge_batch && forward(fds[i].fd); k++) {}
    }
    close(pidfd);
    if (cfg.bridge_fd >= 0) {
        for (int i = 0; i < cfg.n_listens; i++) close(listeners[i]);
        close(cfg.bridge_fd);
    }
    return wait_for(pid);
}
