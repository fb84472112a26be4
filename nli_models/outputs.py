"""Where a command will write, checked before it writes anything (issue 14): an output under a
file, a file where a folder must be, or a folder this user cannot write to is bad input."""

from __future__ import annotations

import os
from pathlib import Path

from nli_models.errors import InputError
from nli_models.files import expand_user


def check_output_path(path: str | Path, label: str, folder: bool = False) -> None:
    """InputError naming `label` (e.g. `--out`) unless `path` can be created or replaced as a
    file (or, with `folder`, used or created as a folder)."""
    path = expand_user(path, label).absolute()
    if path.exists():
        if folder and not path.is_dir():
            raise InputError(f"{label} {path}: is a file; a folder is needed here")
        if not folder and path.is_dir():
            raise InputError(f"{label} {path}: is a folder; give a file name")
    existing = path if folder and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(
            f"{label} {path}: {existing} is a file, so nothing can be created under it; "
            "choose a path in a folder"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{label} {path}: the folder {existing} is not writable by this user")
