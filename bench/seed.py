"""The seed document's plain bwrap line, the floor every launch figure is compared with."""

SEED = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib",
        "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
        "--unshare-all", "--die-with-parent", "--new-session", "--"]
TRUE = ["/bin/true"]
