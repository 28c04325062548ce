"""make setup's seccomp cache (corral.seccache): the same bytes as a fresh compile, or unused.

Each test that shows a cache refused also shows, in the same test, the untouched
file accepted (the control), so none of them can pass by never using a cache.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Identity
from corral import profiles, seccache, seccomp

CI = os.environ.get("CI") == "true"


def _key() -> str:
    key = seccache.key(seccomp.libseccomp_version(), int(seccomp._library().seccomp_arch_native()))
    assert key is not None
    return key


@pytest.fixture()
def cache(tmp_path: Path) -> Iterator[Path]:
    seccache.load.cache_clear()
    path = Path(seccache.write(str(tmp_path / "seccomp.cache")))
    path.chmod(0o644)
    yield path
    seccache.load.cache_clear()


def _load(path: Path, key: str | None = None) -> seccomp.Programs | None:
    seccache.load.cache_clear()
    return seccache.load(key or _key(), str(path))


def test_cached_programs_are_a_fresh_compile_for_every_profile(cache: Path) -> None:
    cached = _load(cache)
    assert cached is not None
    fresh = seccomp.compiled(unix_sockets=False)
    assert (cached.sandbox, cached.payload, cached.init_pid) == (
        fresh.sandbox, fresh.payload, fresh.init_pid)
    # The policy inputs of the filters: unix_sockets, the one flag that changes them.
    names = sorted(p.stem for p in Path(profiles.__file__).with_name("profiles").glob("*.toml"))
    variants = {profiles.load_profile(name).unix_sockets for name in names}
    assert variants == {True, False}, names
    for unix_sockets in variants:
        assert seccomp.programs(unix_sockets) == seccomp.compiled(unix_sockets)


def test_setup_cache_is_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """make setup wrote one beside the code, and programs() takes it without libseccomp's
    compiler; control: with the cache moved away, programs() compiles."""
    installed = Path(seccache.cache_path())
    if not installed.exists():
        assert not CI, f"make setup did not write {installed}"
        pytest.skip("no seccomp cache: run make setup")
    calls: list[object] = []
    real = seccomp.compile_filter.__wrapped__

    def counting(*args: object) -> bytes:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(seccomp, "compile_filter", counting)
    for moved in (False, True):
        if moved:
            monkeypatch.setattr(seccache, "cache_path", lambda: str(installed) + ".absent")
        seccomp.programs.cache_clear()
        seccache.load.cache_clear()
        calls.clear()
        programs = seccomp.programs(False)
        assert bool(calls) is moved
        assert programs == seccomp.compiled(False)
    seccomp.programs.cache_clear()
    seccache.load.cache_clear()


@pytest.mark.parametrize("field", ["key", "sandbox", "payload", "digest", "pid", "format"])
def test_tampered_cache_is_not_used(cache: Path, field: str) -> None:
    assert _load(cache) is not None  # control: the file as written is used
    data = json.loads(cache.read_text())
    value = data[field]
    if field == "pid":
        data[field] = 3
    elif field in ("sandbox", "payload"):  # a changed instruction, the length kept
        data[field] = value[:-2] + ("00" if value[-2:] != "00" else "01")
    else:
        data[field] = value[:-1] + ("0" if value[-1] != "0" else "1")
    cache.write_text(json.dumps(data))
    assert _load(cache) is None


def test_tampered_program_with_matching_digest_is_still_keyed(cache: Path) -> None:
    """Someone who recomputes the digest still needs the key of this code and library."""
    assert _load(cache) is not None
    assert _load(cache, key="0" * 64) is None  # another key: another code or library
    other = seccache.key("9.9.9", int(seccomp._library().seccomp_arch_native()))
    assert other != _key() and _load(cache, key=other) is None


def test_source_change_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = Path(seccache.__file__).parent
    for name in seccache.SOURCES:
        shutil.copy(here / name, tmp_path / name)
    monkeypatch.setattr(seccache, "_here", lambda: str(tmp_path))
    same = seccache.key("2.5.4", 0xC000003E)
    assert same == seccache.key("2.5.4", 0xC000003E)  # control: a stable key
    with open(tmp_path / "syscalls.py", "a") as f:
        f.write("\n# one more line\n")
    assert seccache.key("2.5.4", 0xC000003E) not in (None, same)
    (tmp_path / "seccomp.py").unlink()
    assert seccache.key("2.5.4", 0xC000003E) is None  # no source: no cache


def test_untrusted_files_are_not_used(cache: Path) -> None:
    assert _load(cache) is not None
    cache.chmod(0o664)  # writable by the group
    assert _load(cache) is None
    cache.chmod(0o644)
    link = cache.with_name("link.cache")
    link.symlink_to(cache)
    assert _load(link) is None and _load(cache) is not None
    if os.geteuid() == 0:  # owned by someone other than the code's owner
        os.chown(cache, 65534, 65534)
        assert _load(cache) is None
        os.chown(cache, 0, 0)
        assert _load(cache) is not None


def test_cache_is_used_by_either_identity(who: Identity) -> None:
    """As root and as the plain user (a world-readable copy of the package): the cache is
    read, and its programs are a fresh compile's; control: with it unreadable, they are
    compiled and still the same."""
    src = who.src or Path(seccache.__file__).parent.parent
    if not (src / "corral" / seccache.CACHE_NAME).exists():
        assert not CI, "make setup did not write the seccomp cache"
        pytest.skip("no seccomp cache: run make setup")
    script = textwrap.dedent("""
        import sys
        from corral import seccache, seccomp
        if sys.argv[1] == "absent":
            seccache.cache_path = lambda: "/nonexistent/seccomp.cache"
        got = seccomp.programs(False)
        print("syscalls" if "corral.syscalls" in sys.modules else "cache",
              got == seccomp.compiled(False))
    """)
    for mode, expected in (("present", "cache True"), ("absent", "syscalls True")):
        proc = who.run([*who.prefix()[-1:], "-c", script, mode])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == expected.split(), proc.stdout
