"""corral.hgrc: Mercurial's config read as hg itself reads it (hg is the oracle)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from corral import hgrc

TEXTS = [
    "[hooks]\npre-status = sh fsm.sh\n",
    "[hooks]\npre-status.a = sh a\n  continued here\n# comment\n; other\npost-status=x\n",
    "[ui]\neditor = vim\n[hooks]\nupdate = sh u\n%unset update\n",
    "\ufeff[hooks]\n  \nprecommit =   spaced value   \n[extensions]\nfoo = ~/x/foo.py\nbar = !\n",
]


def hg_reads(tmp: Path, text: str) -> dict[str, str]:
    cfg = tmp / "hgrc"
    cfg.write_text(text)
    out = subprocess.run(["hg", "config"], cwd=tmp, capture_output=True, text=True,
                         env={**os.environ, "HGRCPATH": str(cfg), "HOME": str(tmp)},
                         check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines()
                if line.startswith(("hooks.", "ui.editor", "extensions.")))


@pytest.mark.parametrize("text", TEXTS)
def test_entries_are_read_as_hg_reads_them(tmp_path: Path, text: str) -> None:
    ours: dict[str, str] = {}
    for section, key, value in hgrc.parse(text.encode()):
        if section in ("hooks", "extensions") or (section, key) == ("ui", "editor"):
            ours[f"{section}.{key}"] = (value or "").replace("\n", "\\n")  # (as hg prints)
    if "%unset update" in text:
        ours.pop("hooks.update")  # (parse keeps it: protecting more costs nothing)
    assert ours == hg_reads(tmp_path, text)


def test_what_hg_runs_or_loads() -> None:
    entries = hgrc.parse(b"[hooks]\npre-status = sh fsm.sh\nx = python:hooks/h.py:run\n"
                         b"y = python:hghooks:check\nz = python:mod.func\n"
                         b"[extensions]\nfoo = ~/x/foo.py\nrebase =\nbar = !\n"
                         b"[merge-tools]\nk.executable = ./bin/k\nk.args = $local\n"
                         b"[alias]\nst = !sh s.sh\nlg = log -G\n[paths]\ndefault = x\n"
                         b"%include ../y.rc\n")
    assert list(hgrc.commands(entries)) == [
        ("hooks.pre-status", "shell", "sh fsm.sh"), ("hooks.x", "python", "hooks/h.py"),
        ("hooks.y", "python", "hghooks"),  # (review 36: any PATH, a package folder too)
        ("extensions.foo", "python", "~/x/foo.py"),
        ("merge-tools.k.executable", "shell", "./bin/k"),
        ("merge-tools.k.args", "shell", "$local"), ("alias.st", "shell", "sh s.sh")]
    assert ("%include", "../y.rc", None) in entries
    assert hgrc.included("../y.rc", "/w/r/.hg/hgrc", "/h") == "/w/r/y.rc"
    assert hgrc.included("~/y.rc", "/w/r/.hg/hgrc", "/h") == "/h/y.rc"
    with pytest.raises(hgrc.ConfigError):
        hgrc.parse(b"[hooks]\nno equals sign here\n")
