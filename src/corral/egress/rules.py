"""Egress rules: which names, ports and addresses a sandbox may reach.  Pure: no I/O.

A decision is made in two steps, and the proxy connects only when both allow:

 1. :meth:`Rules.decide` looks at the target as the client wrote it.  The host
    is parsed strictly (:mod:`.hosts`): a name is normalised once (case,
    trailing dot, IDNA 2008) and that normal form is what is matched *and* what
    is later resolved; an IP literal is accepted only in its canonical form.
    Deny rules win over allow rules; an empty allow list allows nothing; an IP
    literal is allowed only by a rule that lists it.
 2. :meth:`Rules.admit` looks at the addresses the name resolved to (or was
    pinned to) and picks the one to connect to.  A name pinned with
    ``--resolve`` may reach its pinned address whatever it is (that is how a
    user reaches a local service on purpose); a listed IP literal likewise.
    Any other name is refused if *any* of its addresses is loopback, private,
    link-local, site-local, multicast, unspecified, reserved or a cloud metadata
    address, looking through IPv4-mapped, IPv4-compatible, NAT64 and 6to4
    addresses.  Before any of that, a deny rule that names an address denies
    every name that leads there, pinned or not (deny wins).
    After connecting, the proxy also refuses a peer that is one of the host's
    own addresses (:mod:`.local`), again unless pinned or listed.

Rule syntax: ``NAME``, ``*.NAME`` (subdomains only, not NAME itself), an IP
literal (``10.0.0.5``, ``[fd00::1]``), each optionally followed by ``:PORT``.
A rule without a port matches every port.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

from ..errors import UsageError
from ..record import Record
from .hosts import (
    METADATA,
    Host,
    IPAddress,
    address_forms,
    address_problem,
    canonical_ip,
    normalise_name,
    parse_host,
    parse_port,
    split_host_port,
)

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from ..policy import Network

__all__ = [
    "METADATA",
    "Code",
    "Decision",
    "Host",
    "IPAddress",
    "Relay",
    "Rule",
    "Rules",
    "address_problem",
    "compile_rules",
    "normalise_name",
    "parse_host",
    "parse_network",
    "parse_pin",
    "parse_port",
    "parse_rule",
    "split_host_port",
]

BRIDGE_PORT = 3128  # the bridge's port on 127.0.0.1 in the sandbox's own network namespace


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


class Decision(Record, frozen=True):
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


class Rule(Record, frozen=True):
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

    def names_address(self, address: IPAddress, port: int | None) -> bool:
        """Whether this rule is an IP literal naming ``address`` (or the IPv4 address it
        embeds), on ``port`` (None: every port the rule covers)."""
        if self.host.ip is None or (self.port is not None and port is not None
                                    and self.port != port):
            return False
        return self.host.ip in address_forms(address)

    def covers(self, other: Rule) -> bool:
        """Whether every host and port ``other`` matches, this rule matches too."""
        if self.port is not None and self.port != other.port:
            return False
        if not self.wildcard:
            return not other.wildcard and self.matches(other.host, other.port or 1)
        return other.host.ip is None and (
            other.host.name.endswith("." + self.host.name)
            or (other.wildcard and other.host.name == self.host.name))

    def __str__(self) -> str:
        text = ("*." if self.wildcard else "") + str(self.host)
        return text if self.port is None else f"{text}:{self.port}"


class Relay(Record, frozen=True):
    """A loopback address and port the bridge also listens on inside the sandbox.

    A connection accepted there goes to ``target`` (the rule's literal or the
    pinned name) on the same port, decided like a CONNECT to it: that is how a
    client that ignores proxy variables reaches a model server on the host's
    loopback (``--allow-domain 127.0.0.1:11434``).
    """

    listen: IPAddress
    port: int
    target: str


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
    addr = canonical_ip(inner)
    if addr is None:
        raise UsageError(f"--resolve address {address!r} for {name} is not an IP address",
                         "pins take a canonical IPv4 or IPv6 address, never a name",
                         "write it like 127.0.0.1 or [::1]")
    return host.name, addr


class Rules(Record, frozen=True):
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

    def explicit(self, host: Host) -> bool:
        """Whether ``host`` names its address on purpose: a listed literal or a pinned name."""
        return host.ip is not None or self.pinned(host) is not None

    def relays(self) -> tuple[Relay, ...]:
        """Loopback ports to relay inside the sandbox: allowed rules with a port whose
        literal, or whose pinned address, is loopback; the first rule for an address wins."""
        found: dict[tuple[IPAddress, int], Relay] = {}
        for rule in self.allow:
            address = rule.host.ip or self.pinned(rule.host)
            if (rule.wildcard or rule.port is None or address is None
                    or not address.is_loopback or (address, rule.port) in found):
                continue
            if self.admit(self.decide(str(rule.host), rule.port), [address]).allowed:
                found[address, rule.port] = Relay(address, rule.port, str(rule.host))
        return tuple(found.values())

    def shown(self) -> tuple[str, ...]:
        """The allow rules that a deny rule does not cancel whole, for one line to the user:
        neither by naming them nor by naming the address they are pinned to."""
        return tuple(str(a) for a in self.allow if not any(d.covers(a) for d in self.deny)
                     and not self._pin_denied(a))

    def _pin_denied(self, rule: Rule) -> bool:
        address = None if rule.wildcard else self.pinned(rule.host)
        return address is not None and any(
            d.names_address(address, rule.port) and (d.port is None or d.port == rule.port)
            for d in self.deny)

    def denying(self, address: IPAddress, port: int | None) -> Rule | None:
        """The deny rule that names ``address`` (in any form that reaches it) on ``port``."""
        return next((d for d in self.deny if d.names_address(address, port)), None)

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
        for addr in addresses:  # deny wins, over pins and listed literals too
            denied = self.denying(addr, decision.port)
            if denied is not None:
                return decision.refuse(Code.DENIED, f"{host} resolves to {addr}, which rule "
                                                    f"{denied} denies")
        if not self.explicit(host):
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
    clash = [r for r in rules.relays() if r.port == BRIDGE_PORT and str(r.listen) == "127.0.0.1"]
    if clash:
        raise UsageError(f"--allow-domain {clash[0].target}:{BRIDGE_PORT} cannot be relayed",
                         f"127.0.0.1:{BRIDGE_PORT} inside the sandbox is corral's proxy",
                         "run the local service on another port")
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
