"""Compiled Jinja templates kept between runs, so `hpcrl render` does not recompile them each time.

Jinja keys each entry by template path and checks it against the source's checksum, so an edited
template is recompiled. The cache is the user's own (0700, under the platform cache dir); where it
cannot be made or written, templates are simply compiled as before.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import jinja2


class _QuietCache(jinja2.FileSystemBytecodeCache):
    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:  # a full or read-only disk costs the next run a compile, nothing more
            pass


def bytecode_cache() -> jinja2.BytecodeCache | None:
    """A cache in the user's cache dir ($HPCRL_CACHE_DIR, else platformdirs'), or None."""
    root = os.environ.get("HPCRL_CACHE_DIR")
    if not root:
        from platformdirs import user_cache_dir

        root = user_cache_dir("hpcrl")
    directory = Path(root) / "jinja"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.lstat()
    except OSError:
        return None
    # Loaded bytecode is executed: only a directory of ours that no one else can write.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return _QuietCache(str(directory))
