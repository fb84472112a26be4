"""download_corpus against a zip served by a local HTTP server (no internet needed)."""

import functools
import hashlib
import json
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testkit.ports import free_port

from nli_models.data import DownloadError, download_corpus, read_snli
from nli_models.errors import InputError


class CountingHandler(SimpleHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):
        CountingHandler.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/www on 127.0.0.1 from a thread; yields (base url, www dir)."""
    www = tmp_path / "www"
    www.mkdir()
    CountingHandler.requests = []
    httpd = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(CountingHandler, directory=str(www))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", www
    httpd.shutdown()
    httpd.server_close()


def make_snli_zip(path):
    row = {"gold_label": "entailment", "sentence1": "A b .", "sentence2": "A .", "pairID": "1"}
    with zipfile.ZipFile(path, "w") as archive:
        for split in ("train", "dev", "test"):
            archive.writestr(f"snli_1.0/snli_1.0_{split}.jsonl", json.dumps(row) + "\n")
        archive.writestr("__MACOSX/snli_1.0/._snli_1.0_dev.jsonl", "junk")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_unpacks_records_checksum_and_is_idempotent(server, tmp_path, capsys):
    base, www = server
    digest = make_snli_zip(www / "snli_1.0.zip")
    data_dir = tmp_path / "cache"
    result = download_corpus("snli", data_dir=data_dir, url=f"{base}/snli_1.0.zip", progress=True)
    assert result == data_dir
    assert len(read_snli(data_dir / "snli_1.0" / "snli_1.0_dev.jsonl")) == 1
    assert not (data_dir / "__MACOSX").exists()
    assert not (data_dir / "snli_1.0.zip").exists()  # archive removed after unpacking
    sidecar = json.loads((data_dir / ".snli.download.json").read_text())
    assert sidecar["sha256"] == digest and sidecar["checksum_verified"] is False
    assert "snli_1.0.zip [" in capsys.readouterr().err  # progress bar on stderr
    # second call: nothing fetched, even with the expected checksum now configured
    again = download_corpus("snli", data_dir=data_dir, url=f"{base}/snli_1.0.zip", sha256=digest)
    assert again == data_dir
    assert CountingHandler.requests == ["/snli_1.0.zip"]


def test_download_verifies_configured_checksum(server, tmp_path):
    base, www = server
    digest = make_snli_zip(www / "snli_1.0.zip")
    ok_dir = tmp_path / "ok"
    download_corpus(
        "snli", data_dir=ok_dir, url=f"{base}/snli_1.0.zip", progress=False, sha256=digest
    )
    assert json.loads((ok_dir / ".snli.download.json").read_text())["checksum_verified"] is True

    bad_dir = tmp_path / "bad"
    with pytest.raises(DownloadError, match="checksum mismatch") as error:
        download_corpus(
            "snli", data_dir=bad_dir, url=f"{base}/snli_1.0.zip", progress=False, sha256="0" * 64
        )
    assert digest in str(error.value)
    assert not (bad_dir / "snli_1.0").exists() and not (bad_dir / "snli_1.0.zip").exists()
    # an earlier download that does not match a now-configured checksum is reported, not reused
    with pytest.raises(DownloadError, match="not the expected"):
        download_corpus("snli", data_dir=ok_dir, url=f"{base}/snli_1.0.zip", sha256="1" * 64)


def test_offline_raises_download_error_with_manual_instructions(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/SICK.zip"  # nobody listens there: connection refused
    with pytest.raises(DownloadError) as error:
        download_corpus("sick", data_dir=tmp_path, url=url, progress=False)
    message = str(error.value)
    assert url in message and "by hand" in message and "--data-dir" in message
    assert not list(tmp_path.glob("*.part"))


def test_archive_without_expected_files_and_unknown_corpus(server, tmp_path):
    base, www = server
    with zipfile.ZipFile(www / "SICK.zip", "w") as archive:
        archive.writestr("readme.txt", "no data")
    with pytest.raises(DownloadError, match=r"lacks .*SICK\.txt; the archive holds readme\.txt"):
        download_corpus("sick", data_dir=tmp_path / "d", url=f"{base}/SICK.zip", progress=False)
    with pytest.raises(DownloadError, match="404"):
        download_corpus("sick", data_dir=tmp_path / "d", url=f"{base}/missing.zip", progress=False)
    with pytest.raises(ValueError, match="downloadable corpora: snli, multinli, sick, scitail"):
        download_corpus("rte", data_dir=tmp_path)


def test_zip_bomb_member_is_refused_before_extraction(server, tmp_path):
    base, www = server
    with zipfile.ZipFile(www / "snli_1.0.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("snli_1.0/snli_1.0_train.jsonl", b"\0" * (20 * 1024**2))  # ~1000x
    data_dir = tmp_path / "cache"
    with pytest.raises(DownloadError, match=r"snli_1\.0_train\.jsonl would unpack \d+x .*limit 100x"):
        download_corpus("snli", data_dir=data_dir, url=f"{base}/snli_1.0.zip", progress=False)
    assert not (data_dir / "snli_1.0").exists()


def test_data_dir_under_a_file_is_refused_before_downloading(server, tmp_path):
    base, www = server
    make_snli_zip(www / "snli_1.0.zip")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"--data-dir .*afile is a file"):
        download_corpus("snli", data_dir=tmp_path / "afile" / "cache", url=f"{base}/snli_1.0.zip")
    assert CountingHandler.requests == []
