"""Profiles: TOML files that become a :class:`~corral.policy.Policy`, validated strictly.

Shipped profiles live in ``corral/profiles/*.toml``; ``--profile FILE`` takes
any other file.  Unknown keys are errors, with a "did you mean" suggestion:
a typo in a security policy must never be silently ignored.

Schema (every key optional)::

    description = "one line"
    [limits]      timeout, cpu (durations); memory, disk, output, fsize, tmp, shm (sizes);
                  pids, nofile, files, ptys (integers); cpus (number); "none" switches off an
                  optional limit (timeout, cpu, memory, pids, cpus, disk, fsize)
    [env]         set = { NAME = "value" }   pass = ["NAME"]
    [filesystem]  read_only, writable, hidden = ["/abs/path", "~/in/home"]
                  protect, allow_secrets = ["name or glob"]  (agent mode)
    [state]       dirs = ["~/.claude"]  (agent mode: corral's private copy, mounted there)
                  import = ["~/.claude/settings.json"]  copied in when the copy is made
                  import_to = { "~/.claude.json" = "~/.claude/.claude.json" }  (same, moved)
                  credentials = ["~/.claude/.credentials.json"]  copied in at every launch
    [network]     allow = ["api.example.com", "*.example.com:443"]   deny = [...]
                  resolve = { "api.test" = "127.0.0.1" }  (pins, like --resolve)
    [ipc]         unix_sockets = false   (default true: may the payload create AF_UNIX sockets)
    [allow]       nested-userns, no-seccomp, no-landlock, unenforced-limits
"""

from __future__ import annotations

import os

from .errors import ProfileError, UsageError
from .policy import Allow, Limits, Network, Policy, State, parse_duration, parse_size
from .record import replace

TYPE_CHECKING = False  # typing costs ~3 ms at every start (corral.record says why)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

__all__ = ["builtin_profiles", "load_profile", "policy_from_mapping",
           "profile_for_command"]

if TYPE_CHECKING:
    Check = Callable[[Any, str], Any]


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{where} must be a string", f"it is {type(value).__name__}", "")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{where} must be an integer", f"it is {value!r}", "")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{where} must be a number", f"it is {value!r}", "")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{where} must be true or false", f"it is {value!r}", "")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProfileError(f"{where} must be a list of strings", f"it is {value!r}", "")
    return tuple(value)


