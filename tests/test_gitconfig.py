"""corral reads git config the way git reads it: git itself is the oracle.

Every case (a table of the forms issue 16 found misread, then hypothesis-made texts from
the characters that matter) is parsed by corral and by ``git config --list``; both must
agree on every name and value, or both refuse.  The control: the regular-expression
reading corral used before gets the table's cases wrong.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral import gitconfig

CASES = [
    b"[core]\n\tfsmonitor = evil ; comment\n",
    b"[core] fsmonitor = evil\n",
    b'[core]\nfsmonitor = "a ; b" # c\n',
    b"[core]\n  hooksPath = a\\\n b\n",
    b"[Core]\n HooksPath=  x  y  \n",
    b"[include]\npath\n",
    b'[includeIf "gitdir:~/x/"]\n path = ~/a.inc\n',
    b"[a.B]\nc=1\n",
    b'[a "B\\"q"]\nc=1\n',
    b"k = v\n",
    b'[core]\nx = "unterminated\n',
    b"[core]\nx = a\\qb\n",
    b"\xef\xbb\xbf[core]\r\nx = y\r\n",
    b'[core]\nx = a"b c"d\n',
    b"[core]x=1\n",
    b"[core]\n x\t=\t1\t\n y\n",
    b"[core ]\nx=1\n",
    b"[core]\n1x=1\n",
    b"[core]\nx=1 \\\n  2\n",
    b"[core];c\nx=1\n",
    b'[core] "x"\n',
    b"[a]\nb=c\n[]\n",
    b"[core]\nx=\\t\\n\\b\n",
    b'[sec "sub sp"]\nx = 1\n',
    b"[core]\n\thooksPath = tools/hooks # the team's\n",
]


def git_reads(tmp: Path, data: bytes) -> list[tuple[str, str | None]] | None:
    path = tmp / "config"
    path.write_bytes(data)
    done = subprocess.run(["git", "config", "--file", str(path), "--list", "-z",
                           "--no-includes"], capture_output=True, check=False)
    if done.returncode != 0:
        return None
    out: list[tuple[str, str | None]] = []
    for item in done.stdout.split(b"\0"):
        if item:
            name, newline, value = item.partition(b"\n")
            out.append((name.decode(errors="surrogateescape"),
                        value.decode(errors="surrogateescape") if newline else None))
    return out


def corral_reads(data: bytes) -> list[tuple[str, str | None]] | None:
    try:
        return gitconfig.parse(data)
    except gitconfig.ConfigError:
        return None


@pytest.mark.parametrize("data", CASES)
def test_every_case_reads_as_git_reads_it(tmp_path: Path, data: bytes) -> None:
    assert corral_reads(data) == git_reads(tmp_path, data)


OLD_KEY = re.compile(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*(.*?)\s*$")


def test_the_old_reading_got_them_wrong() -> None:
    """Control: main's line-by-line regular expressions, on the cases issue 16 found."""
    wrong = 0
    for data in (CASES[0], CASES[1], CASES[24]):
        value = next((m.group(2).strip('"') for line in data.decode().splitlines()
                      if (m := OLD_KEY.match(line))), None)
        wrong += value not in ("evil", "tools/hooks")
    assert wrong == 3


CHARS = st.sampled_from(list('[]"\\;#= \t\nabcK.-\r1x'))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(CHARS, st.sampled_from(["[core]", "[a \"b\"]", "k = ", "\\\n"])),
                max_size=30))
def test_generated_texts_read_as_git_reads_them(tmp_path: Path, parts: list[str]) -> None:
    data = "".join(parts).encode()
    assert corral_reads(data) == git_reads(tmp_path, data), data


def test_commands_and_paths_git_would_run_or_follow() -> None:
    entries = gitconfig.parse(b'[core]\n\tfsmonitor = ./fsmon.sh --x\n\tpager = less\n'
                              b'[alias]\n\tst = !tools/st.sh\n[core]\n\tfsmonitor = true\n'
                              b'[diff "x"]\n\ttextconv = bin/conv\n')
    assert list(gitconfig.commands(entries)) == [
        ("core.fsmonitor", "./fsmon.sh --x"), ("core.pager", "less"),
        ("alias.st", "tools/st.sh"), ("diff.x.textconv", "bin/conv")]
    # An ext:: URL is a command (review 35), wherever git takes a URL from
    entries = gitconfig.parse(b'[remote "o"]\n\turl = ext::sh fsm.sh\n\tpushurl = ext::x\n'
                              b'[url "ext::sh y "]\n\tinsteadOf = https://h/\n'
                              b'[remote "p"]\n\turl = https://h/r\n')
    assert list(gitconfig.commands(entries)) == [
        ("remote.o.url", "sh fsm.sh"), ("remote.o.pushurl", "x"),
        ("url.ext::sh y .insteadof", "sh y")]
    assert gitconfig.expand("~/a", "/home/u") == "/home/u/a"
    assert gitconfig.expand("%(prefix)/etc", "/home/u") is None
    assert gitconfig.expand("rel/a", "/home/u") == "rel/a"


def test_a_hooks_python_m_may_import_any_module_of_its_interpreters_folders() -> None:
    """Review 39: ``sys.stdlib_module_names`` misses modules the standard library imports
    by name (``-m venv`` imports ``_sysconfigdata__<arch>``): the names are read from the
    interpreter's folders themselves."""
    import sys
    import sysconfig

    from corral import repos

    names = repos._site_modules({sys.executable})
    data = sysconfig._get_sysconfigdata_name()  # type: ignore[attr-defined]
    assert data in names and data not in sys.stdlib_module_names
    assert {"json", "argparse", "pytest"} <= names  # (pytest: this venv's site-packages)
