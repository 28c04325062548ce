"""What a shell command git runs may name: its words, read as ``sh -c`` reads them.

git runs many config values (``core.fsmonitor``, ``core.pager``, filters, ...) with
``sh -c`` on the host, outside any sandbox.  Reviews 31 to 33 showed that matching their
text misses the script they run: ``sh ~/x/f''sm`` (quotes joined into one word), ``fs\\m``,
``cd && sh x/fsm`` (a bare ``cd`` goes home), ``sh fsm.sh`` (relative to the repository's
top).  So this reads a command as the POSIX shell splits it (quotes, backslashes,
operators, comments, ``~`` and ``$HOME``, command substitutions read as commands, the
folders ``cd`` goes to), and says, for each word that may name a file, whether it is a
program, an argument or a folder the command goes into.  What it cannot follow (a glob,
another variable, code given to an interpreter, a here-document, a program it cannot
name) it says it cannot: the caller refuses the run when that may reach a writable tree.

Loose on the side of naming more: an option such as ``-R`` is a word that may name a file
like any other (a missing one costs a watch, nothing more).  Nothing here runs anything.
"""

from __future__ import annotations

import os
import pwd

from .record import NamedTuple

__all__ = ["Reach", "read"]

OPERATORS = ("&&", "||", ";;", "<<", ">>", "<&", ">&", "<>", ">|", "|", "&", ";", "<", ">",
             "(", ")", "\n")
REDIRECTS = {"<", ">", ">>", "<&", ">&", "<>", ">|"}
# Programs that run no argument as code nor open one as a script: their words are data.
PLAIN = {"echo", "printf", "test", "[", "true", "false", ":", "exit", "return", "read",
         "shift", "sleep", "unset", "wait", "export", "local", "readonly", "cat", "tr",
         "head", "tail"}
RESERVED = {"{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while",
            "until", "for", "in", "function"}
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "yash", "posh"}
# Interpreters: an argument holding code, an option that runs code or imports from the
# folder it runs in (python -c, -m), or commands read from a pipe: corral cannot follow.
INTERPRETERS = {"perl", "ruby", "node", "nodejs", "php", "lua", "luajit", "tclsh", "wish",
                "Rscript", "pwsh", "deno", "bun", "osascript"}
CODE_OPTIONS = {"-c", "-m", "-e", "-E", "-r", "-p", "--eval", "--print", "-x"}
# Options of shells and interpreters whose value is the next word (sh -o errexit, python
# -W ignore, node -r mod, ruby -I dir): that word is no script
VALUE_OPTIONS = {"-o", "+o", "-O", "+O", "-W", "-X", "-r", "-I", "-C", "-E", "-x", "-e",
                 "-p", "-c", "-m", "-M", "--rcfile", "--init-file", "--require", "--import",
                 "--loader", "--conditions", "--input-type", "--env-file", "-S"}
# Variables the shell or the tool sets itself: the folder it runs in (as "."), values no
# file is named by, and folders corral cannot tell (review 38: `sh $PWD/fsm.sh`, an hg
# hook's `$HG_PENDING/lint.sh`)
HERE = {"PWD", "GIT_WORK_TREE", "HG_PENDING"}
UNTOLD = {"OLDPWD", "_", "IFS", "GIT_DIR", "GIT_COMMON_DIR", "GIT_PREFIX", "GIT_INDEX_FILE",
          "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_EXEC_PATH",
          "HG_SHAREDPENDING", "HG_ROOT", "HG_REPO", "HG_URL"}
NUMBERS = {"PPID", "RANDOM", "LINENO", "SECONDS", "SHLVL"}
# Programs that run commands built from their input or arguments: never followed.
RUNNERS = {"sed", "awk", "gawk", "mawk", "nawk", "busybox", "xargs", "find", "parallel",
           "watch", "make", "gmake", "npm", "npx", "yarn", "pnpm", "trap",
           # an alias is text the shell reads again, later (review 35); bash's enable -f
           # loads a builtin from a file
           "alias", "enable",
           # Review 40: tools that run the project's code, from the folder they are given
           # or run in (pytest's conftest.py, a setup or config file that is a program)
           "pytest", "py.test", "tox", "nox", "pre-commit", "sphinx-build", "pylint",
           "mypy", "jest", "mocha", "vitest", "eslint", "prettier", "webpack", "vite",
           "go", "cargo", "rspec", "rake", "bundle", "gradle", "mvn", "phpunit", "ant",
           "just", "task", "invoke", "poetry", "hatch", "pdm", "uv"}
