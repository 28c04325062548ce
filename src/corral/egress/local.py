"""Whether an address is one of this host's own: the kernel would deliver to it locally.

A public name can resolve to one of the host's own public addresses (IPv4
or IPv6, on any interface); a connection to it reaches every service bound
on ``0.0.0.0`` or ``[::]`` on the host, exactly as loopback would.  Lists of
interface addresses miss ``ip route add local 203.0.113.0/24`` ("AnyIP")
and change while the proxy runs, so corral asks the kernel the question it
answers when it routes a packet: ``RTM_GETROUTE`` for the address, and a
reply of type ``RTN_LOCAL`` means "this host".  The proxy asks just before
and again just after connecting (the peer as connected), so an address
added to an interface in between is still seen.

The request and reply formats are pure functions, tested with exact bytes;
:class:`LocalCheck` owns the netlink socket.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

from .hosts import IPAddress

__all__ = ["LocalCheck", "route_request", "route_type"]

RTM_NEWROUTE, RTM_GETROUTE = 24, 26
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
RTA_DST = 1
RTN_LOCAL = 2
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol,
#                                      scope, type, flags
_RTATTR = struct.Struct("=HH")
# "No route" means the connection cannot be made at all: not this host.
_NOT_LOCAL_ERRORS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH})


def route_request(addr: IPAddress, seq: int) -> bytes:
    """An ``RTM_GETROUTE`` request for the route to exactly ``addr``."""
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    packed = addr.packed
    attr = _RTATTR.pack(_RTATTR.size + len(packed), RTA_DST) + packed
    body = _RTMSG.pack(family, len(packed) * 8, 0, 0, 0, 0, 0, 0, 0) + attr
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, seq, 0) + body


def route_type(reply: bytes, seq: int) -> int | None:
    """The route type (``RTN_*``) in the kernel's reply to request ``seq``; None if there
    is no route; raises OSError for any other error or a reply that does not parse."""
    if len(reply) < _HEADER.size:
        raise OSError(errno.EPROTO, "short netlink reply")
    length, kind, _, got_seq, _ = _HEADER.unpack_from(reply)
    if got_seq != seq or length > len(reply):
        raise OSError(errno.EPROTO, "netlink reply to another request")
    if kind == NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", reply, _HEADER.size)
        if -code in _NOT_LOCAL_ERRORS:
            return None
        raise OSError(-code, f"netlink route lookup failed: {errno.errorcode.get(-code, code)}")
    if kind != RTM_NEWROUTE or length < _HEADER.size + _RTMSG.size:
        raise OSError(errno.EPROTO, f"unexpected netlink message type {kind}")
    return int(_RTMSG.unpack_from(reply, _HEADER.size)[7])


class LocalCheck:
    """Asks the kernel whether addresses are local; one netlink socket, opened on first use.

    Used from the proxy's event loop thread only.  A route lookup is answered
    while the request is being sent, so the blocking read returns at once.
    """

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.seq = 0

    def is_local(self, addr: IPAddress) -> bool:
        """Whether ``addr`` is one of this host's own; raises OSError if that cannot be told."""
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if self.sock is None:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                      0)  # NETLINK_ROUTE
            self.sock.settimeout(5.0)
        self.seq = (self.seq + 1) & 0x7FFFFFFF
        self.sock.send(route_request(addr, self.seq))
        while True:
            reply = self.sock.recv(65536)
            if len(reply) >= _HEADER.size and _HEADER.unpack_from(reply)[3] != self.seq:
                continue  # a late answer to an earlier request that timed out
            return route_type(reply, self.seq) == RTN_LOCAL

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
