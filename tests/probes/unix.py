"""Run inside a sandbox: which kinds of unix sockets work.

argv[1]: a host stream socket's path; argv[2]: a host datagram socket's path.
Prints a JSON object: for each attempt, what it read back (or "sent"), or its
errno; "filters" is [this process's seccomp filter count, its parent's].
"""

import json
import os
import socket
import sys


def connect_unix():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sys.argv[1])
        return s.recv(64).decode()


def pair(kind=socket.SOCK_STREAM):
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    with a, b:
        a.send(b"pair")
        return b.recv(8).decode()


def datagram_pair(kind):
    # One end of a datagram pair can address any visible unix datagram socket (issue 15).
    a, b = socket.socketpair(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
    with a, b:
        a.sendto(f"from a {kind} pair".encode(), sys.argv[2])
        return "sent"


def loopback():
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        conn, _ = server.accept()
        client.send(b"tcp")
        return conn.recv(8).decode()


def filters():
    def count(pid):
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Seccomp_filters"))

    return [count("self"), count(os.getppid())]


out = {}
for name, attempt in (("unix", connect_unix), ("socketpair", pair),
                      ("seqpacket", lambda: pair(socket.SOCK_SEQPACKET)),
                      ("dgram", lambda: datagram_pair(socket.SOCK_DGRAM)),
                      ("raw", lambda: datagram_pair(socket.SOCK_RAW)),
                      ("loopback", loopback), ("filters", filters)):
    try:
        out[name] = attempt()
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))
