"""Policy and profile validation: pure, strict, with messages that say how to fix."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.errors import ProfileError, UsageError
from corral.policy import Limits, Network, Policy, parse_duration, parse_size
from corral.profiles import builtin_profiles, load_profile, policy_from_mapping


@pytest.mark.parametrize(("text", "value"), [
    ("512", 512), ("1K", 1024), ("2M", 2 << 20), ("1G", 1 << 30), ("1.5G", 3 << 29),
    ("64KiB", 64 << 10), ("3mb", 3 << 20), (4096, 4096),
])
def test_sizes(text: str | int, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-1", "0", "1X", "1 G B", True])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="size"):
        parse_size(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "value"), [
    ("30", 30.0), ("30s", 30.0), ("500ms", 0.5), ("5m", 300.0), ("1h", 3600.0), (2, 2.0),
])
def test_durations(text: str | float, value: float) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["", "soon", "-5", "0", "nan", "inf", "1d"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


@given(st.text())
def test_size_parser_never_crashes(text: str) -> None:
    with contextlib.suppress(UsageError):
        assert parse_size(text) > 0


# The grammar the parsers had as regular expressions (ASCII digits: the hand-written
# parsers refuse other scripts' digits, which float() would have taken).
_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\Z", re.IGNORECASE)
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\Z")


def _or_error(parse: Callable[[str], object], text: str) -> object:
    try:
        return parse(text)
    except UsageError:
        return "refused"


@settings(max_examples=3000)
@given(st.text(alphabet="0123456789.kmgtKMGTiIbBsh \t-+e\u0663\u2003", max_size=8))
def test_size_and_duration_parsers_keep_the_grammar(text: str) -> None:
    """corral.policy parses sizes and durations by hand (re is not imported at every start):
    what it takes is what the regular expressions took, with the same value."""
    size = _SIZE_RE.match(text.strip())
    want = int(float(size.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30,
                                       "t": 1 << 40}[size.group(2).lower()]) if size else 0
    assert _or_error(parse_size, text) == (want if want > 0 else "refused")
    duration = _DURATION_RE.match(text.strip())
    seconds = float(duration.group(1)) * {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0,
                                          "h": 3600.0}[duration.group(2)] if duration else 0
    assert _or_error(parse_duration, text) == (seconds if seconds > 0 else "refused")


def test_limits_must_be_positive() -> None:
    with pytest.raises(UsageError, match="pids"):
        Limits(pids=0)


@pytest.mark.parametrize("path", ["", "relative/x", "/a\nb", "/a\0b", "/a\rb"])
def test_policy_refuses_unusable_paths(path: str) -> None:
    with pytest.raises(UsageError):
        Policy(read_only=(path,))


def test_policy_refuses_bad_env_names() -> None:
    with pytest.raises(UsageError, match="not valid"):
        Policy(env=(("1BAD", "x"),))


def test_network_rules_must_be_names() -> None:
    with pytest.raises(UsageError, match="host name"):
        Network(allow=("http://example.com/x",))


def test_shipped_profiles_load() -> None:
    names = builtin_profiles()
    assert {"python", "node", "shell"} <= set(names)
    for name in names:
        assert load_profile(name).name == name


def test_unknown_key_gets_did_you_mean() -> None:
    with pytest.raises(ProfileError, match="did you mean 'timeout'"):
        policy_from_mapping({"limits": {"timeuot": 5}}, "x", "x.toml")


def test_unknown_section_gets_did_you_mean() -> None:
    with pytest.raises(ProfileError, match="did you mean 'network'"):
        policy_from_mapping({"netwrok": {}}, "x", "x.toml")


def test_wrong_types_are_refused() -> None:
    with pytest.raises(ProfileError, match="integer"):
        policy_from_mapping({"limits": {"pids": "many"}}, "x", "x.toml")
    with pytest.raises(ProfileError, match="list of strings"):
        policy_from_mapping({"network": {"allow": "example.com"}}, "x", "x.toml")


def test_profile_values_become_policy() -> None:
    p = policy_from_mapping({"limits": {"timeout": "2m", "memory": "1G", "pids": 64},
                             "env": {"set": {"A": "1"}, "pass": ["TERM"]},
                             "allow": {"no-landlock": True}}, "x", "x.toml")
    assert p.limits.timeout_s == 120 and p.limits.memory_bytes == 1 << 30
    assert p.limits.pids == 64 and p.env == (("A", "1"),) and p.pass_env == ("TERM",)
    assert p.allow.no_landlock and not p.allow.no_seccomp


def test_malformed_toml_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[limits\ntimeout = 5")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(str(f))


def test_missing_profile_name_suggests() -> None:
    with pytest.raises(ProfileError, match="did you mean 'python'"):
        load_profile("pyhton")


def test_unix_sockets_is_a_strict_profile_setting() -> None:
    assert Policy().unix_sockets is True  # the default allows them
    assert not policy_from_mapping({"ipc": {"unix_sockets": False}}, "x", "x.toml").unix_sockets
    with pytest.raises(ProfileError, match="true or false"):
        policy_from_mapping({"ipc": {"unix_sockets": "no"}}, "x", "x.toml")
    with pytest.raises(ProfileError, match="did you mean 'unix_sockets'"):
        policy_from_mapping({"ipc": {"unix_socket": False}}, "x", "x.toml")
    with pytest.raises(ProfileError, match="unknown key 'unix-sockets'"):
        policy_from_mapping({"allow": {"unix-sockets": True}}, "x", "x.toml")


def test_script_profiles_forbid_unix_sockets_and_shell_allows_them() -> None:
    assert not load_profile("python").unix_sockets and not load_profile("node").unix_sockets
    assert load_profile("shell").unix_sockets


def test_agent_profiles_keep_their_state_in_corrals_copy() -> None:
    for name, folder in (("claude", "~/.claude"), ("codex", "~/.codex"), ("pi", "~/.pi"),
                         ("gemini", "~/.gemini"), ("aider", "~/.aider")):
        policy = load_profile(name)
        assert policy.state.dirs == (folder,)
        assert not any(w.startswith(folder) for w in policy.writable), name  # never the real
    claude = load_profile("claude")
    assert ("~/.claude.json", "~/.claude/.claude.json") in claude.state.imports
    assert dict(claude.env)["CLAUDE_CONFIG_DIR"] == "~/.claude"


@pytest.mark.parametrize("state", [
    {"dirs": ["/etc"]},  # not in the home directory
    {"dirs": ["~/../x"]},
    {"dirs": ["~/.a"], "credentials": ["~/.b/token"]},  # not inside a state folder
    {"dirs": ["~/.a"], "import_to": {"~/x": "~/.elsewhere/x"}},
    {"dirs": ["~/.a"], "imports": ["~/x"]},  # unknown key
])
def test_bad_state_tables_are_refused(state: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        policy_from_mapping({"state": state}, "t", "test")


def test_prefix_patterns_pass_variables() -> None:
    from corral.policy import passed

    env = {"CODEX_HOME": "h", "CODEX_X": "x", "OTHER": "o", "EXACT": "e"}
    assert sorted(passed(["CODEX_*", "EXACT", "MISSING"], env)) == [
        ("CODEX_HOME", "h"), ("CODEX_X", "x"), ("EXACT", "e")]
    with pytest.raises(UsageError):
        Policy(pass_env=("BAD*",))
