"""The pure parts of egress: rules, address checks, HTTP heads, SOCKS5.  No sockets."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.egress import http, socks
from corral.egress.rules import (
    Code,
    address_problem,
    compile_rules,
    normalise_name,
    parse_host,
    parse_rule,
)
from corral.errors import UsageError
from corral.policy import Network


def rules(allow: tuple[str, ...] = (), deny: tuple[str, ...] = (),
          pins: tuple[tuple[str, str], ...] = ()):  # type: ignore[no-untyped-def]
    return compile_rules(Network(allow=allow, deny=deny, resolve=pins))


@pytest.mark.parametrize(("written", "normal"), [
    ("Example.COM", "example.com"), ("example.com.", "example.com"),
    ("bücher.example", "xn--bcher-kva.example"),
    ("\uff21\uff30\uff29\uff0eexample\uff0ecom", "api.example.com"),  # full-width
    ("a_b.example", "a_b.example"),
])
def test_names_are_normalised(written: str, normal: str) -> None:
    assert normalise_name(written) == normal


@pytest.mark.parametrize("bad", [
    "", ".", "a..b", "-a.com", "a-.com", "a b.com", "a/b", "a%41.com", "x" * 64 + ".com",
    "example.com..", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.0.0.1.",
    "1.2.3.4.5", "foo.123", "foo.0x1f",
])
def test_bad_and_numeric_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        normalise_name(bad)


def test_exact_wildcard_and_port_rules() -> None:
    r = rules(allow=("api.example.com", "*.cdn.example:443"))
    assert r.decide("API.example.com.", 8443).allowed
    assert r.decide("a.cdn.example", 443).allowed
    assert r.decide("a.b.cdn.example", 443).allowed
    assert r.decide("cdn.example", 443).code == Code.NOT_ALLOWED  # subdomains only
    assert r.decide("a.cdn.example", 80).code == Code.NOT_ALLOWED
    assert r.decide("xcdn.example", 443).code == Code.NOT_ALLOWED
    assert r.decide("example.com", 443).code == Code.NOT_ALLOWED


def test_deny_wins_and_empty_allow_allows_nothing() -> None:
    r = rules(allow=("*.example.com",), deny=("secret.example.com", "*.internal.example.com"))
    assert r.decide("www.example.com", 443).allowed
    d = r.decide("secret.example.com", 443)
    assert (d.allowed, d.code, d.rule) == (False, Code.DENIED, "secret.example.com")
    assert r.decide("a.internal.example.com", 80).code == Code.DENIED
    empty = rules()
    assert not empty.enabled and empty.decide("example.com", 443).code == Code.NOT_ALLOWED


@pytest.mark.parametrize("host", [
    "127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "10.0.0.1", "93.184.216.34", "[2606:4700::1]",
])
def test_ip_literals_need_a_rule_that_lists_them(host: str) -> None:
    r = rules(allow=("*.example.com", "example.com"))
    assert r.decide(host, 80).code == Code.IP_LITERAL
    listed = rules(allow=(host.replace("::ffff:", "").strip("[]") if "ffff" in host else host,))
    assert listed.decide(host, 80).allowed


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1",
                                  "127.0.0.1.", "017700000001", "[fe80::1%eth0]"])
def test_encoded_addresses_are_refused_even_when_the_address_is_listed(host: str) -> None:
    r = rules(allow=("127.0.0.1", "fe80::1"))
    assert r.decide(host, 80).code == Code.BAD_TARGET


@pytest.mark.parametrize(("address", "what"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"),
    ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fd12::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"), ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"),
    ("168.63.129.16", "metadata"), ("100.64.0.1", "shared"), ("240.0.0.1", "reserved"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "metadata"),
    ("64:ff9b::a9fe:a9fe", "metadata"), ("64:ff9b::7f00:1", "loopback"),
    ("2002:7f00:1::", "loopback"), ("::7f00:1", "loopback"), ("fec0::44", "site-local"),
    ("feff::1", "site-local"), ("::ffff:10.0.0.1", "private"),
])
def test_address_checks(address: str, what: str) -> None:
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None and what in problem


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700::1111", "8.8.8.8",
                                     "64:ff9b::808:808"])
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


def test_admit_refuses_a_name_with_any_blocked_address_unless_pinned() -> None:
    r = rules(allow=("api.example.com", "local.test"), pins=(("local.test", "127.0.0.1"),))
    d = r.decide("api.example.com", 443)
    public, loop = ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("127.0.0.1")
    assert r.admit(d, [public]).address == "93.184.216.34"
    mixed = r.admit(d, [public, loop])
    assert mixed.code == Code.BLOCKED_ADDRESS and "--resolve" in mixed.reason
    assert r.admit(d, []).code == Code.UNRESOLVED
    # Control: the pinned name reaches loopback on purpose.
    pinned = r.decide("local.test", 8080)
    assert r.admit(pinned, [loop]).address == "127.0.0.1"


def test_pins_are_checked() -> None:
    with pytest.raises(UsageError, match="no allow rule matches"):
        rules(allow=("a.test",), pins=(("b.test", "127.0.0.1"),))
    with pytest.raises(UsageError, match="not an IP address"):
        rules(allow=("a.test",), pins=(("a.test", "127.1"),))
    with pytest.raises(UsageError, match="not an IP address"):
        rules(allow=("a.test",), pins=(("a.test", "localhost"),))
    with pytest.raises(UsageError, match="both"):
        rules(allow=("a.test",), pins=(("a.test", "127.0.0.1"), ("A.test.", "127.0.0.2")))
    assert rules(allow=("*.test",), pins=(("a.test", "[::1]"),)).pins == {
        "a.test": ipaddress.ip_address("::1")}


@pytest.mark.parametrize("bad", ["*", "*.", "a*.example.com", "*example.com", "ex*.com",
                                 "http://example.com", "example.com:0", "example.com:99999",
                                 "example.com:http", "[::1", "user@example.com", " a.com",
                                 "127.1", "example.com/"])
def test_bad_rules_are_refused_with_the_syntax(bad: str) -> None:
    with pytest.raises(UsageError, match="rules are NAME"):
        parse_rule(bad)


@given(st.text(max_size=80), st.integers(min_value=-5, max_value=70000))
def test_decide_never_raises_and_reasons_are_one_ascii_line(host: str, port: int) -> None:
    d = rules(allow=("*.example.com", "127.0.0.1")).decide(host, port)
    assert "\n" not in d.reason and d.reason.isascii()
    if d.allowed:
        assert d.host is not None and (d.host.endswith(".example.com") or d.host == "127.0.0.1")


@given(st.from_regex(r"[a-zA-Z0-9-]{1,20}(\.[a-zA-Z0-9-]{1,20}){0,3}\.[a-zA-Z]{2,6}",
                     fullmatch=True))
def test_normal_form_is_stable(name: str) -> None:
    try:
        once = normalise_name(name)
    except ValueError:
        return
    assert normalise_name(once) == once == parse_host(once).name


# -- HTTP heads --------------------------------------------------------------------

def test_connect_and_absolute_requests_parse() -> None:
    c = http.parse_request(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443"
                           b"\r\n\r\n")
    assert (c.tunnel, c.host, c.port) == (True, "api.example.com", 443)
    g = http.parse_request(b"GET http://a.test:8080/x?y=1 HTTP/1.1\r\nHost: a.test:8080\r\n"
                           b"Proxy-Connection: keep-alive\r\nConnection: X-Secret\r\n"
                           b"X-Secret: 1\r\nAccept: */*\r\n\r\n")
    assert (g.host, g.port, g.path) == ("a.test", 8080, "/x?y=1")
    head = http.upstream_head(g, "a.test")
    assert head.startswith(b"GET /x?y=1 HTTP/1.1\r\n") and b"Connection: close" in head
    assert b"Proxy-Connection" not in head and b"X-Secret" not in head and b"Accept" in head


@pytest.mark.parametrize(("head", "status"), [
    (b"CONNECT a.test:443 HTTP/1.1\r\nHost: b.test:443\r\n\r\n", 403),
    (b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:8443\r\n\r\n", 403),
    (b"GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n", 403),
    (b"GET http://a.test:8080/ HTTP/1.1\r\nHost: a.test\r\n\r\n", 403),
    (b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", 400),
    (b"GET https://a.test/ HTTP/1.1\r\n\r\n", 400),
    (b"GET http://u:p@a.test/ HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT a.test HTTP/1.1\r\n\r\n", 400),
    (b"POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
    (b"POST http://a.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
    (b"POST http://a.test/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\nHost: a.test\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/2.0\r\n\r\n", 505),
    (b"GET  http://a.test/ HTTP/1.1\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
])
def test_bad_and_inconsistent_heads_are_refused(head: bytes, status: int) -> None:
    with pytest.raises(http.BadRequest) as info:
        http.parse_request(head)
    assert info.value.status == status and "\n" not in info.value.reason


def test_denial_response_carries_the_reason_in_body_and_header() -> None:
    resp = http.deny_response(403, "not-allowed", "evil.test:443 is not in the allow list\r\nX")
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"X-Corral-Denied: not-allowed\r\n" in head
    assert b"X-Corral-Reason: evil.test:443 is not in the allow list  X" in head
    assert body == b"corral: evil.test:443 is not in the allow list  X\n"


@given(st.binary(max_size=300))
def test_http_parser_only_raises_bad_request(data: bytes) -> None:
    for head in (data, data + b"\r\n\r\n", b"GET http://a.test/ HTTP/1.1\r\n" + data + b"\r\n\r\n"):
        try:
            req = http.parse_request(head)
        except http.BadRequest as e:
            assert "\n" not in e.reason
        else:
            assert 0 < req.port < 65536


# -- SOCKS5 ------------------------------------------------------------------------

def test_socks_connect_parses_and_other_commands_are_refused() -> None:
    assert socks.parse_greeting(b"\x05\x01\x00") == (3, True)
    assert socks.parse_greeting(b"\x05\x01\x02") == (3, False)
    assert socks.parse_greeting(b"\x05\x02\x00") is None
    name = b"\x05\x01\x00\x03\x08a.test.x\x01\xbb"
    assert socks.parse_request(name) == (len(name), "a.test.x", 443)
    assert socks.parse_request(b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50")[1:] == (
        "127.0.0.1", 80)
    assert socks.parse_request(b"\x05\x01\x00\x04" + bytes(15) + b"\x01\x00\x50")[1] == "[::1]"
    for command in (2, 3):
        with pytest.raises(socks.SocksError) as info:
            socks.parse_request(bytes((5, command, 0, 1, 127, 0, 0, 1, 0, 80)))
        assert info.value.reply_code == socks.COMMAND_NOT_SUPPORTED


@given(st.binary(max_size=64))
def test_socks_parser_only_raises_socks_error(data: bytes) -> None:
    for parse in (socks.parse_greeting, socks.parse_request):
        try:
            parse(data)  # type: ignore[operator]
        except socks.SocksError as e:
            assert 0 < e.reply_code < 9


# -- IDNA 2008, numbers, smuggling, relays (issue 11) --------------------------------

@pytest.mark.parametrize(("written", "normal"), [
    ("xn--strae-oqa.test", "xn--strae-oqa.test"),  # the IDNA 2008 form, written as such
    ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
    ("\u03c3\u03b1\u03c3.gr", "xn--mxa9ab.gr"),  # Greek: no deviation characters
    ("_dmarc.bücher.example", "_dmarc.xn--bcher-kva.example"),
])
def test_idna_2008_names(written: str, normal: str) -> None:
    assert normalise_name(written) == normal


@pytest.mark.parametrize("ambiguous", ["straße.test", "faß.de", "a\u200db.test"])
def test_names_read_two_ways_are_refused(ambiguous: str) -> None:
    """IDNA 2003 maps ß to ss and drops joiners; IDNA 2008 keeps them: two names."""
    with pytest.raises(ValueError, match="IDNA 200"):
        normalise_name(ambiguous)


@pytest.mark.parametrize("bad", ["xn--zz-.test", "xn--a.test", "☃.test"])
def test_invalid_idna_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        normalise_name(bad)


def test_a_deny_rule_in_idna_2008_form_matches_what_curl_sends() -> None:
    with pytest.raises(UsageError, match="IDNA 2003"):
        rules(allow=("*.test",), deny=("straße.test",))
    r = rules(allow=("*.test",), deny=("xn--strae-oqa.test",))
    assert r.decide("xn--strae-oqa.test", 443).code == Code.DENIED
    assert r.decide("strasse.test", 443).allowed  # another name under IDNA 2008


UNICODE_DIGITS = ["\u00b2", "\u00b9", "\u0663", "\uff11", "+1", "-1", "1_0", "1 1", "0x10",
                  "1" * 14]


@pytest.mark.parametrize("digits", UNICODE_DIGITS)
def test_ports_and_lengths_are_ascii_digits_only(digits: str) -> None:
    raw = digits.encode("latin-1", "replace") if digits.isascii() or ord(max(digits)) < 256 \
        else digits.encode()
    heads = [b"GET http://a.test/ HTTP/1.1\r\nHost: a.test:" + raw + b"\r\n\r\n",
             b"POST http://a.test/ HTTP/1.1\r\nContent-Length: " + raw + b"\r\n\r\n",
             b"CONNECT a.test:" + raw + b" HTTP/1.1\r\n\r\n"]
    for head in heads:
        with pytest.raises(http.BadRequest) as info:
            http.parse_request(head)
        assert info.value.status in (400, 403)


@pytest.mark.parametrize("named", ["content-length", "Host", "transfer-encoding", "expect",
                                   "keep-alive, Content-Length"])
def test_connection_may_not_name_framing_or_routing_headers(named: str) -> None:
    head = (f"POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: {named}\r\n"
            "Content-Length: 3\r\n\r\n").encode()
    with pytest.raises(http.BadRequest, match="not hop-by-hop"):
        http.parse_request(head)


def test_host_and_content_length_are_always_forwarded() -> None:
    req = http.parse_request(b"POST http://a.test:81/p HTTP/1.1\r\nHost: a.test:81\r\n"
                             b"Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
                             b"Content-Length: 3\r\n\r\n")
    assert http.upstream_head(req, "a.test") == (
        b"POST /p HTTP/1.1\r\nHost: a.test:81\r\nContent-Length: 3\r\nConnection: close\r\n\r\n")


def test_head_reader_finds_the_end_across_chunks_and_caps_the_size() -> None:
    reader = http.HeadReader()
    head = b"GET http://a.test/ HTTP/1.1\r\nX: y\r\n\r\n"
    results = [reader.feed(head[i:i + 1]) for i in range(len(head) - 1)]
    assert results == [None] * (len(head) - 1)
    assert reader.feed(head[-1:] + b"body") == (head, b"body")
    big = http.HeadReader()
    with pytest.raises(http.BadRequest) as info:
        for _ in range(http.MAX_HEAD // 1000 + 2):
            big.feed(b"a" * 1000)
    assert info.value.status == 431


def test_loopback_rules_with_a_port_are_relayed_and_nothing_else() -> None:
    r = rules(allow=("127.0.0.1:11434", "localhost:8080", "[::1]:9000", "127.0.0.1",
                     "*.test:80", "api.test:443", "10.0.0.5:80", "gone.test:81"),
              deny=("gone.test",),
              pins=(("localhost", "127.0.0.1"), ("gone.test", "127.0.0.1")))
    assert [(str(x.listen), x.port, x.target) for x in r.relays()] == [
        ("127.0.0.1", 11434, "127.0.0.1"), ("127.0.0.1", 8080, "localhost"),
        ("::1", 9000, "[::1]")]
    with pytest.raises(UsageError, match="corral's proxy"):
        rules(allow=("127.0.0.1:3128",))


def test_shown_allow_rules_leave_out_what_deny_removes() -> None:
    r = rules(allow=("api.example.com", "*.test", "a.example", "b.example:443"),
              deny=("api.example.com", "*.example:443", "secret.test"))
    assert r.shown() == ("*.test", "a.example")


def test_a_deny_rule_naming_an_address_denies_it_by_any_name() -> None:
    r = rules(allow=("*.example.com", "pinned.test", "11.22.33.44:8080"),
              deny=("11.22.33.44", "[2a00::5]:443"), pins=(("pinned.test", "11.22.33.44"),))
    d = r.decide("api.example.com", 443)
    for seen in ("11.22.33.44", "::ffff:11.22.33.44", "64:ff9b::b16:212c", "2002:b16:212c::1"):
        refused = r.admit(d, [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address(seen)])
        assert (refused.code, refused.rule) == (Code.DENIED, "*.example.com"), seen
        assert refused.reason.endswith("which rule 11.22.33.44 denies")
    assert r.admit(r.decide("pinned.test", 80), [ipaddress.ip_address("11.22.33.44")]).code \
        == Code.DENIED  # deny wins over a pin...
    assert r.decide("11.22.33.44", 8080).code == Code.DENIED  # ...and over a listed literal
    v6 = ipaddress.ip_address("2a00::5")
    assert r.admit(d, [v6]).code == Code.DENIED
    # Controls: another port of a deny rule with a port, another address, no deny rule.
    assert r.admit(r.decide("api.example.com", 80), [v6]).allowed
    assert r.admit(d, [ipaddress.ip_address("11.22.33.45")]).allowed
    assert rules(allow=("*.example.com",)).admit(
        d, [ipaddress.ip_address("11.22.33.44")]).allowed


def test_a_denied_pin_is_neither_relayed_nor_shown() -> None:
    r = rules(allow=("localhost:11434", "model.test:8080", "other.test"),
              deny=("127.0.0.1", "[::1]:9999"),
              pins=(("localhost", "127.0.0.1"), ("model.test", "::1"), ("other.test", "::1")))
    assert r.relays() == tuple(x for x in r.relays() if x.port == 8080)
    assert [x.target for x in r.relays()] == ["model.test"]
    assert r.shown() == ("model.test:8080", "other.test")  # ::1 is denied on 9999 only
    # Control: without the deny rules both loopback ports are relayed and shown.
    ok = rules(allow=("localhost:11434", "model.test:8080"),
               pins=(("localhost", "127.0.0.1"), ("model.test", "::1")))
    assert [x.port for x in ok.relays()] == [11434, 8080]
    assert ok.shown() == ("localhost:11434", "model.test:8080")
