# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files the modules keep on the nodes: written whole or not at all. Standard library only."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile


def write_atomic(path, text, mode=0o600, durable=True):
    """Write `text` to `path` so that a reader sees the old file or the new one, never half of one (a temporary file
    in the same directory, renamed over it), with `mode`; `durable` syncs it to disk first. Missing directories are
    made root only."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except Exception:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