# Programs that run the program among their arguments.
WRAPPERS = {"env", "exec", "command", "builtin", "nohup", "timeout", "nice", "ionice",
            "sudo", "doas", "time", "stdbuf", "setsid", "chrt", "taskset", "unbuffer",
            "flock", "script", "strace", "ltrace"}
# Variables whose values git itself gives the command (file names it works on): data.
GIVEN = {"LOCAL", "REMOTE", "MERGED", "BASE", "BACKUP", "ARG",
         # hg's merge tools' and extdiff's, and its hooks' HG_* (see _variable)
         "local", "base", "other", "output", "labellocal", "labelother", "labelbase",
         "parent", "parent1", "parent2", "plabel1", "plabel2", "child", "clabel", "root"}
SPECIAL = set("@*#?$!-0123456789")
CODE_MARKS = set(" \t\n;&|()$`<>\\\"'{}")  # an interpreter's argument holding one is code
GLOB_MARKS = set("*?[")
MAX_DEPTH = 8  # nested substitutions and sh -c strings read; deeper is "cannot follow"


class Reach(NamedTuple):
    """What one command may name.  Paths are absolute, or relative to the folder the
    command starts in.  ``unknown`` is what corral cannot follow ("" when nothing);
    ``anywhere`` says that may be any path, else only a path beneath one of ``prefixes``
    (the folder a glob is in, relative or absolute) or the folders the command is in."""

    # (path, role, written with a "/" or "~"); role: "program", "argument", "folder" (a
    # cd's), "script" (python's or node's: its folder is searched for modules)
    paths: tuple[tuple[str, str, bool], ...]
    unknown: str = ""
    anywhere: bool = False
    prefixes: tuple[str, ...] = ()


class _Word(NamedTuple):
    text: str  # as the shell passes it (when ``known``), else its literal beginning
    known: bool  # no part corral cannot tell
    data: bool  # holds a value git gives (an argument, $LOCAL): data, not a file name
    opaque: str  # what corral cannot tell of it ("" when known)
    anywhere: bool  # an expansion: it may be any path (a glob stays in its folder)
    slash: bool  # written with a "/" or starting with "~" (a path, not a bare name)


_HOME_WORD = _Word("", True, False, "", False, True)


