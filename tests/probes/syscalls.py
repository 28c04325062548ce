"""Run inside a sandbox: attempt each call the seccomp filter refuses, print {name: errno}.

0 means the call succeeded.  Arguments are chosen so that, with no filter,
the kernel gives its own answer (success, or an argument error such as
EFAULT or EBADF) wherever it checks arguments before capabilities; nothing
here changes anything outside this process.  x86_64 numbers.
"""

import ctypes
import json
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
NUL = ctypes.c_void_p(0)
BAD = ctypes.c_void_p(1)  # an address the kernel cannot read: EFAULT


def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *(L(a) if isinstance(a, int) else a for a in args))
    return 0 if r >= 0 else ctypes.get_errno()


def in_child(action):
    """Run ``action`` in a forked child (calls that would change this process)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, str(action()).encode())
        os._exit(0)
    os.close(w)
    result = int(os.read(r, 64) or b"-1")
    os.waitpid(pid, 0)
    return result


def ptrace_child():
    child = os.fork()
    if child == 0:
        os.execv("/bin/sleep", ["sleep", "30"])
    result = call(101, 16, child, 0, 0)  # PTRACE_ATTACH
    if result == 0:
        os.waitpid(child, os.WUNTRACED)
        call(101, 17, child, 0, 0)  # PTRACE_DETACH
    os.kill(child, 9)
    os.waitpid(child, 0)
    return result


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def process_vm(nr):
    src, dst = ctypes.create_string_buffer(b"corral", 8), ctypes.create_string_buffer(8)
    local = Iovec(ctypes.cast(dst, ctypes.c_void_p), 8)
    remote = Iovec(ctypes.cast(src, ctypes.c_void_p), 8)
    return call(nr, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)


def clone_newuser():
    # A raw clone without CLONE_VM behaves like fork: the child leaves at once.
    ctypes.set_errno(0)
    pid = libc.syscall(L(56), L(0x10000000 | 17), L(0), L(0), L(0), L(0))
    if pid == 0:
        os._exit(0)
    if pid < 0:
        return ctypes.get_errno()
    os.waitpid(pid, 0)
    return 0


def personality_no_aslr():
    old = libc.personality(ctypes.c_ulong(0xFFFFFFFF))
    result = call(135, old | 0x0040000)
    libc.personality(ctypes.c_ulong(old))
    return result


def personality(value):
    return in_child(lambda: call(135, value))


def fanotify():
    # FAN_CLASS_NOTIF | FAN_REPORT_FID: what an unprivileged caller may ask for (Linux 5.13+)
    return call(300, 0x200, os.O_RDONLY)


def main():
    pid = os.getpid()
    pidfd = os.pidfd_open(pid)
    buf = ctypes.create_string_buffer(4096)
    pair = (ctypes.c_int * 2)()
    probes = {
        "add_key": lambda: call(248, b"user", b"corral-probe", b"x", 1, -2),
        "request_key": lambda: call(249, b"user", b"corral-none", NUL, 0),
        "keyctl": lambda: call(250, 0, -3, 0),  # the session keyring's id
        "ptrace": ptrace_child,
        "process_vm_readv": lambda: process_vm(310),
        "process_vm_writev": lambda: process_vm(311),
        "pidfd_getfd": lambda: call(438, pidfd, 0, 0),
        "kcmp": lambda: call(312, pid, pid, 0, 0, 0),
        "process_madvise": lambda: call(440, -1, NUL, 0, 0, 0),
        "perf_event_open": lambda: call(298, BAD, 0, -1, -1, 0),
        "bpf": lambda: call(321, 0xFFFF, NUL, 0),
        "userfaultfd": lambda: call(323, 1 | os.O_CLOEXEC),  # UFFD_USER_MODE_ONLY
        "io_uring_setup": lambda: call(425, 1, buf),
        "io_uring_enter": lambda: call(426, -1, 0, 0, 0, NUL, 0),
        "io_uring_register": lambda: call(427, -1, 0, NUL, 0),
        "modify_ldt": lambda: call(154, 0, buf, 16),
        "mount": lambda: call(165, BAD, BAD, BAD, 0, NUL),
        "umount2": lambda: call(166, b"/", 0xFFFF),
        "mount_setattr": lambda: call(442, -1, b"", 0xFFFFFFFF, NUL, 0),
        "move_mount": lambda: call(429, -1, b"", -1, b"", 0xFFFFFFFF),
        "open_tree": lambda: call(428, -1, b"", 0xFFFFFFFF),
        "open_tree_attr": lambda: call(467, -1, b"", 0xFFFFFFFF, NUL, 0),
        "fsopen": lambda: call(430, BAD, 0),
        "fsconfig": lambda: call(431, -1, 0, NUL, NUL, 0),
        "fsmount": lambda: call(432, -1, 0xFFFFFFFF, 0),
        "fspick": lambda: call(433, -1, BAD, 0xFFFFFFFF),
        "pivot_root": lambda: call(155, BAD, BAD),
        "chroot": lambda: call(161, BAD),
        "setns": lambda: call(308, -1, 0),
        "unshare(CLONE_NEWUSER)": lambda: in_child(lambda: call(272, 0x10000000)),
        "clone(CLONE_NEWUSER)": clone_newuser,
        "clone3": lambda: call(435, NUL, 0),
        "open_by_handle_at": lambda: call(304, -1, NUL, 0),
        "name_to_handle_at": lambda: call(303, -100, BAD, NUL, NUL, 0),
        "kexec_load": lambda: call(246, 0, 0, NUL, 0xFFFFFFFF),
        "kexec_file_load": lambda: call(320, -1, -1, 0, NUL, 0xFFFFFFFF),
        "init_module": lambda: call(175, NUL, 0, NUL),
        "finit_module": lambda: call(313, -1, NUL, 0xFFFFFFFF),
        "delete_module": lambda: call(176, BAD, 0),
        "reboot": lambda: call(169, 0, 0, 0, NUL),
        "swapon": lambda: call(167, BAD, 0xFFFFFFFF),
        "swapoff": lambda: call(168, BAD),
        "acct": lambda: call(163, BAD),
        "quotactl": lambda: call(179, 0, BAD, 0, NUL),
        "quotactl_fd": lambda: call(443, -1, 0, 0, NUL),
        "syslog": lambda: call(103, 10, NUL, 0),  # SYSLOG_ACTION_SIZE_BUFFER
        "settimeofday": lambda: call(164, BAD, BAD),
        "clock_settime": lambda: call(227, 0, BAD),
        "iopl": lambda: call(172, 0),  # level 0: no change, no capability needed
        "ioperm": lambda: call(173, 0, 0, 0),
        "personality(ADDR_NO_RANDOMIZE)": personality_no_aslr,
        "socket(AF_VSOCK)": lambda: call(41, 40, 1, 0),  # created, never connected
        "socket(AF_NETLINK, uevent)": lambda: call(41, 16, 3, 15),  # NETLINK_KOBJECT_UEVENT
        "socket(AF_NETLINK, sock_diag)": lambda: call(41, 16, 3, 4),  # NETLINK_SOCK_DIAG
        "socket(AF_PACKET)": lambda: call(41, 17, 3, 0),
        "socket(AF_ALG)": lambda: call(41, 38, 5, 0),
        "socketpair(AF_NETLINK)": lambda: call(53, 16, 3, 0, pair),
        "x32 getpid": lambda: call(0x40000000 | 39),
        # Refused since the filter became an allow-list (issue 15)
        "fanotify_init": fanotify,
        "fanotify_mark": lambda: call(301, -1, 0, 0, -100, NUL),
        "memfd_secret": lambda: call(447, 0),
        "sysfs": lambda: call(139, 3),  # how many file system types the kernel has
        "ustat": lambda: call(136, 0, buf),
        "vhangup": lambda: call(153),
        "clock_adjtime": lambda: call(305, 0, ctypes.create_string_buffer(512)),  # a query
        "adjtimex": lambda: call(159, ctypes.create_string_buffer(512)),  # modes 0: a query
        "set_mempolicy_home_node": lambda: call(450, 0, 0, 0, 0),
        "uselib": lambda: call(134, BAD),
        "cachestat": lambda: call(451, -1, BAD, BAD, 0),
        "remap_file_pages": lambda: call(216, 0, 0, 0, 0, 0),
        "set_thread_area": lambda: call(205, BAD),
        "get_thread_area": lambda: call(211, BAD),
        "process_mrelease": lambda: call(448, -1, 0),
        "personality(UNAME26)": lambda: personality(0x0020000),
        "personality(READ_IMPLIES_EXEC)": lambda: personality(0x0400000),
        # ENOSYS, so that libraries fall back
        "openat2": lambda: call(437, -100, BAD, BAD, 24),
        "io_setup": lambda: call(206, 1, BAD),
        "statmount": lambda: call(457, BAD, BAD, 0, 0),
        "listmount": lambda: call(458, BAD, BAD, 0, 0),
        "lsm_get_self_attr": lambda: call(459, 0xFFFF, BAD, BAD, 0),
        "lsm_list_modules": lambda: call(461, BAD, BAD, 0),
        "setxattrat": lambda: call(463, -1, BAD, 0, BAD, BAD, 0),
    }
    wanted = sys.argv[1:] or list(probes)
    print(json.dumps({name: probes[name]() for name in wanted}))


main()
