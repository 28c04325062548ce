"""Run inside a sandbox: reach another process with the calls the kernel checks by uid only.

argv[1] names the target: "parent" (corral's init, the payload's parent), "child"
(a child this probe forks), "thread" (a thread of this probe, by its id) or a
pid.  Every attempt sets what the target already has (its own limit, nice
value, scheduler, affinity, I/O priority, NUMA placement), so that even when
it succeeds nothing changes; signals are signal 0, a permission check only.
Prints {name: errno}, 0 meaning it succeeded.
x86_64 numbers.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long


def _target(name):
    if name == "parent":
        return os.getppid()
    if name == "child":
        pid = os.fork()
        if pid == 0:
            signal.pause()
        return pid
    if name == "thread":
        started = threading.Event()
        waiter = threading.Thread(target=lambda: (started.set(), threading.Event().wait()),
                                  daemon=True)
        waiter.start()
        started.wait()
        return waiter.native_id
    return int(name)


target = _target(sys.argv[1])


def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *(L(a) if isinstance(a, int) else a for a in args))
    return 0 if r >= 0 else ctypes.get_errno()


def prlimit():
    limit = (ctypes.c_ulong * 2)(*resource.getrlimit(resource.RLIMIT_CORE))  # 0, 0 here
    return call(302, target, resource.RLIMIT_CORE, ctypes.byref(limit), None)


def main():
    mask = ctypes.create_string_buffer(128)
    got = call(204, target, len(mask), mask)  # sched_getaffinity: reading stays open
    zero = ctypes.create_string_buffer(64)  # sched_param {0}; sched_attr with size 0
    attempts = {
        "prlimit64": prlimit,
        "setpriority(PRIO_PROCESS)": lambda: call(141, 0, target, os.getpriority(0, target)),
        "setpriority(PRIO_PGRP 0)": lambda: call(141, 1, 0, os.getpriority(1, 0)),
        "setpriority(PRIO_USER 0)": lambda: call(141, 2, 0, os.getpriority(2, 0)),
        "sched_setaffinity": lambda: call(203, target, len(mask), mask),
        "sched_setscheduler": lambda: call(144, target, 0, zero),  # SCHED_OTHER, priority 0
        "sched_setparam": lambda: call(142, target, zero),
        "sched_setattr": lambda: sched_setattr(zero),
        "ioprio_set": lambda: call(251, 1, target, call_get_ioprio()),
        "migrate_pages": lambda: call(256, target, 0, None, None),
        "move_pages": lambda: call(279, target, 0, None, None, None, 0),
    }
    out = {name: attempt() for name, attempt in attempts.items()}
    out["kill(0)"] = signal_errno(lambda: os.kill(target, 0))  # signal 0: permission only
    out["pidfd_send_signal(0)"] = signal_errno(lambda: signal.pidfd_send_signal(
        os.pidfd_open(target), 0))
    out["sched_getaffinity"] = got
    print(json.dumps(out))
    if sys.argv[1] == "child":
        os.kill(target, signal.SIGKILL)


def signal_errno(send):
    try:
        send()
        return 0
    except OSError as e:
        return e.errno


def sched_setattr(buf):
    call(315, target, buf, 56, 0)  # sched_getattr fills struct sched_attr: reading stays open
    return call(314, target, buf, 0)


def call_get_ioprio():
    ctypes.set_errno(0)
    r = libc.syscall(L(252), L(1), L(target))  # ioprio_get
    return max(int(r), 0)


main()
