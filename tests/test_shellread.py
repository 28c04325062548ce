"""corral.shellread: a command git runs, read as ``sh -c`` reads it.

The words it makes of a text are checked against /bin/sh itself (generated texts of
quotes, backslashes, ``~`` and ``$HOME``); what a command names, and what it cannot
follow, against a table of the forms reviews 31 to 33 used to hide a script.
"""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import shellread

HOME = "/home/u"
PIECES = st.one_of(
    st.text(alphabet="abc./-_=:%@+,", min_size=1, max_size=4),
    st.builds(lambda t: f"'{t}'", st.text(alphabet="ab c/$;|\\\"", max_size=4)),
    st.builds(lambda t: f'"{t}"', st.text(alphabet="ab c/;|'", max_size=4)),
    st.sampled_from(["\\a", "\\ ", "\\;", "\\'", '"\\$"', '"\\\\"', "$HOME/", "${HOME}",
                     '"$HOME"', "''", '""']))
WORD = st.builds(lambda first, rest: first + "".join(rest),
                 st.one_of(PIECES, st.sampled_from(["~/", "~"])), st.lists(PIECES, max_size=4))


def words_of(text: str) -> list[str]:
    out = []
    for tok in shellread._Lexer(text, HOME, set()).tokens():
        assert not isinstance(tok, str), tok
        assert tok.known, tok
        out.append(tok.text)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(WORD, min_size=1, max_size=4))
def test_words_are_split_and_unquoted_as_sh_does(words: list[str]) -> None:
    text = " ".join(words)
    sh = subprocess.run(["/bin/sh", "-c", f"printf '%s\\0' {text}"], capture_output=True,
                        env={"HOME": HOME, "PATH": "/usr/bin:/bin"}, check=True)
    assert words_of(text) == sh.stdout.decode().split("\0")[:-1], text


def named(command: str) -> list[str]:
    return sorted({p for p, role, _ in shellread.read(command, HOME).paths})


def test_what_a_command_names() -> None:
    # Review 33's forms, and the ones before
    assert named("sh ~/d/f''sm") == ["/home/u/d/fsm"]
    assert named("sh ~/d/fs\\m") == ["/home/u/d/fsm"]
    assert named("cd && sh d/fsm") == ["/home/u", "/home/u/d/fsm", "d/fsm"]
    assert named("cd ~ && sh d/fsm") == ["/home/u", "/home/u/d/fsm", "d/fsm"]
    assert named("sh fsm.sh") == named("perl fsm.sh") == ["fsm.sh"]
    assert named('sh "${HOME}/x"') == named("sh $HOME/x") == ["/home/u/x"]
    assert named("$HOME/x") == ["/home/u/x"]
    assert "/home/u/x" in named("F=~/x && sh foo")
    assert "fsm.sh" in named("sh -c 'sh fsm.sh'")
    assert "fsm.sh" in named("eval sh fsm.sh")
    assert "./x" in named("env FOO=1 nice -n 5 sh ./x")
    assert named("sh < ./s") == ["./s"]
    assert named("python3 ~/x.py") == ["/home/u/x.py"]
    # An argument a program may run as a command in turn
    assert "fsm.sh" in named("less '+!sh fsm.sh'")
    assert "fsm.sh" in named("vim -c '!sh fsm.sh'")
    assert "fsm.sh" in named("ssh -o 'ProxyCommand sh fsm.sh'")
    assert "./x" in named("ssh -oProxyCommand=./x")
    assert "./x" in named("less +!./x")
    # Review 34: a backslash-newline, env -S, a PATH the command sets, env --chdir=
    assert named("sh fs\\\nm.sh") == ["fsm.sh"]
    assert "fsm.sh" in named("env -S 'sh fsm.sh'")
    assert "/home/u/d/bin/fsm" in named("env -S 'sh ${HOME}/d/bin/fsm'")
    assert "./fsm.sh" in named("PATH=.:/usr/bin:/bin fsm.sh")
    assert "/home/u/d/bin/fsm" in named("env PATH=~/d/bin:/bin fsm")
    assert "sub" in named("env --chdir=sub sh fsm.sh")
    for joined in ("env -Csub sh fsm.sh", "env -C sub sh fsm.sh", "sudo -D sub sh fsm.sh"):
        r = shellread.read(joined, HOME)
        assert ("sub", "folder") in {(p, role) for p, role, _ in r.paths}, joined
        assert "sub/fsm.sh" in named(joined), joined
    roles = {(p, role) for p, role, _ in shellread.read("python3 fsm.py", HOME).paths}
    assert ("fsm.py", "script") in roles
    assert not any(role == "script" for _, role, _ in
                   shellread.read("python3 -P fsm.py", HOME).paths)
    assert named("x | perl ~/bin/diff-highlight | less") == ["/home/u/bin/diff-highlight"]
    # Data: what git gives, and what programs that run nothing print
    assert named('meld "$LOCAL" "$REMOTE"') == []
    assert named('f() { test "$1" = get && echo "password=$(cat ~/.t)"; }; f') == []
    assert named("case $1 in get) sh x;; *) ;; esac") == ["x"]