def _string_table(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ProfileError(f"{where} must be a table of strings", f"it is {value!r}", "")
    return tuple(value.items())


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ProfileError(f"{where} must be a size like \"512M\"", f"it is {value!r}", "")
    return parse_size(value, where)


def _duration(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProfileError(f"{where} must be a duration like \"30s\"", f"it is {value!r}", "")
    return parse_duration(value, where)


def _optional(check: Check) -> Check:
    """A limit that may be switched off with the string "none"."""
    def parse(value: Any, where: str) -> Any:
        return None if value == "none" else check(value, where)
    return parse


# TOML key -> (Limits field, check)
LIMITS: dict[str, tuple[str, Check]] = {
    "timeout": ("timeout_s", _optional(_duration)), "cpu": ("cpu_s", _optional(_duration)),
    "memory": ("memory_bytes", _optional(_size)), "pids": ("pids", _optional(_int)),
    "cpus": ("cpus", _optional(_number)), "disk": ("disk_bytes", _optional(_size)),
    "output": ("output_bytes", _size), "nofile": ("nofile", _int), "files": ("files", _int),
    "fsize": ("fsize_bytes", _optional(_size)), "tmp": ("tmp_bytes", _size),
    "shm": ("shm_bytes", _size), "ptys": ("ptys", _int),
}
SECTIONS: dict[str, dict[str, Check] | Check] = {
    "description": _str,
    "limits": {key: check for key, (_, check) in LIMITS.items()},
    "env": {"set": _string_table, "pass": _strings},
    "filesystem": {"read_only": _strings, "writable": _strings, "hidden": _strings,
                   "protect": _strings, "allow_secrets": _strings},
    "state": {"dirs": _strings, "import": _strings, "import_to": _string_table,
              "credentials": _strings},
    "network": {"allow": _strings, "deny": _strings, "resolve": _string_table},
    "ipc": {"unix_sockets": _bool},
    "allow": dict.fromkeys(Allow.names(), _bool),
}


def _unknown(key: str, known: list[str], where: str) -> ProfileError:
    import difflib  # only for a misspelt name

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
    return ProfileError(f"unknown key {key!r} in {where}", hint,
                        "fix the key; unknown keys are never ignored")


def _validate(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check every key and value; returns {section: {key: parsed value}}."""
    parsed: dict[str, Any] = {}
    for key, value in data.items():
        spec = SECTIONS.get(key)
        if spec is None:
            raise _unknown(key, list(SECTIONS), where)
        if callable(spec):
            parsed[key] = spec(value, f"{where}: {key}")
            continue
        if not isinstance(value, dict):
            raise ProfileError(f"{where}: [{key}] must be a table", f"it is {value!r}", "")
        section = {}
        for sub, subvalue in value.items():
            check = spec.get(sub)
            if check is None:
                raise _unknown(sub, list(spec), f"{where} [{key}]")
            section[sub] = check(subvalue, f"{where}: {key}.{sub}")
        parsed[key] = section
    return parsed


def policy_from_mapping(data: Mapping[str, Any], name: str, where: str) -> Policy:
    """A Policy from already-parsed TOML, validated strictly."""
    p = _validate(data, where)
    limits = p.get("limits", {})
    env = p.get("env", {})
    net = p.get("network", {})
    allow = p.get("allow", {})
    fs = p.get("filesystem", {})
    st = p.get("state", {})
    try:
        return Policy(
            name=name,
            limits=replace(Limits(), **{LIMITS[k][0]: v for k, v in limits.items()}),
            network=Network(allow=net.get("allow", ()), deny=net.get("deny", ()),
                            resolve=net.get("resolve", ())),
            env=env.get("set", ()),
            pass_env=env.get("pass", ()),
            read_only=fs.get("read_only", ()),
            writable=fs.get("writable", ()),
            hidden=fs.get("hidden", ()),
            protect=fs.get("protect", ()),
            allow_secrets=fs.get("allow_secrets", ()),
            state=State(dirs=tuple(d.rstrip("/") for d in st.get("dirs", ())),
                        imports=(*((x, x) for x in st.get("import", ())),
                                 *st.get("import_to", ())),
                        credentials=st.get("credentials", ())),
            unix_sockets=p.get("ipc", {}).get("unix_sockets", True),
            allow=Allow(**{k.replace("-", "_"): v for k, v in allow.items()}),
        )
    except UsageError as e:
        raise ProfileError(f"{where}: {e}") from None


SHIPPED = os.path.join(os.path.dirname(__file__), "profiles")


def profile_for_command(cmd: Sequence[str]) -> str:
    """The run-mode profile a command gets by default, from its name."""
    name = os.path.basename(cmd[0]) if cmd else ""
    if name.startswith(("python", "pip", "pypy")):
        return "python"
    if name in ("node", "nodejs", "npm", "npx"):
        return "node"
    return "shell"


def builtin_profiles() -> list[str]:
    return sorted(n.removesuffix(".toml") for n in os.listdir(SHIPPED) if n.endswith(".toml"))


def load_profile(name_or_path: str) -> Policy:
    """Load a shipped profile by name, or a TOML file by path."""
    if "/" in name_or_path or name_or_path.endswith(".toml"):
        path = os.path.abspath(name_or_path)
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError as e:
            raise ProfileError(f"cannot read profile {name_or_path}", e.strerror or "",
                               "check the path") from None
        name = os.path.basename(path).removesuffix(".toml")
    else:
        shipped = os.path.join(SHIPPED, f"{name_or_path}.toml")
        if "\0" in name_or_path or not os.path.isfile(shipped):
            known = builtin_profiles()
            import difflib

            close = difflib.get_close_matches(name_or_path, known, n=1)
            raise ProfileError(f"no profile named {name_or_path!r}",
                               f"did you mean {close[0]!r}?" if close
                               else f"shipped profiles: {', '.join(known)}",
                               "give a shipped name or a path to a .toml file")
        with open(shipped, "rb") as f:
            text, name, path = f.read(), name_or_path, f"profile {name_or_path}"
    return policy_from_mapping(_parse(text, str(path)), name, str(path))


def _parse(text: bytes, path: str) -> dict[str, Any]:
    from .profcache import lookup

    data = lookup(text)  # a shipped profile's text: parsed by make setup (corral.profcache)
    if data is not None:
        return data
    import tomllib  # ~2-5 ms with what it loads: only for a text the cache does not hold

    try:
        return tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path} is not valid TOML", str(e), "fix the syntax") from None
