"""Download and unpack the official release of a corpus into the data cache dir.

What is verified, honestly: this project does not ship the official SHA-256 digests of the
archives (the publishers do not list them and none was recorded here from a trusted copy), so
``KNOWN_SHA256`` is empty. A digest is checked when one is given (``sha256=`` or an entry added
to ``KNOWN_SHA256``); otherwise the first download is trusted and its size and SHA-256 are
recorded in a sidecar file (``.NAME.download.json``) so that later runs and other machines can
compare against it. After unpacking, the split files the readers expect must be present.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from nli_models.data.corpora import CORPORA
from nli_models.errors import InputError
from nli_models.outputs import check_output_path

DOWNLOAD_URLS = {
    "snli": "https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
    "multinli": "https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip",
    "sick": "https://zenodo.org/record/2787612/files/SICK.zip",
    "scitail": "https://ai2-public-datasets.s3.amazonaws.com/scitail/SciTailV1.1.zip",
}
# The SNLI, MultiNLI and SciTail archives hold a top folder (snli_1.0/ ...); SICK.zip holds
# SICK.txt at its root, so it is unpacked into sick/.
_UNPACK_INTO = {"snli": "", "multinli": "", "sick": "sick", "scitail": ""}
KNOWN_SHA256: dict[str, str] = {}


class DownloadError(RuntimeError):
    """A corpus could not be downloaded, or the download does not match its checksum."""


def default_data_dir() -> Path:
    return Path(os.environ.get("NLI_DATA_DIR") or "~/.cache/nli-orchestrator").expanduser()


def _manual_hint(url: str, data_dir: Path) -> str:
    return (
        f"Download {url} by hand, unzip it into a directory DIR (e.g. {data_dir}) and pass "
        "--data-dir DIR (data.data_dir in a config)."
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(url: str, target: Path, progress: bool, data_dir: Path) -> None:
    """Stream ``url`` to ``target`` via a .part file, so an interrupted download is never taken
    for a complete one."""
    part = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, part.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done, shown = 0, 0.0
            while block := response.read(1 << 16):
                out.write(block)
                done += len(block)
                if progress and time.monotonic() - shown > 0.2:
                    shown = time.monotonic()
                    _show_progress(target.name, done, total)
        if progress:
            _show_progress(target.name, done, total)
            print(file=sys.stderr)
    except (urllib.error.URLError, OSError) as error:
        part.unlink(missing_ok=True)
        if isinstance(error, urllib.error.HTTPError):
            reason = f"HTTP {error.code} {error.reason}"
        else:
            reason = getattr(error, "reason", error)
        raise DownloadError(
            f"could not download {url}: {reason}. {_manual_hint(url, data_dir)}"
        ) from error
    part.replace(target)


def _show_progress(name: str, done: int, total: int) -> None:
    mb = 1024 * 1024
    if total:
        width = 30
        filled = int(width * done / total)
        bar = "#" * filled + "-" * (width - filled)
        text = f"\r{name} [{bar}] {done / mb:7.1f} / {total / mb:.1f} MB ({done / total:4.0%})"
    else:
        text = f"\r{name} {done / mb:7.1f} MB"
    print(text, end="", file=sys.stderr, flush=True)


def _expected_files(name: str, data_dir: Path) -> list[Path]:
    return sorted({data_dir / relative for relative in CORPORA[name].files.values()})


# The largest release (MultiNLI) unpacks to about 1.3 GB at a ratio below 5; a member that claims
# more, or compresses far better than text does, is a zip bomb, not a corpus.
MAX_UNPACKED_BYTES = 8 * 1024**3
MAX_COMPRESSION_RATIO = 100


def _check_unpacked_size(zipped: zipfile.ZipFile, members: list[str], url: str) -> None:
    total = 0
    for info in (zipped.getinfo(m) for m in members):
        total += info.file_size
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > 1024**2 and ratio > MAX_COMPRESSION_RATIO:
            raise DownloadError(
                f"{url}: member {info.filename} would unpack {ratio:.0f}x its compressed size "
                f"(limit {MAX_COMPRESSION_RATIO}x); refusing to extract a likely zip bomb"
            )
        if total > MAX_UNPACKED_BYTES:
            raise DownloadError(
                f"{url}: members would unpack to more than {MAX_UNPACKED_BYTES / 1024**3:.0f} GiB; "
                "refusing to extract"
            )


def download_corpus(
    name: str,
    data_dir: str | Path | None = None,
    url: str | None = None,
    progress: bool = True,
    sha256: str | None = None,
) -> Path:
    """Fetch, verify and unpack corpus ``name``; returns the data dir to read it from.

    Idempotent: when the sidecar of an earlier download and the split files exist, nothing is
    fetched. ``sha256`` (or ``KNOWN_SHA256[name]``) is the digest the archive must have.
    """
    if name not in DOWNLOAD_URLS:
        raise InputError(
            f"unknown corpus {name!r}; downloadable corpora: {', '.join(DOWNLOAD_URLS)}"
        )
    data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    check_output_path(data_dir, "--data-dir", folder=True)
    url = url or DOWNLOAD_URLS[name]
    expected = (sha256 or KNOWN_SHA256.get(name) or "").lower() or None
    sidecar = data_dir / f".{name}.download.json"
    files = _expected_files(name, data_dir)

    if sidecar.is_file() and all(path.is_file() for path in files):
        recorded = json.loads(sidecar.read_text())
        if expected and recorded["sha256"] != expected:
            raise DownloadError(
                f"{name} in {data_dir} was unpacked from an archive with SHA-256 "
                f"{recorded['sha256']}, not the expected {expected}; delete {sidecar} to download again"
            )
        return data_dir

    data_dir.mkdir(parents=True, exist_ok=True)
    archive = data_dir / (Path(urllib.parse.urlsplit(url).path).name or f"{name}.zip")
    _fetch(url, archive, progress, data_dir)
    digest, size = _sha256(archive), archive.stat().st_size
    if expected and digest != expected:
        archive.unlink()
        raise DownloadError(
            f"checksum mismatch for {url}: expected SHA-256 {expected}, got {digest} ({size} bytes); "
            "the file was deleted. A changed release or a broken download: try again, or "
            + _manual_hint(url, data_dir)
        )
    target = data_dir / _UNPACK_INTO[name]
    try:
        with zipfile.ZipFile(archive) as zipped:
            # extractall drops absolute paths and '..' parts, so members stay inside target.
            members = [m for m in zipped.namelist() if not m.startswith("__MACOSX")]
            _check_unpacked_size(zipped, members, url)
            zipped.extractall(target, members)
    except zipfile.BadZipFile as error:
        raise DownloadError(f"{url} is not a valid zip archive ({error})") from error
    finally:
        archive.unlink(missing_ok=True)
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise DownloadError(
            f"{url} was unpacked into {target} but lacks {', '.join(missing)}; the archive holds "
            f"{', '.join(members[:10])}{' ...' if len(members) > 10 else ''}"
        )
    sidecar.write_text(
        json.dumps(
            {"url": url, "sha256": digest, "size": size, "checksum_verified": bool(expected)},
            indent=2,
        )
    )
    return data_dir
