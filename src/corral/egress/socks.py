"""SOCKS5 (RFC 1928), CONNECT only, no authentication.  Pure: bytes in, values out.

BIND and UDP ASSOCIATE are refused with reply 07 (command not supported):
UDP would bypass every name rule, and BIND would open a port on the host.
A domain name is resolved by the proxy (``socks5h``); an address is matched
as an IP literal, which only a rule that lists it allows.
"""

from __future__ import annotations

import ipaddress

from .rules import Code

__all__ = ["SocksError", "greeting_reply", "parse_greeting", "parse_request", "reply"]

VERSION = 5
NO_AUTH = 0
NO_ACCEPTABLE = 0xFF
CMD_CONNECT = 1

# Reply codes (RFC 1928, section 6)
SUCCEEDED = 0
GENERAL_FAILURE = 1
NOT_ALLOWED = 2
NETWORK_UNREACHABLE = 3
HOST_UNREACHABLE = 4
CONNECTION_REFUSED = 5
TTL_EXPIRED = 6
COMMAND_NOT_SUPPORTED = 7
ADDRESS_NOT_SUPPORTED = 8

REPLY_FOR = {
    Code.DENIED: NOT_ALLOWED, Code.NOT_ALLOWED: NOT_ALLOWED, Code.IP_LITERAL: NOT_ALLOWED,
    Code.BLOCKED_ADDRESS: NOT_ALLOWED, Code.BAD_TARGET: ADDRESS_NOT_SUPPORTED,
    Code.UNRESOLVED: HOST_UNREACHABLE, Code.BAD_REQUEST: GENERAL_FAILURE,
    Code.UNREACHABLE: HOST_UNREACHABLE,
}


class SocksError(Exception):
    def __init__(self, reply_code: int, reason: str) -> None:
        super().__init__(reason)
        self.reply_code = reply_code
        self.reason = reason


def parse_greeting(data: bytes) -> tuple[int, bool] | None:
    """(bytes used, whether no-auth is offered), or None if more bytes are needed."""
    if len(data) < 2:
        return None
    if data[0] != VERSION:
        raise SocksError(GENERAL_FAILURE, "not SOCKS version 5")
    end = 2 + data[1]
    if data[1] == 0:
        raise SocksError(GENERAL_FAILURE, "the SOCKS greeting offers no method")
    if len(data) < end:
        return None
    return end, NO_AUTH in data[2:end]


def greeting_reply(accepted: bool) -> bytes:
    return bytes((VERSION, NO_AUTH if accepted else NO_ACCEPTABLE))


def parse_request(data: bytes) -> tuple[int, str, int] | None:
    """(bytes used, host as written, port), or None if more bytes are needed."""
    if len(data) < 5:
        return None
    version, command, reserved, kind = data[0], data[1], data[2], data[3]
    if version != VERSION or reserved != 0:
        raise SocksError(GENERAL_FAILURE, "malformed SOCKS request")
    if command != CMD_CONNECT:
        what = {2: "BIND", 3: "UDP ASSOCIATE"}.get(command, f"command {command}")
        raise SocksError(COMMAND_NOT_SUPPORTED, f"SOCKS {what} is not supported; "
                                                "only CONNECT is")
    if kind == 1:
        end = 4 + 4
        if len(data) < end + 2:
            return None
        host = str(ipaddress.IPv4Address(data[4:end]))
    elif kind == 4:
        end = 4 + 16
        if len(data) < end + 2:
            return None
        host = "[" + str(ipaddress.IPv6Address(data[4:end])) + "]"
    elif kind == 3:
        end = 5 + data[4]
        if data[4] == 0:
            raise SocksError(ADDRESS_NOT_SUPPORTED, "empty SOCKS host name")
        if len(data) < end + 2:
            return None
        try:
            host = data[5:end].decode("utf-8")
        except UnicodeDecodeError:
            raise SocksError(ADDRESS_NOT_SUPPORTED, "the SOCKS host name is not UTF-8") from None
    else:
        raise SocksError(ADDRESS_NOT_SUPPORTED, f"SOCKS address type {kind} is unknown")
    port = int.from_bytes(data[end:end + 2], "big")
    return end + 2, host, port


def reply(code: int) -> bytes:
    """A reply with an all-zero bound address, which clients ignore."""
    return bytes((VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0))
