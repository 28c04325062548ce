"""Egress rules: which names, ports and addresses a sandbox may reach.  Pure: no I/O.

A decision is made in two steps, and the proxy connects only when both allow:

 1. :meth:`Rules.decide` looks at the target as the client wrote it.  The host
    is parsed strictly (:func:`parse_host`): a name is normalised once (case,
    trailing dot, IDNA) and that normal form is what is matched *and* what is
    later resolved; an IP literal is accepted only in its canonical form, and
    every other numeric spelling (``127.1``, ``2130706433``, ``0x7f.1``,
    ``0177.0.0.1``) is refused, because resolvers disagree on what it means.
    Deny rules win over allow rules; an empty allow list allows nothing; an IP
    literal is allowed only by a rule that lists it.
 2. :meth:`Rules.admit` looks at the addresses the name resolved to (or was
    pinned to) and picks the one to connect to.  A name pinned with
    ``--resolve`` may reach its pinned address whatever it is (that is how a
    user reaches a local service on purpose); a listed IP literal likewise.
    Any other name is refused if *any* of its addresses is loopback, private,
    link-local, multicast, unspecified, reserved or a cloud metadata address,
    looking through IPv4-mapped, IPv4-compatible, NAT64 and 6to4 addresses.

Rule syntax: ``NAME``, ``*.NAME`` (subdomains only, not NAME itself), an IP
literal (``10.0.0.5``, ``[fd00::1]``), each optionally followed by ``:PORT``.
A rule without a port matches every port.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from ..policy import Network

__all__ = [
    "Code",
    "Decision",
    "Host",
    "Rule",
    "Rules",
    "address_problem",
    "compile_rules",
    "parse_host",
    "parse_network",
    "parse_pin",
    "parse_rule",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")

# Cloud metadata services.  Most sit in ranges refused anyway (169.254.0.0/16,
# fc00::/7, 100.64.0.0/10); Azure's wire server is a public address.
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200",
    "168.63.129.16", "192.0.0.192",
))
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_COMPAT = ipaddress.IPv6Network("::/96")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")


class Code(enum.StrEnum):
    """Why a decision came out the way it did; stable words for logs and ``--json``."""

    ALLOWED = "allowed"
    DENIED = "denied"  # a deny rule matched
    NOT_ALLOWED = "not-allowed"  # no allow rule matched
    IP_LITERAL = "ip-literal"  # an IP address that no rule lists
    BAD_TARGET = "bad-target"  # not a host name, IP literal or port
    BLOCKED_ADDRESS = "blocked-address"  # resolved to an address that is never reached
    UNRESOLVED = "unresolved"  # the name has no address
    BAD_REQUEST = "bad-request"  # the request itself is malformed or inconsistent
    UNREACHABLE = "unreachable"  # allowed, but the connection failed


@dataclass(frozen=True, slots=True)
class Host:
    """A target host in normal form: ``name`` is lower-case ASCII, or the canonical IP."""

    name: str
    ip: IPAddress | None = None

    def __str__(self) -> str:
        return f"[{self.name}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.name


@dataclass(frozen=True, slots=True)
class Decision:
    """One egress decision: allowed or not, a stable code and a one-line reason."""

    allowed: bool
    code: Code
    reason: str  # one line, ASCII, safe in an HTTP header
    host: str | None = None  # normal form, or None when the target could not be parsed
    port: int | None = None
    address: str | None = None  # the address connected to (when allowed after admit)
    rule: str | None = None  # the rule that decided, if any

    def refuse(self, code: Code, reason: str) -> Decision:
        return Decision(False, code, reason, self.host, self.port, self.address, self.rule)


@dataclass(frozen=True, slots=True)
class Rule:
    """One allow or deny rule, normalised."""

    host: Host
    wildcard: bool = False  # *.NAME: strict subdomains of NAME
    port: int | None = None  # None: every port

    def matches(self, host: Host, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.wildcard:
            return host.ip is None and host.name.endswith("." + self.host.name)
        return (self.host.ip is None) == (host.ip is None) and self.host.name == host.name

    def __str__(self) -> str:
        text = ("*." if self.wildcard else "") + str(self.host)
        return text if self.port is None else f"{text}:{self.port}"


def normalise_name(text: str) -> str:
    """Lower-case ASCII (IDNA) form of a host name; raises ValueError saying why not."""
    if not text or len(text) > 255 or any(c.isspace() or c in "%/\\@?#[]" for c in text):
        raise ValueError("is not a host name")
    if text.endswith("."):
        text = text[:-1]
    try:
        ascii_name = text.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError("is not a valid host name (IDNA)") from None
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError("is not a valid host name")
    if _NUMERIC_LABEL.match(labels[-1]):
        # Resolvers read 127.1, 2130706433, 0x7f.1 and 0177.0.0.1 as addresses.
        raise ValueError("is a numeric address in a non-canonical form")
    return ascii_name


def _ip(text: str) -> IPAddress | None:
    """The address if ``text`` is a canonical IPv4 literal or an IPv6 literal (no zone)."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id is not None:
            return None
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped  # the same socket either way: match it as IPv4
    return addr