class _Lexer:
    """One pass over a command's text, as ``sh`` splits it into words and operators."""

    def __init__(self, text: str, home: str, assigned: set[str]) -> None:
        self.s, self.i, self.home, self.assigned = text, 0, home, assigned
        self.inner: list[str] = []  # command substitutions' texts, read as commands too
        self.heredoc = False
        self.fatal = ""  # what makes the whole command one corral cannot read

    def tokens(self) -> list[_Word | str]:
        out: list[_Word | str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t":
                self.i += 1
            elif s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif op := next((o for o in OPERATORS if s.startswith(o, self.i)), None):
                self.i += len(op)
                self.heredoc = self.heredoc or op == "<<"
                out.append(op)
            else:
                out.append(self._word())
        return out

    def _word(self) -> _Word:
        s = self.s
        parts: list[str] = []
        self.data, self.opaque, self.anywhere = False, "", False
        slash = False
        if s[self.i] == "~":  # a leading unquoted ~ (up to the first /): a home
            j = self.i + 1
            while j < len(s) and s[j] not in "/ \t\n;&|()<>'\"\\$`":
                j += 1
            if j >= len(s) or s[j] in "/ \t\n;&|()<>":
                user = s[self.i + 1:j]
                home = self.home if not user else _home_of(user)
                if home is not None:
                    parts.append(home)
                    self.i, slash = j, True
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\n" or any(s.startswith(o, self.i) for o in OPERATORS):
                break
            if c == "'":
                end = s.find("'", self.i + 1)
                end = len(s) if end < 0 else end
                parts.append(s[self.i + 1:end])
                self.i = end + 1
            elif c == '"':
                self.i += 1
                while self.i < len(s) and s[self.i] != '"':
                    d = s[self.i]
                    if d == "\\" and s[self.i + 1:self.i + 2] in ('$', '`', '"', '\\', '\n'):
                        parts.append(s[self.i + 1].replace("\n", ""))
                        self.i += 2
                    elif d in "$`":
                        self._expansion(parts)
                    else:
                        parts.append(d)
                        self.i += 1
                self.i += 1
            elif c == "\\":  # (a backslash-newline is taken out, as a line joined)
                parts.append(s[self.i + 1:self.i + 2].replace("\n", ""))
                self.i += 2
            elif c in "$`":
                self._expansion(parts)
            elif (c in GLOB_MARKS or c in "{}") and not (c in "[{}" and self._alone()):
                self.opaque = self.opaque or f"a pattern the shell expands ({c})"
                parts.append(c)
                self.i += 1
            else:
                parts.append(c)
                self.i += 1
        text = "".join(parts)
        return _Word(text, not self.opaque, self.data, self.opaque, self.anywhere,
                     slash or "/" in text)

    def _alone(self) -> bool:
        """Whether the character at the cursor is a word by itself (``[``, a group)."""
        s, i = self.s, self.i
        return (i == 0 or s[i - 1] in " \t\n;&|()") and (i + 1 >= len(s)
                                                         or s[i + 1] in " \t\n;&|()")

    def _cannot(self, why: str) -> None:
        self.opaque, self.anywhere = self.opaque or why, True

    def _expansion(self, parts: list[str]) -> None:
        """Reads a ``$...`` or a backquote at the cursor: ``$HOME`` is put in ``parts``,
        a value git gives makes the word data, anything else one corral cannot tell."""
        s = self.s
        if s[self.i] == "`":
            end = self.i + 1
            while end < len(s) and s[end] != "`":
                end += 2 if s[end] == "\\" else 1
            self.inner.append(s[self.i + 1:end].replace("\\`", "`").replace("\\\\", "\\"))
            self.i = end + 1
            return self._cannot("the output of a command")
        nxt = s[self.i + 1:self.i + 2]
        if nxt == "(":
            end = _closing(s, self.i + 1)
            inner = s[self.i + 2:end]
            # Where dash ends it, a case's patterns and a comment decide (review 35:
            # `$(case x in x) sh f;; esac)`, `$(#)` then a line): corral does not parse
            # those, so it says it cannot tell.
            if "case" in _plain_words(inner) or any(w.startswith("#")
                                                    for w in _plain_words(inner)):
                self.fatal = self.fatal or "a case or a comment inside $(...)"
            self.inner.append(inner)
            self.i = end + 1
            return self._cannot("the output of a command")
        if nxt == "{":
            end = _closing(s, self.i + 1, "{", "}")
            body = s[self.i + 2:end]
            self.i = end + 1
            if _name(body) or body in SPECIAL:
                return self._variable(body, parts)
            name, op, word = _default_form(body)
            if name and name not in self.assigned and name != "HOME" and not (
                    name in GIVEN or name in HERE or name in UNTOLD or name in NUMBERS
                    or name.startswith(("GIT_", "HG_"))):
                value = os.environ.get(name)
                if value is not None and (value or ":" not in op):
                    parts.append(value)  # ${EDITOR:-vi}: set, its value
                    return None
                sub = _Lexer(word, self.home, self.assigned)
                got = sub._word() if word else _Word("", True, False, "", False, False)
                if got.known and not got.data and (not word or sub.i >= len(word)):
                    parts.append(got.text)  # unset: the default, read as a word
                    self.inner += sub.inner
                    return None
            if "$" in body or "`" in body:
                self.inner.append(body)
            return self._cannot(f"the expansion ${{{body}}}")
        if nxt and (nxt.isalpha() or nxt == "_"):
            j = self.i + 1
            while j < len(s) and (s[j].isalnum() or s[j] == "_"):
                j += 1
            name, self.i = s[self.i + 1:j], j
            return self._variable(name, parts)
        if nxt and nxt in SPECIAL:
            self.i += 2
            return self._variable(nxt, parts)
        if nxt in ("'", '"'):
            self.i += 1
            return self._cannot(f"a ${nxt}...{nxt} string")
        parts.append("$")
        self.i += 1

    def _variable(self, name: str, parts: list[str]) -> None:
        if name in self.assigned or (name in SPECIAL and "set" in self.assigned):
            return self._cannot(f"the variable ${name}, which the command sets")
        if name == "HOME":
            parts.append(self.home)
        elif name in HERE:
            parts.append(".")  # (relative: resolved from where the command runs)
        elif name in UNTOLD:
            self._cannot(f"the variable ${name}, a folder corral cannot tell")
        elif name in GIVEN or name.startswith(("GIT_", "HG_")) or name in SPECIAL \
                or name in NUMBERS:
            self.data = True
        elif name in os.environ:
            # The user's own variable, as the launcher has it (review 37: core.editor =
            # $EDITOR): the user's shell sets it for their git too, the sandbox cannot
            parts.append(os.environ[name])
        else:
            self._cannot(f"the variable ${name}, which corral's environment does not set")


def _default_form(body: str) -> tuple[str, str, str]:
    """("NAME", ":-", "word") of ``${NAME:-word}`` or ``${NAME-word}``; ("", "", "")
    for any other form (``=``, ``?``, ``+``, ``#``, ``%``: corral does not follow)."""
    for op in (":-", "-"):
        name, sep, word = body.partition(op)
        if sep and _name(name):
            return name, op, word
    return "", "", ""


def _name(text: str) -> bool:
    return bool(text) and not text[0].isdigit() and text.replace("_", "a").isalnum()


def _closing(s: str, i: int, open_: str = "(", close: str = ")") -> int:
    """The index of what closes the bracket at ``i`` (quotes and nesting minded)."""
    depth, j = 0, i
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c in "'\"":
            while True:
                j = s.find(c, j + 1)
                if j < 0:
                    return len(s)
                if c == "'" or s[j - 1] != "\\":
                    break
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return len(s)


def _plain_words(text: str) -> list[str]:
    for mark in ";&|()<>\n\t":
        text = text.replace(mark, " ")
    return text.split()


def _home_of(user: str) -> str | None:
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return None


def _assigned(text: str) -> set[str]:
    """Names the command may set (``X=``, ``read X``, ``for X``; ``set`` for the
    parameters): their values are its own, not the launcher's nor git's."""
    names: set[str] = set()
    words = text
    for mark in ";&|(){}\"'`\n\t":
        words = words.replace(mark, " ")
    split = words.split()
    for i, w in enumerate(split):
        left, eq, _ = w.partition("=")
        if eq and _name(left):
            names.add(left)
        if w in ("read", "for", "getopts", "local", "export", "readonly", "select"):
            names.update(x for x in split[i + 1:i + 4] if _name(x))
        if w in ("set", "shift", "function"):
            names.add("set")  # $1...: the command's own (set --, a function's)
    if "()" in text.replace(" ", "").replace("\t", ""):
        names.add("set")
    return names


def read(command: str, home: str) -> Reach:
    """What ``command`` (as ``sh -c`` gets it) may name (see :class:`Reach`)."""
    return _Reader(home, _assigned(command)).read(command, 0)


class _Reader:
    def __init__(self, home: str, assigned: set[str]) -> None:
        self.home, self.assigned = home, assigned
        self.paths: list[tuple[str, str, bool]] = []
        self.prefixes: list[str] = []
        self.unknown, self.anywhere = "", False
        self.bases = [""]
        self.path: list[str] = []  # folders a PATH the command sets adds ("" is its own)

    def reach(self) -> Reach:
        return Reach(tuple(dict.fromkeys(self.paths)), self.unknown, self.anywhere,
                     tuple(dict.fromkeys(self.prefixes)))

    def name(self, word: _Word, role: str) -> None:
        if word.known and not word.data and word.text:
            for b in self.bases:
                self.paths.append((os.path.join(b, word.text), role, word.slash))

    def cannot(self, why: str, word: _Word | None = None) -> None:
        self.unknown = self.unknown or why
        if word is None or word.anywhere:
            self.anywhere = True
        else:  # a glob: a name in its folder
            self.prefixes += [os.path.dirname(os.path.join(b, word.text)) or b
                              for b in self.bases]

    def read(self, command: str, depth: int, own_parameters: bool = False) -> Reach:
        """``own_parameters``: a ``sh -c`` string, whose ``$0``, ``$1``... are what the
        command itself passes it, not git (review 34: ``sh -c 'sh "$0$1"' fs m.sh``)."""
        if depth > MAX_DEPTH:
            self.cannot("commands nested too deep")
            return self.reach()
        assigned = self.assigned | {"set"} if own_parameters else self.assigned
        lexer = _Lexer(command, self.home, assigned)
        tokens = lexer.tokens()
        if lexer.heredoc:
            self.cannot("a here-document")
        if lexer.fatal:
            self.cannot(lexer.fatal)
        words: list[_Word] = []
        redirect, piped, case = False, False, False
        for tok in [*tokens, ";"]:
            if isinstance(tok, _Word):
                if redirect:
                    redirect = False
                    self.name(tok, "argument")
                    if not tok.known and not tok.data:
                        self.cannot(tok.opaque, tok)
                elif not words and tok.known and tok.text == "case":
                    case = True  # "case WORD in": what it tests is no command
                elif not case:
                    words.append(tok)
                continue
            if tok in REDIRECTS:
                redirect = True
                continue
            if tok == "<<":
                continue
            if case and tok in ("\n", ";"):
                case = False  # (a pattern list after "in" ends at its ")")
            if tok == ")" and len(words) == 1 and not words[0].known:
                words = []  # a case pattern ("*)"), not a command
            if case and tok == ")":
                case, words = False, []
            for text in self.command(words, piped):
                self.read(text, depth + 1, own_parameters=True)
            words, piped = [], tok == "|"
        for text in lexer.inner:
            self.read(text, depth + 1)
        return self.reach()

    def command(self, words: list[_Word], piped: bool) -> list[str]:
        """One simple command: names its words, moves the bases on a ``cd``; returns the
        texts it runs as commands in turn (``sh -c TEXT``, ``eval``)."""
        for w in words:  # PATH=dir prog, env PATH=dir prog, export PATH=dir: where a bare
            if w.known and w.text.startswith("PATH="):  # program is looked up (review 34)
                self.path += [self.tilde(d) for d in w.text[5:].split(":") if "$" not in d]
        i = 0
        while i < len(words) and ((words[i].known and words[i].text in RESERVED)
                                  or _assignment(words[i].text)):
            w = words[i]
            if _assignment(w.text):
                value = w._replace(text=self.tilde(w.text.partition("=")[2]))
                self.name(value, "argument")
                if not w.known and not w.data:
                    self.cannot(w.opaque, w)
            i += 1
        if i >= len(words):
            return []
        program, args = words[i], words[i + 1:]
        if not program.known or program.data:
            self.cannot(program.opaque or "a program named by a value git gives", program)
            return []
        if program.slash:
            self.name(program, "program")
        else:
            self.on_path(program)
        base = os.path.basename(program.text)
        if base in WRAPPERS:  # what they run is the first word that is a program corral knows
            self.chdir_option(base, args)
            for k, a in enumerate(args):
                if a.known and not a.data and not _blank(a.text) and (
                        a.slash or _kind(os.path.basename(a.text))):
                    before = [r for w in args[:k] if w.known for r in self.argument(w)]
                    return before + self.command(args[k:], piped)
        kind = _kind(base)
        if kind == "runner":
            self.cannot(f"{base}, which runs commands corral cannot read")
        if base in ("cd", "pushd"):
            return self.cd(args)
        if base in PLAIN:
            return []  # (what they print goes to git, or to a pipe read below)
        runs: list[str] = []
        code_next, script, value_next = False, False, False
        # Python puts a script's folder first on its import path, and node looks for
        # modules in the folders above a script: a planted json.py or node_modules beside
        # it runs (review 34).  Not with python -P or -I.
        safe = base.startswith(("python", "pypy")) and any(
            a.known and a.text[:2] != "--" and a.text[:1] == "-" and set(a.text[1:]) & {"P", "I"}
            for a in args)
        neighbours = not safe and (base.startswith(("python", "pypy")) or base in (
            "node", "nodejs", "deno", "bun"))
        # A folder given to a program that runs code may be run (python dir runs its
        # __main__.py); one given to any other program is only read (black --check .).
        role = "argument" if kind else "operand"
        for a in args:
            if a.known and not a.data:
                if neighbours and not a.text.startswith("-") and not script \
                        and not value_next:  # (its first operand; the rest are its own)
                    self.name(a, "script")
                else:
                    self.path_word(a, role)
                code = self.argument(a, role)  # (an interpreter's code is not sh: see below)
                runs += code if kind != "interpreter" else []
            if not a.known or a.data:
                # What follows a script (or sh -c's code) is the script's arguments, data
                # to the interpreter (review 37: VS Code's credential helper, `node x.js
                # git-credential-helper $*`); a wrapper's or runner's, not
                if not a.data and kind and not (script and kind in ("shell", "interpreter")):
                    self.cannot(a.opaque, a)
                continue
            if code_next:
                runs.append(a.text)
                code_next, script = False, True
            elif base == "eval":
                runs.append(" ".join(w.text for w in args))
                break
            elif kind == "shell" and a.text.startswith("-") and not a.text.startswith("--") \
                    and "c" in a.text:
                code_next = True
            elif kind == "interpreter" and a.text == "-m" and safe:
                pass  # (a module from the import path, without the folder it runs in)
            elif kind == "interpreter" and (a.text in CODE_OPTIONS or any(
                    ch in CODE_MARKS for ch in a.text)):
                self.cannot(f"code given to {base}" if a.text != "-m" else
                            f"{base} -m, which imports from the folder git runs it in "
                            f"(unless {base} -P)")
            elif not a.text.startswith(("-", "+")) and not value_next:
                script = True
            # A word after an option that takes one is that option's value, not the
            # script (review 38: `sh -o errexit *.sh`, `python3 -P -W ignore *.py`)
            value_next = a.text in VALUE_OPTIONS
        if piped and kind in ("shell", "interpreter") and not script:
            self.cannot(f"{base} running what a pipe gives it")
        return runs

    def argument(self, word: _Word, role: str = "argument") -> list[str]:
        """Names an argument, and each piece of it after a ``=``, ``!``, ``:``, ``,``,
        ``@`` or ``+`` (``--rcfile=x``, ``less +!x``, ``-oProxyCommand=x``); returns the
        pieces that hold blanks, which a program may run as a command in turn
        (``less '+!sh x'``, ``vim -c '!sh x'``, ``ssh -o 'ProxyCommand sh x'``)."""
        pieces = [word.text]
        if word.text[:1] == "-" and word.text[1:2].isalpha() and word.text[:2] != "--":
            pieces.append(word.text[2:])  # -Csub, -ofile: a short option's joined value
        for mark in "=!:,@+":
            pieces += [p for whole in pieces for p in whole.split(mark)[1:]]
        runs = []
        for piece in dict.fromkeys(pieces):
            if _blank(piece):
                runs.append(piece)
            elif piece:
                self.path_word(word._replace(text=piece, slash=word.slash or "/" in piece),
                               role)
        return runs

    def chdir_option(self, base: str, args: list[_Word]) -> None:
        """``env -C DIR``, ``-CDIR``, ``--chdir=DIR``; ``sudo -D``, ``--chdir``: the
        program runs in DIR, as after a ``cd`` (review 35: ``env -Csub sh f``)."""
        short = {"env": "-C", "sudo": "-D"}.get(base)
        if short is None:
            return
        for k, a in enumerate(args):
            if not a.known:
                continue
            target = None
            if a.text in (short, "--chdir") and k + 1 < len(args):
                target = args[k + 1]
            elif a.text.startswith(short) and a.text != short:
                target = a._replace(text=a.text[2:])
            elif a.text.startswith("--chdir="):
                target = a._replace(text=a.text[len("--chdir="):])
            if target is not None:
                self.cd([target])

    def path_word(self, word: _Word, role: str = "argument") -> None:
        """An argument: a file by its name, and, bare, a program on the PATH the command
        sets (``env PATH=~/bin fsm``)."""
        self.name(word, role)
        if not word.slash:
            self.on_path(word)

    def on_path(self, word: _Word) -> None:
        if word.known and not word.data and word.text:
            for d in self.path:
                self.name(word._replace(text=os.path.join(d, word.text), slash=True),
                          "argument")

    def tilde(self, text: str) -> str:
        """An assignment's value as the shell expands a ``~`` at its start."""
        if not text.startswith("~"):
            return text
        user, sep, rest = text[1:].partition("/")
        home = self.home if not user else _home_of(user)
        return text if home is None else home + sep + rest

    def cd(self, args: list[_Word]) -> list[str]:
        targets = [a for a in args if not (a.known and a.text.startswith("-") and a.text != "-")]
        if not targets:
            target = _HOME_WORD._replace(text=self.home)
        elif not targets[0].known or targets[0].data or targets[0].text == "-":
            self.cannot(targets[0].opaque or "a folder corral cannot name", targets[0])
            return []
        else:
            target = targets[0]
        if ("CDPATH" in self.assigned or os.environ.get("CDPATH")) and not (
                target.text.startswith(("/", "./", "../")) or target.text in (".", "..")):
            self.cannot("a cd that CDPATH may send elsewhere")
        before = list(self.bases)
        self.name(target, "folder")
        self.bases += [os.path.join(b, target.text) for b in before]
        return []


def _blank(text: str) -> bool:
    return any(ch in text for ch in " \t\n")


def _kind(base: str) -> str:
    if base in SHELLS:
        return "shell"
    if base in INTERPRETERS or base.startswith(("python", "pypy")):
        return "interpreter"
    if base in RUNNERS:
        return "runner"
    if base in WRAPPERS:
        return "wrapper"
    return ""


def _assignment(text: str) -> bool:
    left, eq, _ = text.partition("=")
    return bool(eq) and _name(left)