def test_what_it_cannot_follow_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot(command: str) -> tuple[str, bool, tuple[str, ...]]:
        r = shellread.read(command, HOME)
        assert r.unknown, command
        return r.unknown, r.anywhere, r.prefixes

    assert cannot("sh ~/d/fs?") == ("a pattern the shell expands (?)", False, ("/home/u/d",))
    assert cannot("sh *") == ("a pattern the shell expands (*)", False, ("",))
    assert cannot("F=~/x && sh $F")[:2] == ("the variable $F, which the command sets", True)
    assert cannot("sh $CORRAL_UNSET_X/fsm")[:2] == (
        "the variable $CORRAL_UNSET_X, which corral's environment does not set", True)
    # Review 37: the launcher's own variables are the user's (core.editor = $EDITOR), and a
    # script's arguments are data to its interpreter (VS Code's credential helper)
    monkeypatch.setenv("CORRAL_TEST_EDITOR", "/home/u/d/ed")
    monkeypatch.delenv("CORRAL_UNSET_X", raising=False)
    assert named("$CORRAL_TEST_EDITOR -w") == ["-w", "/home/u/d/ed"]
    assert named("${CORRAL_UNSET_X:-${CORRAL_TEST_EDITOR:-vi}}") == ["/home/u/d/ed"]
    assert shellread.read("${CORRAL_UNSET_X:-vi} x", HOME).unknown == ""
    assert shellread.read("f() { /n/node /tmp/x.js helper $*; }; f", HOME).unknown == ""
    assert cannot("f() { env $*; }; f")[1]  # a wrapper's: what it runs
    # Review 38: an option's value is no script; the shell's and the tools' own folders
    assert cannot("sh -o errexit *.sh")[0] == "a pattern the shell expands (*)"
    assert cannot("/usr/bin/python3 -P -W ignore *.py")[0] == "a pattern the shell expands (*)"
    assert named("sh $PWD/fsm.sh") == named('sh "${PWD}/fsm.sh"') == ["./fsm.sh"]
    assert named("sh $HG_PENDING/lint.sh") == ["./lint.sh"]
    assert cannot("sh $GIT_DIR/x")[1]
    # Review 40: a tool that runs the project's code from the folder it is given
    assert cannot("/venv/bin/pytest -q tests")[:2] == (
        "pytest, which runs commands corral cannot read", True)
    assert cannot("sh $(echo fsm.sh)")[:2] == ("the output of a command", True)
    assert cannot("python3 -m watcher")[1] and cannot("python3 -c x")[:2] == (
        "code given to python3", True)
    assert cannot("perl -e 'do \"x\"'")[:2] == ("code given to perl", True)
    assert cannot("echo 'sh fsm.sh' | sh")[:2] == ("sh running what a pipe gives it", True)
    assert cannot("make fsmonitor")[:2] == ("make, which runs commands corral cannot read",
                                            True)
    assert cannot("sh <<EOF\nsh x\nEOF")[:2] == ("a here-document", True)
    assert cannot("set -- ~/x; sh $1")[0] == "the variable $1, which the command sets"
    assert cannot("sh -c 'sh \"$0$1\"' fs m.sh")[0] == \
        "the variable $0, which the command sets"
    assert cannot('f() { sh "$1$2"; }; f fs m.sh')[0] == \
        "the variable $1, which the command sets"
    assert cannot("python3 -m nbstripout")[0].startswith("python3 -m, which imports")
    # Review 35: where dash ends a $(...) a case or a comment decides; an alias is read
    # again later; CDPATH moves a cd
    for hidden in ('echo "$(case x in x) sh fsm.sh;; esac)"', 'echo "$(#)\nsh fsm.sh)"'):
        assert cannot(hidden)[:2] == ("a case or a comment inside $(...)", True)
    assert cannot("alias f=\"sh 'fs\"\nf;m.sh'")[1]
    assert cannot("CDPATH=/x cd bin && sh f")[0] == "a cd that CDPATH may send elsewhere"
    assert shellread.read("python3 -P -m nbstripout -t", HOME).unknown == ""
    # The control: plain commands hold nothing it cannot follow
    for plain in ("less -FRX", "diff-so-fancy | less --tabs=4 -RFX", "code --wait",
                  "ssh -i ~/.ssh/id -o IdentitiesOnly=yes", "git-lfs filter-process",
                  'delta --features "side-by-side line-numbers"', "emacsclient -t -a ''",
                  "[ -f x ] && true"):
        assert shellread.read(plain, HOME).unknown == "", plain
