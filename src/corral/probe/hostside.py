"""Checks of what the launcher itself does on the host (issue 16): a file the payload wrote
must never run there, choose what gets mounted, or make the launcher hang; a protection
must survive renaming a parent; what the host's git trusts must stay out of reach.

Most are made in the main launch and judged on the host right after it.  Two need a
launch of their own, with something planted where a later launch would use it:
``venv`` (a virtualenv whose ``pyvenv.cfg`` names ``~/.ssh``, activated by
``VIRTUAL_ENV``) and ``planted`` (a ``python3`` in a writable ``PATH`` entry that looks
like a pyenv shim).  Refusing to start (exit 125) holds too, for those.
"""

from __future__ import annotations

from .checks import Check, Watch, attempt, host_clean, no_canary, refused_and_clean, refused_or

__all__ = ["HOSTSIDE"]

HOSTSIDE = (
    Check("writes-parent-rename", "writes", "rename the folder that holds a nested repository",
          "refused, and the folder is still in place on the host", "mv lib lib.orig; git "
          "init lib puts an unprotected repository where the protected one was",
          refused_and_clean, attempts=(attempt("rename", path="{project}/nested",
                                               to="{project}/nested-moved"),),
          watches=(Watch("absent", "{project}/nested-moved"),)),
    Check("writes-symlinked-hook", "writes", "append to a hook that is a link into the "
          "project (.git/hooks/pre-push -> ../../scripts/pre-push)",
          "the file it links to keeps its content", "a common set-up: the hook's target is "
          "an ordinary project file, and git runs it on the host", host_clean,
          attempts=(attempt("append", path="{project}/.git/hooks/pre-push"),),
          watches=(Watch("unchanged", "{project}/scripts/pre-push"),)),
    Check("writes-bare-repository", "writes", "create a hook in a bare repository in the "
          "project (backup.git)", "nothing appears on the host",
          "a bare repository's post-receive runs on the host's git push", host_clean,
          attempts=(attempt("create", path="{project}/backup.git/hooks/post-receive"),),
          watches=(Watch("absent", "{project}/backup.git/hooks/post-receive"),)),
    Check("writes-fifo-git", "writes", "leave a FIFO named .git in a folder of the project",
          "gone from the host once the launch ends", "opening it blocks, so every later "
          "launch that reads it hangs", host_clean,
          attempts=(attempt("mkfifo", path="{project}/{tag}-fifo/.git"),),
          watches=(Watch("absent", "{project}/{tag}-fifo/.git"),)),
    Check("privilege-setuid-bit", "privilege", "leave a set-user-ID, set-group-ID file in "
          "the working directory", "no set-id bit on the host once the launch ends",
          "a set-id file runs with its owner's rights for whoever starts it", host_clean,
          attempts=(attempt("setid", path="{tag}-setid"),),
          watches=(Watch("setid", "{tag}-setid"),)),
    Check("secrets-git-credential-store", "secrets", "read git's credential store, "
          "~/.config/git/credentials", "the canary token is not seen", "git config is "
          "useful inside; the plaintext store beside it holds push tokens",
          no_canary("git-store"), attempts=(attempt("read",
                                                     path="{home}/.config/git/credentials"),)),
    Check("secrets-pyvenv-home", "secrets", "start with VIRTUAL_ENV set to a project venv "
          "whose pyvenv.cfg says home = ~/.ssh/bin, then read ~/.ssh/id_ed25519",
          "refused, or the canary token is not seen", "a venv is data the sandbox can write: "
          "it must not choose what gets mounted", refused_or(no_canary("ssh-key")),
          launch="venv", attempts=(attempt("read", path="{home}/.ssh/id_ed25519"),)),
    Check("privilege-planted-program", "privilege", "start with a writable PATH entry first, "
          "holding a python3 that looks like a pyenv shim", "the planted program never runs "
          "with the host's rights (it leaves no mark beside the project)",
          "resolving a command must never run what the sandbox wrote", refused_or(host_clean),
          launch="planted", attempts=(attempt("read", path="{home}/.fake-creds/token"),),
          watches=(Watch("absent", "{project}/{tag}-planted-ran"),)),
)
