"""Host names, IP literals and ports in normal form; which addresses are special.  Pure.

A name is normalised once (case, trailing dot, IDNA 2008) and that normal
form is what rules match *and* what the proxy resolves.  An IP literal is
accepted only in its canonical form: every other numeric spelling
(``127.1``, ``2130706433``, ``0x7f.1``, ``0177.0.0.1``) is refused, because
resolvers disagree on what it means.  Numbers are ASCII digits only.
"""

from __future__ import annotations

import functools
import ipaddress
import re

from ..record import Record

__all__ = ["METADATA", "Host", "IPAddress", "address_forms", "address_problem", "canonical_ip",
           "normalise_name", "parse_host", "parse_port", "split_host_port"]

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


class Host(Record, frozen=True):
    """A target host in normal form: ``name`` is lower-case ASCII, or the canonical IP."""

    name: str
    ip: IPAddress | None = None

    def __str__(self) -> str:
        return f"[{self.name}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.name



def normalise_name(text: str) -> str:
    """Lower-case ASCII (IDNA 2008) form of a host name; raises ValueError saying why not.

    Non-ASCII names are mapped with UTS-46 non-transitional processing, as
    curl and browsers do, and refused when IDNA 2003 (Python's own codec,
    older clients) reads them differently: ``straße.test`` is
    ``xn--strae-oqa.test`` to one and ``strasse.test`` to the other, so a rule
    written that way would match one name and the client could send the other.
    """
    if not text or len(text) > 255 or any(c.isspace() or c in "%/\\@?#[]" for c in text):
        raise ValueError("is not a host name")
    ascii_name = text.lower() if text.isascii() else _idna_2008(text)
    ascii_name = ascii_name.removesuffix(".")
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError("is not a valid host name")
    if any(label.startswith("xn--") for label in labels):
        _check_a_labels(labels)
    if _NUMERIC_LABEL.match(labels[-1]):
        # Resolvers read 127.1, 2130706433, 0x7f.1 and 0177.0.0.1 as addresses.
        raise ValueError("is a numeric address in a non-canonical form")
    return ascii_name


def _idna_2008(text: str) -> str:
    """UTS-46 non-transitional mapping and A-labels; refuses a name IDNA 2003 reads otherwise."""
    import idna  # ~17 ms: only names that are not ASCII pay for it

    try:
        mapped = idna.uts46_remap(text, std3_rules=False, transitional=False)
        # ASCII labels keep their underscores (_dmarc.example); _LABEL checks them later.
        new = ".".join(label if label.isascii() else idna.alabel(label).decode("ascii")
                       for label in mapped.split("."))
    except (idna.IDNAError, UnicodeError):
        raise ValueError("is not a valid host name (IDNA 2008)") from None
    try:
        old = text.encode("idna").decode("ascii").lower()
    except UnicodeError:
        old = "invalid"
    if old.removesuffix(".") != new.removesuffix("."):
        raise ValueError(f"is read as {new.removesuffix('.')} under IDNA 2008 but as "
                         f"{old.removesuffix('.')} under IDNA 2003; write the ASCII name "
                         "you mean")
    return new


def _check_a_labels(labels: list[str]) -> None:
    """Every ``xn--`` label must be a valid A-label (what it decodes to encodes back to it)."""
    import idna

    for label in labels:
        if not label.startswith("xn--"):
            continue
        try:
            same = idna.alabel(idna.ulabel(label)).decode("ascii") == label
        except (idna.IDNAError, UnicodeError):
            same = False
        if not same:
            raise ValueError(f"has {label!r}, which is not a valid IDNA A-label")


def canonical_ip(text: str) -> IPAddress | None:
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
        addr = canonical_ip(inner)
        if addr is None:
            raise ValueError("is not a valid IPv6 address")
        return Host(str(addr), addr)
    if inner != text:
        raise ValueError("has brackets but is not an IPv6 address")
    addr = canonical_ip(text)
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



def address_problem(addr: IPAddress) -> str | None:
    """Why ``addr`` is never reached unless pinned or listed, or None if it is public."""
    if addr in METADATA:
        return "a cloud metadata address"
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            inner = address_problem(embedded)
            return None if inner is None else f"an IPv6 address embedding {embedded}, {inner}"
    # Site-local (fec0::/10, deprecated but still routed inside networks that used it) is
    # private in meaning, yet Python's is_private and is_global do not say so.
    for test, what in (("is_unspecified", "the unspecified address"),
                       ("is_loopback", "a loopback address"),
                       ("is_link_local", "a link-local address"),
                       ("is_site_local", "a site-local address"),
                       ("is_multicast", "a multicast address"),
                       ("is_reserved", "a reserved address"),
                       ("is_private", "a private address")):
        if getattr(addr, test, False):  # IPv4 addresses have no is_site_local
            return what
    if isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT:
        return "a shared (carrier-grade NAT) address"
    if not addr.is_global:
        return "a reserved address"
    return None


def address_forms(addr: IPAddress) -> tuple[IPAddress, ...]:
    """``addr`` and the IPv4 address it embeds, if any: the forms a rule naming an
    address is compared with (a connection to either reaches the same host)."""
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            return addr, embedded
    return (addr,)


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if any(addr in net for net in _NAT64) or (addr in _COMPAT and int(addr) > 1):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None

