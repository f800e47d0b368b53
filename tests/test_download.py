"""Datasets by name, fetched on first use: downloads from a local HTTP server (through
$GNNDIST_DATA_MIRROR) that succeed, break off, stall, fail or send the wrong bytes, each leaving
no file in the cache that could be taken for a whole one; and the catalogue's contract."""
import gzip
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.datasets.catalog import CATALOG, CONVERTED, catalog
from gnndist.datasets.registry import FORMATS, DataSource, data_kind
from gnndist.errors import GnndistError

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="shared datasets not present")
UCI_URL = "https://snap.stanford.edu/data/CollegeMsg.txt.gz"
UCI_PATH = "/snap.stanford.edu/data/CollegeMsg.txt.gz"
PLANETOID_PATH = "/github.com/kimiyoung/planetoid/raw/master/data/"


class Server(http.server.ThreadingHTTPServer):
    """Serves `root` (laid out HOST/PATH, as the mirror is) with HTTP Range requests; `mode[path]`
    makes a path misbehave: "500", "truncate" (announces the whole file, sends half), "stall"
    (sends half, then waits `stall_s`), "slow" (sends in pieces over about a second),
    "no-range" (ignores Range). Every GET is recorded in `gets` as (path, Range header)."""

    daemon_threads = True

    def __init__(self, root: Path):
        super().__init__(("127.0.0.1", 0), Handler)
        self.root, self.mode, self.gets, self.stall_s = root, {}, [], 5.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        srv: Server = self.server
        rng = self.headers.get("Range")
        srv.gets.append((self.path, rng))
        mode = srv.mode.get(self.path)
        file = srv.root / self.path.lstrip("/")
        if mode == "500" or not file.is_file():
            self.send_error(500 if mode == "500" else 404)
            return
        data = file.read_bytes()
        start = int(rng.split("=")[1].split("-")[0]) if rng and mode != "no-range" else 0
        if start >= len(data) > 0:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if mode in ("truncate", "stall"):
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            if mode == "stall":
                time.sleep(srv.stall_s)
            return
        if mode == "slow":
            for i in range(10):
                self.wfile.write(body[i * len(body) // 10:(i + 1) * len(body) // 10])
                self.wfile.flush()
                time.sleep(0.1)
            return
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A mirror of UCI's and Cora's files on 127.0.0.1, with $GNNDIST_DATA a fresh folder."""
    root = tmp_path / "mirror"
    (root / UCI_PATH.lstrip("/")).parent.mkdir(parents=True)
    shutil.copy(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz", root / UCI_PATH.lstrip("/"))
    (root / PLANETOID_PATH.lstrip("/")).mkdir(parents=True)
    for f in (DATA / "cora").glob("ind.cora.*"):
        shutil.copy(f, root / PLANETOID_PATH.lstrip("/") / f.name)
    srv = Server(root)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("GNNDIST_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GNNDIST_DATA_MIRROR", srv.base)
    monkeypatch.setenv("GNNDIST_DATA_TIMEOUT", "0.5")
    yield srv
    srv.shutdown()
    srv.server_close()


def files_in(folder: Path) -> set[str]:
    """The files under `folder` (relative paths), the lock file aside."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def assert_same(a, b) -> None:
    for k in ("src", "dst", "t", "edge_feat", "edge_label", "orig_ids", "indptr", "indices", "x", "y",
              "train_mask", "val_mask", "test_mask"):
        x, y = getattr(a, k, None), getattr(b, k, None)
        assert (x is None) == (y is None), k
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), k


def test_a_name_downloads_once_and_reads_as_the_file_does(server, tmp_path):
    g = load("uci")
    assert_same(g, load(str(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz")))
    assert server.gets == [(UCI_PATH, None)]
    data = tmp_path / "data" / "uci"
    assert files_in(data) == {"CollegeMsg.txt.gz", *(f"{CONVERTED}/{k}.npy" for k in ("src", "dst", "t", "orig_ids")),
                              f"{CONVERTED}/meta.json"}
    assert_same(load("uci"), g)  # from the converted arrays: no request, and not the text file
    assert server.gets == [(UCI_PATH, None)]
    (data / "CollegeMsg.txt.gz").unlink()  # the converted arrays are enough
    assert_same(load("uci"), g)
    assert server.gets == [(UCI_PATH, None)]


def test_planetoid_by_name_is_checked_by_sha256_and_equals_the_folder(server):
    assert_same(load("cora"), load(str(DATA / "cora")))
    assert len(server.gets) == 8


def test_a_server_error_names_the_url_and_where_to_put_the_file(server, tmp_path):
    server.mode[UCI_PATH] = "500"
    with pytest.raises(GnndistError) as e:
        load("uci")
    dest = tmp_path / "data" / "uci" / "CollegeMsg.txt.gz"
    assert str(e.value) == (f"cannot download {UCI_URL} (from {server.base}{UCI_PATH}): HTTP 500 Internal Server "
                            f"Error; or put the file there by hand: {dest}")
    assert files_in(tmp_path / "data") == set()


def test_no_server(server, tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there once closed
    monkeypatch.setenv("GNNDIST_DATA_MIRROR", f"http://127.0.0.1:{port}")
    with pytest.raises(GnndistError, match=f"cannot download {UCI_URL} .*: Connection refused; or put the file there "
                                           f"by hand: {tmp_path}/data/uci/CollegeMsg.txt.gz$"):
        load("uci")
    assert files_in(tmp_path / "data") == set()


def test_a_truncated_transfer_keeps_only_a_part_that_the_next_try_resumes(server, tmp_path):
    server.mode[UCI_PATH] = "truncate"
    with pytest.raises(GnndistError, match=r"cannot download .*: the server sent 172,677 of 345,354 bytes; kept them "
                                           r"in .*CollegeMsg.txt.gz.part, where the next try resumes"):
        load("uci")
    whole = (DATA / "uci_collegemsg" / "CollegeMsg.txt.gz").read_bytes()
    part = tmp_path / "data" / "uci" / "CollegeMsg.txt.gz.part"
    assert files_in(tmp_path / "data") == {"uci/CollegeMsg.txt.gz.part"} and part.read_bytes() == whole[:172677]
    del server.mode[UCI_PATH]
    g = load("uci")
    assert server.gets[-1] == (UCI_PATH, "bytes=172677-")  # resumed, not started again
    assert_same(g, load(str(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz")))
    assert (tmp_path / "data" / "uci" / "CollegeMsg.txt.gz").read_bytes() == whole and not part.exists()


def test_a_part_the_server_cannot_continue_is_started_again(server, tmp_path):
    whole = (DATA / "uci_collegemsg" / "CollegeMsg.txt.gz").read_bytes()
    folder = tmp_path / "data" / "uci"
    folder.mkdir(parents=True)
    (folder / "CollegeMsg.txt.gz.part").write_bytes(b"x" * 1000)  # a server without Range support sends it all
    server.mode[UCI_PATH] = "no-range"
    load("uci")
    assert server.gets == [(UCI_PATH, "bytes=1000-")] and (folder / "CollegeMsg.txt.gz").read_bytes() == whole


def test_a_stalled_server_times_out(server, tmp_path):
    server.mode[UCI_PATH] = "stall"
    start = time.monotonic()
    with pytest.raises(GnndistError, match=r"cannot download .*: the transfer stopped after 172,677 bytes \(timed "
                                           r"out\); kept them in .*\.part, where the next try resumes; or put the file "
                                           r"there by hand: .*/uci/CollegeMsg.txt.gz$"):
        load("uci")
    assert time.monotonic() - start < 4  # GNNDIST_DATA_TIMEOUT=0.5, not the server's 5 s
    assert files_in(tmp_path / "data") == {"uci/CollegeMsg.txt.gz.part"}


def test_a_wrong_checksum_deletes_the_download(server, tmp_path):
    x = server.root / PLANETOID_PATH.lstrip("/") / "ind.cora.x"
    data = x.read_bytes()
    x.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # same size, one bit changed
    with pytest.raises(GnndistError, match=r"ind.cora.x \(from .*\): the downloaded file's sha256 is [0-9a-f]{64}, "
                                           r"expected 23cfa55d.*; put the source's file there by hand: "
                                           r".*/data/cora/ind.cora.x$"):
        load("cora")
    assert files_in(tmp_path / "data") == set()


def test_a_file_that_is_not_the_published_one_is_deleted(server, tmp_path):
    """No sha256 is known for SNAP's file: a download cut short that still is a whole gzip file
    is caught by the published event count, and deleted so that the next try fetches it again."""
    lines = gzip.decompress((DATA / "uci_collegemsg" / "CollegeMsg.txt.gz").read_bytes()).splitlines(keepends=True)
    (server.root / UCI_PATH.lstrip("/")).write_bytes(gzip.compress(b"".join(lines[:1000])))
    with pytest.raises(GnndistError, match=r"CollegeMsg.txt.gz: holds 237 nodes \(published: 1,899\) and 1,000 "
                                           r"events \(published: 59,835\): not uci as its source publishes it "
                                           rf"\(deleted what was downloaded from {UCI_URL}; try again\)"):
        load("uci")
    assert files_in(tmp_path / "data") == set()


def test_a_file_put_there_by_hand_is_used_and_kept(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNDIST_DATA_MIRROR", "http://127.0.0.1:1")  # no server: nothing may be fetched
    folder = tmp_path / "data" / "uci"
    folder.mkdir(parents=True)
    shutil.copy(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz", folder)
    assert load("uci").num_events == 59835
    cora = tmp_path / "data" / "cora"
    shutil.copytree(DATA / "cora", cora)
    (cora / "ind.cora.y").write_bytes((cora / "ind.cora.y").read_bytes() + b"\n")
    with pytest.raises(GnndistError, match=r"ind.cora.y: sha256 [0-9a-f]{64}, expected 94465c14.*: not the file "
                                           r"https://github.com/kimiyoung/planetoid/raw/master/data/ind.cora.y serves "
                                           r"\(remove it to download it again\)$"):
        load("cora")
    assert (cora / "ind.cora.y").exists()  # the user's file is never deleted
    # a file replaced by hand after conversion is read again
    lines = gzip.decompress((DATA / "uci_collegemsg" / "CollegeMsg.txt.gz").read_bytes()).splitlines(keepends=True)
    (folder / "CollegeMsg.txt.gz").write_bytes(gzip.compress(b"".join(lines[:10])))
    with pytest.raises(GnndistError, match="and 10 events .*were put there before: replace them"):
        load("uci")
    assert (folder / "CollegeMsg.txt.gz").exists()


def test_two_processes_download_once(server, tmp_path):
    server.mode[UCI_PATH] = "slow"  # about a second: the second process comes while the first downloads
    code = "from gnndist.datasets import load; print(load('uci').num_events)"
    env = {**os.environ, "GNNDIST_DATA_TIMEOUT": "30"}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == [b"59835", b"59835"]
    assert server.gets == [(UCI_PATH, None)]
    assert sum(b"waiting for another process that is fetching uci" in e for _, e in outs) == 1, outs
    assert files_in(tmp_path / "data" / "uci") == {"CollegeMsg.txt.gz", *(f"{CONVERTED}/{k}" for k in (
        "src.npy", "dst.npy", "t.npy", "orig_ids.npy", "meta.json"))}


def test_a_name_works_where_a_path_does_without_fetching_until_read(server, tmp_path, capsys, monkeypatch):
    assert data_kind("uci") == "temporal" and data_kind("cora") == "static"
    assert DataSource("uci").identity() == DataSource("uci").identity() != DataSource("cora").identity()
    assert server.gets == []
    assert main(["info", "uci", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["data"], info["format"], info["num_nodes"], info["num_events"]) == ("uci", "snap", 1899, 59835)
    assert main(["partition", "cora", "--parts", "2", "--out", str(tmp_path / "cora2")]) == 0
    assert json.loads((tmp_path / "cora2" / "meta.json").read_text())["num_nodes"] == 2708
    assert len(server.gets) == 9
    # a file or folder of that name here is read instead
    monkeypatch.chdir(tmp_path)
    (tmp_path / "uci").write_text("1 2 3\n2 3 4\n")
    assert load("uci").num_events == 2
    with pytest.raises(GnndistError, match="--format csv is for files; cora is a dataset by name"):
        load("cora", format="csv")


def test_the_catalogue_as_json(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNDIST_DATA", str(tmp_path / "data"))
    out = subprocess.run([sys.executable, "-m", "gnndist", "datasets", "--json"], capture_output=True, check=True)
    listed = json.loads(out.stdout)
    assert listed == catalog()
    names = {d["name"] for d in listed}
    assert names >= {"uci", "email-eu-temporal", "bitcoin-otc", "bitcoin-alpha", "wikipedia", "reddit", "mooc",
                     "lastfm", "cora", "citeseer", "pubmed", "tgbl-wiki", "tgbl-review", "tgbl-coin", "tgbn-trade",
                     "tgbn-genre"}
    for d in listed:
        assert d["kind"] in ("temporal", "static") and d["kind"] == CATALOG[d["name"]].kind
        assert FORMATS[d["format"]][0] is CATALOG[d["name"]].read
        assert d["files"] and all(set(f) == {"url", "sha256"} and f["url"].startswith("https://") for f in d["files"])
        assert all(f["sha256"] is None or len(f["sha256"]) == 64 for f in d["files"])
        assert d["folder"] == str(tmp_path / "data" / d["name"]) and not d["downloaded"]
    # the sha256 recorded for Cora's and CiteSeer's files are those of the copies here
    for name in ("cora", "citeseer"):
        for f in next(d for d in listed if d["name"] == name)["files"]:
            local = DATA / name / f["url"].rsplit("/", 1)[1]
            assert hashlib.sha256(local.read_bytes()).hexdigest() == f["sha256"]
    text = subprocess.run([sys.executable, "-m", "gnndist", "datasets"], capture_output=True, check=True).stdout
    assert all(f"  {n} " in text.decode() for n in names)


def test_bad_input_about_datasets_by_name_is_one_line(server, tmp_path, monkeypatch, capsys):
    server.mode[UCI_PATH] = "500"
    assert main(["info", "uci"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gnndist info: error: cannot download {UCI_URL} (from "), err
    monkeypatch.setenv("GNNDIST_DATA_TIMEOUT", "soon")
    assert main(["train", "uci", "--quiet"]) == 2
    assert capsys.readouterr().err == ("gnndist train: error: GNNDIST_DATA_TIMEOUT='soon': expected a number of "
                                       "seconds > 0\n")
    assert main(["datasets", "cora", "--json"]) == 2
    assert capsys.readouterr().err == "gnndist datasets: error: --json lists the datasets by name; leave DATA out\n"
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("GNNDIST_DATA", str(tmp_path / "file" / "data"))
    assert main(["info", "cora"]) == 2
    assert capsys.readouterr().err.startswith(f"gnndist info: error: cannot make the dataset folder {tmp_path}/file/data")
    assert files_in(tmp_path / "data") == set()
