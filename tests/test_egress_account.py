"""The pure parts of the proxy's per-run bounds and of the own-address check: exact values."""

from __future__ import annotations

import errno
import ipaddress
import json
import struct
from pathlib import Path

import pytest

from corral.egress import account, local, log
from corral.egress.account import FULL_BUFFER, MIN_BUFFER, Account, buffer_cost
from corral.egress.rules import Code, Decision


def test_cpu_share_is_a_token_bucket() -> None:
    a = Account(cpu_share=0.1)
    assert a.charge_cpu(0.4, 0.1) == 0.0  # within the burst: 0.5 + 0.01 (capped) - 0.4
    assert a.balance == pytest.approx(0.1)
    assert a.charge_cpu(0.12, 0.1) == pytest.approx(0.1)  # 0.11 - 0.12: 0.01 s owed at 0.1
    # The pause is wall time the share accrues over: the next quiet tick owes nothing.
    assert a.charge_cpu(0.0, 0.1) == pytest.approx(0.0, abs=1e-9)
    assert a.charge_cpu(100.0, 0.1) == account.MAX_PAUSE_S  # one pause is at most this long
    assert a.cpu_used == pytest.approx(100.52)


def test_without_a_share_the_proxy_is_never_paused() -> None:
    a = Account(cpu_share=None)
    assert a.charge_cpu(50.0, 0.1) == 0.0 and a.cpu_used == 50.0


def test_tunnels_get_full_buffers_while_the_budget_lasts() -> None:
    a = Account(byte_budget=3 * buffer_cost(FULL_BUFFER) + 1)
    grants = [a.grant_buffer() for _ in range(5)]
    assert grants == [FULL_BUFFER] * 3 + [MIN_BUFFER] * 2
    a.release_buffer(FULL_BUFFER)
    a.release_buffer(MIN_BUFFER)  # costs nothing, returns nothing
    assert a.grant_buffer() == FULL_BUFFER and a.grant_buffer() == MIN_BUFFER
    assert Account(byte_budget=None).grant_buffer() is None  # no budget: kernel defaults


def test_request_bytes_held_are_a_budget() -> None:
    a = Account(hold_budget=100)
    assert a.hold(60) and a.hold(40)
    assert not a.hold(1) and a.hold_left == 0  # refused: nothing taken
    a.unhold(40)
    assert not a.hold(41) and a.hold(40)
    assert account.HOLD_BUDGET == 4 << 20


def test_the_decision_log_stops_at_its_byte_cap(tmp_path: Path) -> None:
    long = Decision(False, Code.BAD_TARGET, "host " + "\\U0001f600" * 80 + " is not valid")
    path = tmp_path / "egress.jsonl"
    decisions = log.DecisionLog(str(path))
    for _ in range(log.MAX_BYTES // 900):  # about 1,000 bytes a line: past the cap
        decisions.record("socks5", long)
    decisions.close()
    lines = path.read_bytes().splitlines()
    assert path.stat().st_size <= log.MAX_BYTES
    assert json.loads(lines[-1])["truncated"] is True
    assert all("truncated" not in json.loads(x) for x in lines[:-1])
    assert decisions.denied == log.MAX_BYTES // 900  # still counted, and kept for the result
    # Control: what fits is written whole, with no truncated line.
    short = tmp_path / "short.jsonl"
    few = log.DecisionLog(str(short))
    for _ in range(100):
        few.record("socks5", long)
    few.close()
    assert len(short.read_bytes().splitlines()) == 100


def test_route_request_bytes() -> None:
    req = local.route_request(ipaddress.ip_address("127.0.0.1"), 7)
    assert req == (struct.pack("=IHHII", 36, 26, 1, 7, 0) + bytes((2, 32, 0, 0, 0, 0, 0, 0))
                   + bytes(4) + struct.pack("=HH", 8, 1) + bytes((127, 0, 0, 1)))
    v6 = local.route_request(ipaddress.ip_address("2a00::1"), 8)
    assert len(v6) == 16 + 12 + 4 + 16 and v6[16:18] == bytes((10, 128))


def test_route_type_reads_the_kernels_answers() -> None:
    route = struct.pack("=IHHII", 28, 24, 0, 5, 0) + bytes((2, 32, 0, 0, 255, 2, 254, 2)) + bytes(4)
    assert local.route_type(route, 5) == local.RTN_LOCAL
    unreachable = struct.pack("=IHHII", 36, 2, 0, 5, 0) + struct.pack("=i", -errno.ENETUNREACH)
    assert local.route_type(unreachable + bytes(16), 5) is None
    denied = struct.pack("=IHHII", 36, 2, 0, 5, 0) + struct.pack("=i", -errno.EPERM)
    with pytest.raises(OSError):
        local.route_type(denied + bytes(16), 5)
    with pytest.raises(OSError):
        local.route_type(route, 6)  # an answer to another request


def test_the_kernel_says_loopback_is_ours_and_a_test_net_address_is_not() -> None:
    check = local.LocalCheck()
    try:
        assert check.is_local(ipaddress.ip_address("127.0.0.1"))
        assert check.is_local(ipaddress.ip_address("::ffff:127.0.0.1"))
        assert not check.is_local(ipaddress.ip_address("198.51.100.7"))  # a lookup, no packet
    finally:
        check.close()
