"""The pure parts of ``corral mcp``: tool arguments to requests, outcomes to replies, and
the capping that keeps a tool call from widening the server's policy.  No bwrap."""

from __future__ import annotations

from typing import Any

import pytest

from corral.api import Result
from corral.errors import UsageError
from corral.execute import capped, run_in
from corral.mcp import tools
from corral.policy import Limits, Network, Policy
from corral.request import RequestLimits, RunRequest
from corral.result import RunResult
from corral.workspace import Change


def _result(**changes: Any) -> Result:
    base: dict[str, Any] = dict(exit_code=0, status="exited", signal=None, wall_s=0.5,
                                cpu_s=0.1, peak_memory_bytes=1 << 20, stdout=b"out",
                                stderr=b"", truncated=False, workspace="/w", record="/r",
                                run_id="x")
    return Result(**{**base, **changes})


def test_run_code_arguments_become_a_request() -> None:
    req = tools.run_code_request({"language": "python", "code": "print(1)", "stdin": "in",
                                  "timeout_s": 7, "files": {"d/f.txt": {"base64": "AAE="}}})
    assert (req.code, req.language, req.stdin) == ("print(1)", "python", b"in")
    assert req.files == (("d/f.txt", b"\0\1"),) and req.limits == RequestLimits(timeout_s=7)
    assert req.profile is None and req.network == Network()


def test_run_command_takes_argv_or_a_shell_command() -> None:
    assert tools.run_command_request({"argv": ["ls", "-l"]}).command == ("ls", "-l")
    assert tools.run_command_request({"command": "ls | wc"}).command == (
        "/bin/bash", "-c", "ls | wc")


@pytest.mark.parametrize("tool,args,why", [
    ("run_code", {"code": "x"}, "needs language"),
    ("run_code", {"language": "python", "code": "x", "profile": "claude"}, "unknown key"),
    ("run_code", {"language": "python", "code": "x", "timeout_s": True}, "positive"),
    ("run_code", {"language": "python", "code": "x", "files": {"/etc/x": ""}}, "relative"),
    ("run_code", {"language": "python", "code": "x", "files": {"a/../b": ""}}, "relative"),
    ("run_command", {"command": ["ls"]}, "must be a string"),
    ("run_command", {"argv": []}, "non-empty list"),
    ("run_command", {"argv": ["a"], "network": {"allow": ["x.com"]}}, "unknown key"),
])
def test_bad_arguments_say_what_why_and_how(tool: str, args: dict[str, Any], why: str) -> None:
    parse = tools.run_code_request if tool == "run_code" else tools.run_command_request
    with pytest.raises(UsageError, match=why) as e:
        parse(args)
    assert "\n" not in str(e.value)


def test_a_request_can_lower_the_servers_limits_and_never_raise_them() -> None:
    policy = Policy(limits=Limits(timeout_s=30, memory_bytes=1 << 30, pids=64))
    lowered = capped(policy, RequestLimits(timeout_s=5, memory_bytes=1 << 20, pids=8))
    assert (lowered.limits.timeout_s, lowered.limits.memory_bytes, lowered.limits.pids) == (
        5, 1 << 20, 8)
    raised = capped(policy, RequestLimits(timeout_s=3600, memory_bytes=1 << 40, pids=10**6))
    assert raised.limits == policy.limits
    # A limit the server does not set is the request's to set.
    assert capped(Policy(limits=Limits(timeout_s=None)),
                  RequestLimits(timeout_s=9)).limits.timeout_s == 9


def test_run_in_refuses_a_request_that_names_a_profile_or_network() -> None:
    for req in (RunRequest(command=("true",), profile="python"),
                RunRequest(command=("true",), network=Network(allow=("example.com",)))):
        res = run_in(req, Policy(), "/nonexistent", owner=None, runs_dir="/nonexistent")
        assert res.status == "invalid" and "policy" in (res.error or "")


def test_long_output_is_cut_in_the_middle_and_marked() -> None:
    out = b"H" * 40000 + b"M" * 100000 + b"T" * 40000
    reply = tools.run_reply(RunResult("i", "exited", run=_result(stdout=out)))
    shown = reply["stdout"]
    assert shown.startswith("H" * 1000) and shown.endswith("T" * 1000)
    assert "[corral: 180000 bytes in all; 114464 in the middle are not shown]" in shown
    assert reply["output_cut_for_reply"] == ["stdout"] and "output_limit_hit" not in reply
    short = tools.run_reply(RunResult("i", "exited", run=_result(truncated=True)))
    assert short["stdout"] == "out" and short["output_limit_hit"] is True


def test_a_reply_lists_what_changed_and_the_compile_step() -> None:
    compiled = _result(changes=(Change("main", "created", "file", 10, "ab"),))
    ran = _result(exit_code=3, changes=tuple(Change(f"f{i}", "created", "file", 1)
                                             for i in range(300)))
    reply = tools.run_reply(RunResult("i", "exited", run=ran, compile=compiled))
    assert reply["exit_code"] == 3 and reply["ok"] is False
    assert reply["compile"]["status"] == "exited"
    assert reply["files_changed"][0] == {"path": "main", "change": "created", "type": "file",
                                         "size": 10}
    assert len(reply["files_changed"]) == tools.REPLY_CHANGES and reply["files_changed_cut"]
    failed = tools.run_reply(RunResult("i", "compile-failed", compile=compiled))
    assert failed["status"] == "compile-failed" and failed["exit_code"] is None


def test_a_run_that_could_not_start_is_a_tool_error() -> None:
    with pytest.raises(UsageError, match="bwrap is missing"):
        tools.run_reply(RunResult.refused("i", "error", "bwrap is missing; x; y"))


def test_the_policy_is_described_to_the_agent() -> None:
    text = tools.describe(Policy(name="python", limits=Limits(
        timeout_s=60, memory_bytes=512 << 20, pids=32, disk_bytes=1 << 30)))
    assert "no network" in text and "timeout 60 s" in text and "memory 512 MiB" in text
    assert "32 processes" in text and "workspace 1024 MiB in all" in text


def test_every_tool_schema_forbids_unknown_arguments() -> None:
    for name, tool in tools.TOOLS.items():
        assert tool.schema["type"] == "object", name
        assert tool.schema["additionalProperties"] is False, name
    assert set(tools.TOOLS["run_code"].schema["properties"]["language"]["enum"]) == {
        "python", "nodejs", "bash", "c", "cpp"}


def test_a_run_that_lost_its_init_is_a_reply_saying_so() -> None:
    lost = _result(exit_code=125, status="error", stdout=b"partial", error="the init died")
    reply = tools.run_reply(RunResult("i", "error", run=lost, error="the init died"))
    assert reply["status"] == "error" and reply["error"] == "the init died"
    assert reply["stdout"] == "partial" and reply["ok"] is False