@functools.lru_cache(maxsize=4096)  # pure, and called several times per request
def parse_host(text: str) -> Host:
    """A target host: ``name``, ``1.2.3.4``, ``[::1]`` (brackets optional for IPv6)."""
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if ":" in inner:
        addr = _ip(inner)
        if addr is None:
            raise ValueError("is not a valid IPv6 address")
        return Host(str(addr), addr)
    if inner != text:
        raise ValueError("has brackets but is not an IPv6 address")
    addr = _ip(text)
    if addr is not None:
        return Host(str(addr), addr)
    return Host(normalise_name(text))


def parse_port(text: str) -> int:
    if not _PORT.match(text) or not 0 < int(text) < 65536:
        raise ValueError(f"port {text!r} is not a number from 1 to 65535")
    return int(text)


def split_host_port(text: str) -> tuple[str, str | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port``; a bare IPv6 literal has no port."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("has an unclosed '['")
        rest = text[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError("has text after ']'")
        return text[:end + 1], rest[1:] if rest else None
    if text.count(":") > 1:
        return text, None
    host, colon, port = text.partition(":")
    return host, port if colon else None


def _rule_error(text: str, why: str) -> UsageError:
    return UsageError(f"network rule {text!r} {why}",
                      "rules are NAME, *.NAME or an IP address, each optionally with :PORT",
                      "write it like api.example.com, *.example.com:443 or 10.0.0.5:8080")


def parse_rule(text: str) -> Rule:
    """One allow/deny rule; raises UsageError with the reason."""
    if not isinstance(text, str):
        raise _rule_error(repr(text), "is not a string")
    try:
        if "/" in text or "@" in text or not text.strip() or text != text.strip():
            raise ValueError("is not a host name (give the name alone, not a URL)")
        host_text, port_text = split_host_port(text)
        port = None if port_text is None else parse_port(port_text)
        if host_text.startswith("*."):
            return Rule(Host(normalise_name(host_text[2:])), wildcard=True, port=port)
        if "*" in host_text:
            raise ValueError("has a '*' that is not a leading '*.' label")
        return Rule(parse_host(host_text), port=port)
    except ValueError as e:
        raise _rule_error(text, str(e)) from None


def parse_pin(text: str) -> tuple[str, str]:
    """``NAME:ADDRESS`` (like curl's --resolve, without the port) -> (name, address)."""
    name, colon, address = text.partition(":")
    if not colon:
        raise UsageError(f"--resolve {text!r} has no address", "the form is NAME:ADDRESS",
                         "write it like api.test:127.0.0.1 or api.test:[::1]")
    return name, address


def check_pin(name: str, address: str) -> tuple[str, IPAddress]:
    """A pin in normal form; the address must be a canonical IP literal."""
    try:
        host = Host(normalise_name(name))
    except ValueError as e:
        raise UsageError(f"--resolve name {name!r} {e}", "a pin maps a host name to an address",
                         "give a host name like api.test") from None
    inner = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    addr = _ip(inner)
    if addr is None:
        raise UsageError(f"--resolve address {address!r} for {name} is not an IP address",
                         "pins take a canonical IPv4 or IPv6 address, never a name",
                         "write it like 127.0.0.1 or [::1]")
    return host.name, addr


def address_problem(addr: IPAddress) -> str | None:
    """Why ``addr`` is never reached unless pinned or listed, or None if it is public."""
    if addr in METADATA:
        return "a cloud metadata address"
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            inner = address_problem(embedded)
            return None if inner is None else f"an IPv6 address embedding {embedded}, {inner}"
    for test, what in (("is_unspecified", "the unspecified address"),
                       ("is_loopback", "a loopback address"),
                       ("is_link_local", "a link-local address"),
                       ("is_multicast", "a multicast address"),
                       ("is_reserved", "a reserved address"),
                       ("is_private", "a private address")):
        if getattr(addr, test):
            return what
    if isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT:
        return "a shared (carrier-grade NAT) address"
    if not addr.is_global:
        return "a reserved address"
    return None


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if any(addr in net for net in _NAT64) or (addr in _COMPAT and int(addr) > 1):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True, slots=True)
class Rules:
    """A compiled :class:`~corral.policy.Network`: allow and deny rules, and pins."""

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    pins: Mapping[str, IPAddress] | None = None  # normal name -> address

    @property
    def enabled(self) -> bool:
        """Whether any traffic can be allowed at all (an empty allow list allows nothing)."""
        return bool(self.allow)

    def pinned(self, host: Host) -> IPAddress | None:
        return None if host.ip is not None or not self.pins else self.pins.get(host.name)

    def decide(self, host_text: str, port: int | str) -> Decision:
        """Step 1: the target as the client wrote it, against the deny and allow rules."""
        try:
            host = parse_host(host_text)
        except ValueError as e:
            return Decision(False, Code.BAD_TARGET, f"host {_quote(host_text)} {e}")
        try:
            number = port if isinstance(port, int) else parse_port(port)
            if not 0 < number < 65536:
                raise ValueError(f"port {number} is not a number from 1 to 65535")
        except ValueError as e:
            return Decision(False, Code.BAD_TARGET, str(e), host.name)
        where = f"{host}:{number}"
        for rule in self.deny:
            if rule.matches(host, number):
                return Decision(False, Code.DENIED, f"{where} is denied by rule {rule}",
                                host.name, number, rule=str(rule))
        for rule in self.allow:
            if rule.matches(host, number):
                return Decision(True, Code.ALLOWED, f"{where} is allowed by rule {rule}",
                                host.name, number, rule=str(rule))
        if host.ip is not None:
            return Decision(False, Code.IP_LITERAL,
                            f"{where} is an IP address that no allow rule lists",
                            host.name, number)
        return Decision(False, Code.NOT_ALLOWED, f"{where} is not in the allow list",
                        host.name, number)

    def admit(self, decision: Decision, addresses: Sequence[IPAddress]) -> Decision:
        """Step 2: the addresses an allowed target resolved to; picks the one to connect to."""
        if not decision.allowed or decision.host is None:
            return decision
        host = parse_host(decision.host)
        if not addresses:
            return decision.refuse(Code.UNRESOLVED, f"{host} has no address")
        explicit = host.ip is not None or self.pinned(host) is not None
        if not explicit:
            for addr in addresses:
                problem = address_problem(addr)
                if problem is not None:
                    return decision.refuse(
                        Code.BLOCKED_ADDRESS,
                        f"{host} resolves to {addr}, {problem}; pin it with --resolve "
                        f"{host}:{addr} to reach it on purpose")
        return Decision(True, Code.ALLOWED, decision.reason, decision.host, decision.port,
                        str(addresses[0]), decision.rule)


def _quote(text: str) -> str:
    """A host as the client wrote it, made safe for one log line or header."""
    shown = text[:80].encode("ascii", "backslashreplace").decode("ascii")
    return repr(shown + ("..." if len(text) > 80 else ""))


def compile_rules(network: Network) -> Rules:
    """Parse and check every rule and pin of ``network``; raises UsageError.

    Also refuses a pin that no allow rule matches: pinning never allows a name,
    so such a pin does nothing, which is almost surely a mistake.
    """
    rules = parse_network(network)
    unused = [name for name in rules.pins or {} if not _allows_somewhere(rules, name)]
    if unused:
        raise UsageError(f"--resolve pins {unused[0]}, but no allow rule matches it",
                         "a pin only says where a name goes; it does not allow the name",
                         f"add --allow-domain {unused[0]}")
    return rules


def parse_network(network: Network) -> Rules:
    """Parse every rule and pin of ``network`` on its own; raises UsageError."""
    pins: dict[str, IPAddress] = {}
    for name, address in network.resolve:
        key, addr = check_pin(name, address)
        if key in pins and pins[key] != addr:
            raise UsageError(f"--resolve pins {key} to both {pins[key]} and {addr}",
                             "a name is pinned to one address", "keep one of them")
        pins[key] = addr
    return Rules(allow=_rules(network.allow), deny=_rules(network.deny), pins=pins)


def _rules(texts: Iterable[str]) -> tuple[Rule, ...]:
    return tuple(dict.fromkeys(parse_rule(t) for t in texts))


def _allows_somewhere(rules: Rules, name: str) -> bool:
    host = Host(name)
    return any(r.matches(host, r.port or 443) for r in rules.allow)
