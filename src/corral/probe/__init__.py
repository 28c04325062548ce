"""``corral probe``: prove the sandbox on the user's own machine.

The probe plants canaries on the host (:mod:`.canaries`), runs a battery of
escape attempts inside the sandbox under test (:mod:`.battery`, a standalone
script) through a launcher (:mod:`.launchers`: corral itself, the seed's
``naive`` bwrap line, no sandbox at all, or any command prefix), verifies the
host afterwards, and judges every check of the catalogue (:mod:`.catalogue`)::

    >>> from corral.probe import probe, launcher_for
    >>> report = probe(launcher_for("naive", None))
    >>> report.passed
    False

:mod:`.run` owns one probe run; :mod:`.report` renders it.
"""

from __future__ import annotations

from .catalogue import CATALOGUE
from .launchers import Corral, Prefix, launcher_for
from .report import CheckResult, Report, markdown, render_text
from .run import probe, select

__all__ = ["CATALOGUE", "CheckResult", "Corral", "Prefix", "Report", "launcher_for",
           "markdown", "probe", "render_text", "select"]
