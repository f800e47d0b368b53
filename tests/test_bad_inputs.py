"""A corpus of bad inputs: every one must end with exit status 2 and exactly one stderr line
that names the file or flag and the problem, no traceback, and every input file unchanged
(nothing written either).

To add a case, append a `Case(id, setup, expect)` to CASES: `setup(ctx)` writes the inputs
under `ctx.tmp` (helpers: `ctx.file`, `ctx.store`, `ctx.restamp`) and returns the argv of
`gnndist`; `expect` lists substrings of the error line. Cases run in-process through
`gnndist.cli.main`; the ids in SUBPROCESS also run as `python -m gnndist`, so that no warning
or traceback printed outside the CLI's handler goes unseen. The second part of the file tests
the library pieces the CLI will use for outputs (gnndist.outputs) and checkpoints.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, Union

import numpy as np
import pytest
import torch

from gnndist import checkpoint
from gnndist import Graph
from gnndist.runtime import launch as glaunch
from gnndist.cli import main
from gnndist.datasets import FORMATS, GENERATORS, load
from gnndist.errors import GnndistError
from gnndist.outputs import SOFTWARE, check_output, checkpoint_name, write_metrics
from gnndist.partition import partition_graph
from test_datasets import write_planetoid  # tests/ is on sys.path under pytest
from test_partition import rewrite

STATIC = ["synthetic-static", "--num-nodes", "200", "--num-edges", "600"]
TEMPORAL = ["synthetic-temporal", "--num-nodes", "80", "--num-events", "800"]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """Small valid stores to copy and spoil: static (halo, features) and temporal (halo, hubs)."""
    root = tmp_path_factory.mktemp("bases")
    partition_graph(load(STATIC[0], num_nodes=200, num_edges=600), 2, halo=1, out=root / "static")
    partition_graph(load(TEMPORAL[0], num_nodes=80, num_events=800), 2, halo=1, replicate_hubs=2,
                    out=root / "temporal")
    return {"static": root / "static", "temporal": root / "temporal"}


@dataclass
class Ctx:
    """The folder a case writes its inputs to, and helpers to write them."""

    tmp: Path
    bases: dict[str, Path]

    @property
    def out(self) -> str:
        """An output path that a refused command must not create."""
        return str(self.tmp / "out")

    def file(self, name: str, content: Union[str, bytes], raw: bool = False) -> str:
        """Write an input file (gzipped when `name` ends in .gz, unless `raw`); its path."""
        p = self.tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        p.write_bytes(gzip.compress(data) if name.endswith(".gz") and not raw else data)
        return str(p)

    def link(self, target: str, name: str, hard: bool = False) -> str:
        """A symbolic (or hard) link `name` to `target`; its path."""
        (os.link if hard else os.symlink)(target, self.tmp / name)
        return str(self.tmp / name)

    def npz(self, name: str, **arrays) -> str:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return self.file(name, buf.getvalue())

    def planetoid(self, **change) -> Path:
        """A valid toy Planetoid folder (tests/test_datasets.py), parts replaced by `change`."""
        folder = self.tmp / "toy"
        write_planetoid(folder, **change)
        return folder

    def planetoid_with(self, edit: Callable[[Path], object]) -> Path:
        """The toy Planetoid folder after `edit(folder)`."""
        folder = self.planetoid()
        edit(folder)
        return folder

    def store(self, kind: str = "temporal") -> Path:
        """A copy of a valid store."""
        s = self.tmp / f"{kind}-store"
        shutil.copytree(self.bases[kind], s)
        return s

    def restamp(self, store: Path, arrays: dict[str, np.ndarray] = {}, meta_edit=None) -> Path:
        """Replace store files and edit meta.json, fixing every checksum (a careful hand-edit)."""
        rewrite(store, arrays, meta_edit)
        return store


@dataclass
class Case:
    id: str
    setup: Callable[[Ctx], Sequence[str]]
    expect: Sequence[str]
    loads: bool = True  # False: refused before any generator or file loader runs (the test checks)


def partition(data, *flags) -> Callable[[Ctx], list[str]]:
    """A setup running `gnndist partition DATA --parts 2 --out OUT FLAGS` (DATA: a built-in name
    list, or a function of ctx that writes the input and returns its path)."""
    def setup(ctx: Ctx) -> list[str]:
        d = data(ctx) if callable(data) else data
        return ["partition", *([str(d)] if isinstance(d, (str, Path)) else d), "--parts", "2", "--out", ctx.out,
                "--quiet", *flags]
    return setup


def out_at(out: Callable[[Ctx, str], str]) -> Callable[[Ctx], list[str]]:
    """A setup partitioning a small edge list g.txt into `--out out(ctx, path of g.txt)`."""
    def setup(ctx: Ctx) -> list[str]:
        data = ctx.file("g.txt", "1 2 3\n4 5 6\n")
        return ["partition", data, "--parts", "2", "--out", out(ctx, data)]
    return setup


def info(spoil: Callable[[Ctx, Path], object], *flags, kind: str = "temporal") -> Callable[[Ctx], list[str]]:
    """A setup running `gnndist info STORE --verify` on a store copy that `spoil(ctx, store)` damaged."""
    def setup(ctx: Ctx) -> list[str]:
        s = ctx.store(kind)
        spoil(ctx, s)
        return ["info", str(s), "--verify", *flags]
    return setup


def part_array(store: Path, rel: str) -> np.ndarray:
    return np.load(store / rel)


def _edited(store: Path, rel: str, fn) -> dict[str, np.ndarray]:
    a = part_array(store, rel).copy()
    fn(a)
    return {rel: a}


class _Huge:
    def __reduce__(self):  # np.ndarray((2**44,), uint8): 16 TiB, with allowed globals only
        return (np.ndarray, ((2**44,), np.dtype("u1")))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _set(a, i, v):
    a[i] = v


def _saved_checkpoint(ctx: Ctx) -> str:
    """A checkpoint folder `ck` holding one epoch file."""
    checkpoint.save(ctx.tmp / "ck", {"epoch": 1, "w": torch.ones(4)})
    return str(ctx.tmp / "ck")


def _resume(content: Callable[[bytes], bytes]) -> Callable[[Ctx], list[str]]:
    """`gnndist train ... --resume` from a checkpoint folder whose epoch file is `content(good)`."""
    def setup(ctx: Ctx) -> list[str]:
        d = ctx.tmp / "ckpt"
        checkpoint.save(d, {"epoch": 1, "w": torch.ones(4)})
        f = d / checkpoint_name(1)
        f.write_bytes(content(f.read_bytes()))
        return ["train", *TEMPORAL, "--task", "link", "--epochs", "2", "--checkpoint", str(d), "--resume", "--quiet"]
    return setup


def train(task: str, *flags: str) -> Callable[[Ctx], list[str]]:
    """A setup running `gnndist train` on a small built-in graph of `task`'s kind with `flags`."""
    return lambda ctx: ["train", *(TEMPORAL if task == "link" else STATIC), "--task", task, "--quiet", *flags]


def shard_folder(c: Ctx, **change: str) -> str:
    """A folder of four CSV shard files, those named in `change` (part_3=...) replaced."""
    for k in range(4):
        c.file(f"sh/part-{k}.csv", change.get(f"part_{k}", f"src,dst,t\n{k},{k + 1},{k}.5\n"))
    return str(c.tmp / "sh")


def flags_case(id: str, task: str, flags: Sequence[str], expect: Sequence[str]) -> Case:
    """A train case that the flags alone refuse, before any data is read."""
    return Case(id, train(task, *flags), expect, loads=False)


CASES = [
    # ---- loaders of every format
    Case("csv-form-feed-only", partition(lambda c: c.file("ff.csv", "src,dst,t\n\f\n")), ["ff.csv", "no data lines"]),
    Case("csv-no-dst-column", partition(lambda c: c.file("h.csv", "src,x,t\n1,2,3\n")),
         ["h.csv:1", "header needs exactly one dst column"]),
    Case("csv-nan-time", partition(lambda c: c.file("n.csv", "src,dst,t\n1,2,3\n1,2,nan\n")), ["n.csv:3", "t is nan"]),
    Case("csv-negative-id", partition(lambda c: c.file("neg.csv", "src,dst,t\n1,-2,3\n")),
         ["neg.csv:2", "node id -2 is negative"]),
    Case("csv-fractional-label", partition(lambda c: c.file("l.csv", "src,dst,t,label\n1,2,3,0.5\n")),
         ["l.csv:2", "label 0.5 is not an integer"]),
    Case("snap-field-count", partition(lambda c: c.file("f.txt", "1 2 3\n4 5\n")), ["f.txt:2", "expected 3 fields"]),
    Case("snap-word", partition(lambda c: c.file("w.txt", "1 2 3\n\f\n4 x 6\n")),
         ["w.txt:3", "field 2 is not a number: 'x'"]),
    Case("snap-empty", partition(lambda c: c.file("e.txt", "")), ["e.txt", "empty file"]),
    Case("snap-inf-time", partition(lambda c: c.file("i.txt", "1 2 inf\n")), ["i.txt:1", "time is inf"]),
    Case("snap-time-span-overflows", partition(lambda c: c.file("o.txt", "1 2 -1e308\n2 3 1e308\n")),
         ["o.txt: t spans -1e+308 to 1e+308", "shift or scale the times"]),  # numpy warned of overflow first
    Case("snap-gz-cut", partition(lambda c: c.file("g.txt.gz", gzip.compress(b"1 2 3\n" * 500)[:30], raw=True)),
         ["g.txt.gz", "cannot read"]),
    Case("shards-bad-row-in-shard-3", partition(lambda c: shard_folder(c, part_3="src,dst,t\n1,2,3\n4,5\n")),
         ["part-3.csv:3", "expected 3 fields, got 2"]),
    Case("shards-header-differs", partition(lambda c: shard_folder(c, part_3="src,dst,time\n1,2,3\n")),
         ["part-3.csv: header 'src,dst,time' differs from", "part-0.csv's 'src,dst,t'"]),
    Case("npz-garbage", partition(lambda c: c.file("g.npz", b"PK\x03\x04garbage")), ["g.npz", "not a readable .npz"]),
    Case("npz-missing-array", partition(lambda c: c.npz("m.npz", adj_data=np.ones(1))),
         ["m.npz", "missing array 'adj_shape'"]),
    Case("npz-object-array", partition(lambda c: c.npz(
        "o.npz", adj_data=np.ones(2), adj_indices=np.array([1, 0]), adj_indptr=np.array([0, 1, 2]),
        adj_shape=np.array([2, 2]), labels=np.array([object(), object()]))),
         ["o.npz", "array 'labels' cannot be read"]),
    Case("npz-negative-label", partition(lambda c: c.npz(
        "l.npz", adj_data=np.ones(2), adj_indices=np.array([1, 0]), adj_indptr=np.array([0, 1, 2]),
        adj_shape=np.array([2, 2]), labels=np.array([0, -3]))), ["l.npz", "labels hold a negative class (-3)"]),
    Case("planetoid-16tib-array", partition(lambda c: c.planetoid(allx=_Huge())),
         ["ind.toy.allx", "not a valid Planetoid pickle"]),
    Case("planetoid-code-global", partition(lambda c: c.planetoid(graph=_Evil())),
         ["ind.toy.graph", "refusing to load global"]),
    Case("planetoid-truncated", partition(lambda c: c.planetoid_with(lambda f: (f / "ind.toy.tx").write_bytes(
        (f / "ind.toy.tx").read_bytes()[:50]))), ["ind.toy.tx", "not a valid Planetoid pickle"]),
    Case("planetoid-missing-part", partition(lambda c: c.planetoid_with(lambda f: (f / "ind.toy.ty").unlink())),
         ["ind.toy.ty: no such file"]),
    Case("planetoid-two-datasets", partition(lambda c: c.planetoid_with(lambda f: (f / "ind.other.x").touch())),
         ["toy", "found 2 (other, toy)"]),
    Case("planetoid-bad-labels", partition(lambda c: c.planetoid(ally=np.full((500, 3), 0.5))),
         ["ind.toy.ally", "expected one-hot label rows"]),
    Case("npz-nan-feature", lambda c: (np.savez(c.tmp / "n.npz", adj_shape=np.array([2, 2]), adj_indices=np.array([1, 0]),
                                                adj_indptr=np.array([0, 1, 2]), attr_matrix=np.array([[np.nan], [1.0]]),
                                                labels=np.array([0, 1])), ["info", str(c.tmp / "n.npz")])[1],
         ["n.npz: x holds NaN or inf"]),  # the graph's own check, named by the file
    Case("format-of-a-built-in", lambda c: ["info", "synthetic-static", "--format", "snap"],
         ["--format snap is for files; synthetic-static is a built-in dataset (leave --format out)"]),
    Case("format-unknown", partition(lambda c: c.file("g.txt", "1 2 3\n"), "--format", "xml"),
         ["unknown format 'xml'"]),
    Case("data-missing", partition(lambda c: str(c.tmp / "nothing.txt")), ["nothing.txt", "no such file"]),
    Case("data-fifo", partition(lambda c: (os.mkfifo(c.tmp / "pipe.txt"), str(c.tmp / "pipe.txt"))[1]),
         ["pipe.txt", "not a regular file"]),
    Case("data-symlink-loop", partition(lambda c: c.link("loop.txt", "loop.txt")),  # was pathlib's RuntimeError
         ["/loop.txt: its symbolic links loop (a link to itself, or links to each other)"]),
    Case("data-folder-of-nothing", partition(lambda c: (c.file("d/readme.md", "hi"), str(c.tmp / "d"))[1]),
         ["cannot tell the format of this folder"]),
    # ---- built-in generators
    Case("data-seed-negative-static", partition(STATIC, "--data-seed", "-1"), ["--data-seed", "got -1"]),
    Case("data-seed-negative-temporal", partition(TEMPORAL, "--data-seed", "-1"), ["--data-seed", "got -1"]),
    Case("data-seed-huge", partition(TEMPORAL, "--data-seed", str(2**64)), ["--data-seed", "18446744073709551615"]),
    Case("data-seed-not-int", partition(TEMPORAL, "--data-seed", "1e23"), ["--data-seed", "invalid int value"]),
    Case("num-nodes-zero", partition(["synthetic-static", "--num-nodes", "0"]), ["--num-nodes", "must be a positive"]),
    Case("num-nodes-one", partition(["synthetic-temporal", "--num-nodes", "1"]), ["--num-nodes", "at least 2, got 1"]),
    Case("num-edges-too-many", partition(["synthetic-static", "--num-nodes", "10", "--num-edges", "100"]),
         ["--num-edges", "must be at most a quarter of all node pairs (22) for 10 nodes, got 100"]),
    Case("generator-option-not-its-own", partition(STATIC + ["--num-events", "5"]), ["has no option num_events"]),
    Case("generator-option-on-a-file", partition(lambda c: [c.file("g.txt", "1 2 3\n"), "--num-nodes", "5"]),
         ["num_nodes", "options of the built-in generators only"]),
    # ---- partition flags
    Case("parts-zero", lambda c: ["partition", *STATIC, "--parts", "0", "--out", c.out], ["--parts must be between"]),
    Case("parts-above-nodes", lambda c: ["partition", *STATIC, "--parts", "201", "--out", c.out],
         ["--parts must be between 1 and the node count (200), got 201"]),
    Case("parts-too-many-for-metis", lambda c: ["partition", *TEMPORAL, "--parts", "40", "--out", c.out],
         ["partitioning left", "of the 40 parts without nodes"]),  # METIS's own 10 lines dropped
    Case("parts-not-int", lambda c: ["partition", *STATIC, "--parts", "two", "--out", c.out],
         ["--parts", "invalid int value: 'two'"]),
    Case("method-unknown", partition(STATIC, "--method", "magic"), ["--method", "invalid choice: 'magic'"]),
    Case("method-temporal-on-static", partition(STATIC, "--method", "temporal"), ["--method temporal needs"]),
    Case("balance-unknown", partition(STATIC, "--balance", "nodes,colour"), ["unknown --balance key 'colour'"]),
    Case("balance-with-temporal", partition(TEMPORAL, "--balance", "train"),
         ["--balance applies to --method metis and metis-lp only", "--method temporal balances"]),
    Case("balance-with-random", partition(STATIC, "--method", "random", "--balance", "nodes"),
         ["--balance applies to --method metis and metis-lp only", "--method random"]),
    Case("imbalance-tol-below-1", partition(STATIC, "--imbalance-tol", "0.5"), ["--imbalance-tol must be from"]),
    Case("imbalance-tol-nan", partition(STATIC, "--imbalance-tol", "nan"), ["--imbalance-tol must be from"]),
    Case("seed-negative", partition(STATIC, "--seed", "-1"), ["--seed must be an integer from 0 to 4294967295"]),
    Case("time-windows-zero", partition(TEMPORAL, "--time-windows", "0"), ["--time-windows must be from 1 to"]),
    Case("time-windows-on-static", partition(STATIC, "--time-windows", "2"),
         ["--time-windows applies to temporal graphs only"]),
    Case("recency-negative", partition(TEMPORAL, "--recency", "-1"), ["--recency must be a finite number >= 0"]),
    Case("balance-empty", partition(STATIC, "--balance", ""), ["--balance needs one or more of nodes, edges, train"]),
    Case("imbalance-tol-with-random", partition(STATIC, "--method", "random", "--imbalance-tol", "2"),
         ["--imbalance-tol applies to --method metis and temporal; --method random hashes node ids"]),
    Case("data-seed-of-a-file", lambda c: ["partition", c.file("e.txt", "0 1 1\n1 2 2\n2 0 3\n"), "--parts", "2",
                                           "--data-seed", "3", "--out", c.out],
         ["--data-seed is the built-in generators' seed", "e.txt is not one of them"]),
    Case("info-memory-dim-of-static-data", lambda c: ["info", *STATIC, "--memory-dim", "8"],
         ["--memory-dim is the node memory of the link models", "is a static graph"]),
    Case("recency-huge", partition(TEMPORAL, "--recency", "1e18"),  # METIS's weight sums overflowed: a crash
         ["--recency must be a finite number >= 0 and <= 1e+06, got 1e+18"]),
    Case("recency-with-random", partition(TEMPORAL, "--method", "random", "--recency", "2"),
         ["--recency applies to --method temporal only"]),
    Case("replicate-hubs-on-static", partition(STATIC, "--replicate-hubs", "2"),
         ["--replicate-hubs applies to temporal graphs only"]),
    Case("halo-two", partition(STATIC, "--halo", "2"), ["--halo", "invalid choice: 2"]),
    # ---- output paths
    Case("out-is-the-input", out_at(lambda c, data: data), ["g.txt", "it is the input"]),
    Case("out-contains-the-input", lambda c: ["partition", c.file("d/g.txt", "1 2 3\n4 5 6\n"), "--parts", "2",
                                              "--out", str(c.tmp / "d")], ["contains the input"]),
    Case("out-inside-the-input-folder", lambda c: ["partition", str(c.planetoid()), "--parts", "2",
                                                   "--out", str(c.tmp / "toy" / "parts")],
         ["toy/parts", "it is inside the input folder"]),
    Case("out-symlink-to-the-input", out_at(lambda c, data: c.link(data, "l")), ["/l: it is the input"]),
    Case("out-hard-link-to-the-input", out_at(lambda c, data: c.link(data, "h", hard=True)),
         ["/h: it is a hard link to the input"]),
    Case("out-folder-of-other-files", lambda c: ["partition", *STATIC, "--parts", "2", "--out",
                                                 str(Path(c.file("mine/notes.md", "keep")).parent)],
         ["mine", "it exists and is not a partition store"]),
    Case("out-is-a-file", lambda c: ["partition", *STATIC, "--parts", "2", "--out", c.file("f.bin", b"keep")],
         ["f.bin", "it exists and is a file"]),
    Case("out-store-with-a-foreign-file", lambda c: ["partition", *STATIC, "--parts", "2", "--out",
                                                     str((c.store(), c.file("temporal-store/part0/n.md", "x"))[0])],
         ["holds part0/n.md, which the store did not write"]),
    Case("out-store-unreadable-meta", lambda c: ["partition", *STATIC, "--parts", "2", "--out",
                                                 str((s := c.store(), (s / "meta.json").write_text("{"))[0])],
         ["meta.json is unreadable"]),
    Case("out-under-a-file", lambda c: ["partition", *STATIC, "--parts", "2", "--out", c.file("f", "x") + "/s"],
         ["is not a folder"]),
    # ---- gnndist info / --verify and damaged or hand-edited stores
    Case("info-not-a-store", lambda c: ["info", str(Path(c.file("d/x.md", "x")).parent)],
         ["is not a partition store (no meta.json)"]),
    Case("info-meta-not-json", info(lambda c, s: (s / "meta.json").write_text("{oops")),
         ["meta.json", "not valid JSON"]),
    Case("info-meta-nested", info(lambda c, s: (s / "meta.json").write_text("[" * 200_000 + "]" * 200_000)),
         ["meta.json", "nested too deeply"]),
    Case("info-meta-edited", info(lambda c, s: (s / "meta.json").write_text(
        (s / "meta.json").read_text().replace('"num_parts": 2', '"num_parts": 3'))),
         ["meta.json does not match its checksum"]),
    Case("info-old-format", info(lambda c, s: (s / "meta.json").write_text(json.dumps(
        {k: v for k, v in json.loads((s / "meta.json").read_text()).items() if k != "meta_sha256"}
        | {"format_version": 1}))), ["format 1; this gnndist reads format 2", "rewrite the store"]),
    Case("info-json-old-format", info(lambda c, s: (s / "meta.json").write_text('{"format_version": 1}'), "--json"),
         ["format 1"]),
    Case("info-flipped-byte", info(lambda c, s: (s / "part1/t.npy").write_bytes(
        (b := (s / "part1/t.npy").read_bytes())[:-1] + bytes([b[-1] ^ 1]))), ["part1/t.npy", "sha256 mismatch"]),
    Case("info-missing-part", info(lambda c, s: shutil.rmtree(s / "part1")),
         ["missing part1/ (the files of part 1)", "copy it from the host that wrote the store"]),
    Case("info-missing-file", info(lambda c, s: (s / "part0/src.npy").unlink()),
         ["missing part0/src.npy", "copy it from the host"]),
    Case("info-key-escapes-store", info(lambda c, s: c.restamp(
        s, meta_edit=lambda m: m["files"].update({"part0/../../x.npy": "0" * 64}))),
         ["files lists 'part0/../../x.npy', which is not a file of this store"]),
    Case("info-unknown-array", info(lambda c, s: c.restamp(
        s, meta_edit=lambda m: m["arrays"].update(evil={"dtype": "<i8", "shape": []}))),
         ["arrays lists 'evil', which a temporal store does not hold"]),
    Case("info-src-out-of-range", info(lambda c, s: c.restamp(s, _edited(s, "part1/src.npy",
                                                                        lambda a: _set(a, 0, 80)))),
         ["part 1", "src.npy holds 80, outside [0, 80)", "rewrite the store"]),
    Case("info-t-nan", info(lambda c, s: c.restamp(s, _edited(s, "part0/t.npy", lambda a: _set(a, 3, np.nan)))),
         ["part 0", "t.npy holds NaN or inf"]),
    Case("info-eid-unsorted", info(lambda c, s: c.restamp(s, _edited(s, "part0/eid.npy", lambda a: a.__setitem__(
        slice(0, 2), a[1::-1])))), ["part 0", "eid.npy is not strictly ascending"]),
    Case("info-src-shorter", info(lambda c, s: c.restamp(s, {"part0/src.npy": part_array(s, "part0/src.npy")[:-1]})),
         ["part 0", "src.npy has", "one per event in eid.npy"]),
    Case("info-ids-not-a-permutation", info(lambda c, s: c.restamp(
        s, _edited(s, "orig_to_new.npy", lambda a: _set(a, 0, a[1])))), ["orig_to_new.npy is not a permutation"]),
    Case("info-node-offsets-edited", info(lambda c, s: c.restamp(
        s, meta_edit=lambda m: m.update(node_offsets=[0, m["node_offsets"][1] + 1, m["num_nodes"]]))),
         ["stats.nodes_per_part disagrees with node_offsets"]),
    Case("info-indptr-broken", info(lambda c, s: c.restamp(s, _edited(s, "part1/indptr.npy", lambda a: _set(
        a, -1, a[-1] + 1))), kind="static"), ["part 1", "indptr.npy is not a CSR row pointer"]),
    Case("info-halo-owns", info(lambda c, s: c.restamp(s, _edited(s, "part0/halo_ids.npy", lambda a: _set(
        a, 0, 0))), kind="static"), ["part 0", "halo_ids.npy holds a node the part owns"]),
    Case("info-of-a-file-that-is-no-dataset", lambda c: ["info", c.file("s.json", "{}")], ["s.json:1", "expected 3 fields"]),
    Case("partition-a-store", lambda c: ["partition", str(c.store("static")), "--parts", "3", "--out", c.out],
         ["is a partition store: partition the graph it was made from"], loads=False),
    # ---- gnndist's own outputs given as data: said what they are
    Case("train-on-a-checkpoint-folder", lambda c: ["train", _saved_checkpoint(c), "--task", "link"],
         ["ck is a gnndist checkpoint folder (gnndist predict CHECKPOINT DATA uses it; gnndist info describes it), "
          "not a dataset"]),
    Case("train-on-a-checkpoint-file", lambda c: ["train", _saved_checkpoint(c) + "/epoch-0001.pt", "--task", "link"],
         ["ck/epoch-0001.pt is a gnndist checkpoint file (gnndist predict takes its folder), not a dataset"]),
    Case("partition-a-metrics-file", lambda c: ["partition", c.file("m.json", json.dumps(
        {"gnndist": {"version": "0", "kind": "metrics"}, "epochs": []})), "--parts", "2", "--out", c.out],
         ["m.json is a gnndist metrics file (gnndist plot draws it), not a dataset"]),
    Case("datasets-of-a-store", lambda c: ["datasets", str(c.store("static"))],
         ["is a gnndist partition store (gnndist train and predict take it as DATA; gnndist info describes it), "
          "not a dataset"]),
    Case("info-of-test-metrics", lambda c: ["info", c.file("t.json", json.dumps(
        {"gnndist": {"version": "0", "kind": "metrics"}, "test": {"ap": 0.5}}))],
         ["t.json is the test metrics of gnndist predict, not a dataset"]),
    # ---- checkpoints
    Case("resume-empty-checkpoint", _resume(lambda b: b""),
         ["ckpt/epoch-0001.pt", "cannot read checkpoint", "it is empty (0 bytes)"]),
    Case("resume-truncated-checkpoint", _resume(lambda b: b[:len(b) // 2]),
         ["ckpt/epoch-0001.pt", "it is truncated or not a torch file"]),
    Case("resume-checkpoint-without-training-state", _resume(lambda b: b),  # {"format", "epoch", "w"} only
         ["ckpt/epoch-0001.pt is not a whole training checkpoint: it lacks config, model, optimizer, node_state, "
          "rng, history, best"]),
    # ---- train and demo flags: refused before any data is read
    flags_case("train-seed-and-seeds", "link", ["--seeds", "0,1", "--seed", "3"],
               ["--seed and --seeds together: --seeds runs one training per seed; give one of them"]),
    flags_case("train-seed-negative-link", "link", ["--seed", "-1"], ["--seed must be an integer from 0 to 2**63-1, got -1"]),
    flags_case("train-seed-negative-node", "node", ["--seed", "-1"], ["--seed must be an integer from 0 to 2**63-1, got -1"]),
    flags_case("train-seed-2-to-63", "node", ["--seed", str(2**63)], ["--seed must be", f"got {2**63}"]),
    flags_case("train-seed-not-int", "link", ["--seed", "1e23"], ["--seed", "invalid int value: '1e23'"]),
    flags_case("train-epochs-zero", "link", ["--epochs", "0"], ["--epochs must be an integer from 1", "got 0"]),
    flags_case("train-batch-size-negative", "node", ["--batch-size", "-5"], ["--batch-size must be", "got -5"]),
    flags_case("train-patience-zero", "node", ["--patience", "0"], ["--patience must be an integer from 1", "got 0"]),
    flags_case("train-lr-inf-node", "node", ["--lr", "inf"], ["--lr must be a finite number > 0, got inf"]),
    flags_case("train-lr-nan-link", "link", ["--lr", "nan"], ["--lr must be a finite number > 0, got nan"]),
    flags_case("train-lr-word", "link", ["--lr", "fast"], ["--lr", "invalid float value: 'fast'"]),
    flags_case("train-weight-decay-nan", "node", ["--weight-decay", "nan"],
               ["--weight-decay must be a finite number >= 0, got nan"]),
    flags_case("train-dropout-nan", "node", ["--dropout", "nan"], ["--dropout must be a finite number >= 0 and < 1"]),
    flags_case("train-dropout-one", "node", ["--dropout", "1"], ["--dropout must be", "< 1, got 1.0"]),
    flags_case("train-clip-grad-nan", "link", ["--clip-grad", "nan"], ["--clip-grad must be a finite number > 0"]),
    flags_case("train-cache-size-nan-link", "link", ["--cache-size", "nan"], ["--cache-size must be a finite number"]),
    flags_case("train-cache-size-inf-2-ranks", "node", ["--nproc", "2", "--cache", "presample", "--cache-size", "inf"],
               ["--cache-size must be a finite number >= 0, got inf"]),
    flags_case("train-fanouts-overflow", "node", ["--fanouts", "1000000000000000000000"],
               ["--fanouts must be", "each from 1 to 2**63-1 or -1", "1000000000000000000000"]),
    flags_case("train-fanouts-zero", "node", ["--fanouts", "5,0"], ["--fanouts must be", "got [5, 0]"]),
    flags_case("train-fanouts-word", "node", ["--fanouts", "5,x"], ["--fanouts", "expected comma-separated integers"]),
    flags_case("train-fanouts-length-mismatch", "node", ["--fanouts", "5,5", "--eval-fanouts", "5"],
               ["--eval-fanouts needs 2 values", "got 1"]),
    flags_case("train-hidden-zero", "node", ["--hidden", "0"], ["--hidden must be an integer from 1"]),
    flags_case("train-memory-dim-zero", "link", ["--memory-dim", "0"], ["--memory-dim must be an integer from 1"]),
    flags_case("train-seeds-repeated", "node", ["--seeds", "1,1"], ["--seeds must be distinct seeds, got [1, 1]"]),
    flags_case("train-seeds-negative", "link", ["--seeds=-1,2"], ["--seeds must be an integer from 0 to 2**63-1"]),
    flags_case("train-seeds-gap", "link", ["--seeds", "1,,2"], ["--seeds", "expected comma-separated integers"]),
    flags_case("train-seeds-with-checkpoint", "link", ["--seeds", "1,2", "--checkpoint", "ck"],
               ["--seeds runs several trainings; it takes no --checkpoint"]),
    flags_case("train-nproc-zero", "link", ["--nproc", "0"], ["--nproc must be an integer from 1", "got 0"]),
    Case("train-nproc-above-nodes", train("node", "--nproc", "100000"),
         ["--nproc 100000 is more ranks than the data has nodes", "each rank owns at least one node"]),
    flags_case("train-link-flag-on-node", "node", ["--memory-dim", "8"],
               ["--memory-dim applies to --task link only (this run is --task node)"]),
    flags_case("train-node-flag-on-link", "link", ["--fanouts", "5"],
               ["--fanouts applies to --task node only (this run is --task link)"]),
    flags_case("train-model-of-the-other-task", "node", ["--model", "tgn"], ["--task node supports --model"]),
    Case("train-model-of-the-other-kind", lambda c: ["train", *STATIC, "--model", "tgn", "--quiet"],
         ["--model tgn trains on temporal graphs; DATA is a static graph: use --model sage, gcn, gat"], loads=False),
    Case("train-model-of-the-other-kind-link", lambda c: ["train", *TEMPORAL, "--model", "gat", "--quiet"],
         ["--model gat trains on static graphs; DATA is a temporal graph: use --model tgn"], loads=False),
    flags_case("train-cache-size-without-cache", "link", ["--cache-size", "0.5"],
               ["--cache-size needs a cache: give --cache degree, presample or adaptive"]),
    flags_case("train-cache-size-with-no-cache", "node", ["--cache", "none", "--cache-size", "0.5"],
               ["--cache-size needs a cache: give --cache degree, presample or adaptive"]),
    Case("train-outputs-the-same-path", lambda c: ["train", *TEMPORAL, "--quiet", "--checkpoint", str(c.tmp / "o"),
                                                   "--metrics-out", str(c.tmp / "o")],
         ["--metrics-out and --checkpoint are the same path", "give each output a place of its own"], loads=False),
    Case("train-checkpoint-symlink-loop", lambda c: (c.link("b", "a"), c.link("a", "b"), [
        "train", *TEMPORAL, "--quiet", "--checkpoint", str(c.tmp / "a")])[2],
         ["--checkpoint ", "/a: its symbolic links loop"], loads=False),
    Case("train-outputs-nested", lambda c: ["train", *TEMPORAL, "--quiet", "--checkpoint", str(c.tmp / "o"),
                                            "--log-dir", str(c.tmp / "o" / "tb")],
         ["--checkpoint and --log-dir are nested paths"], loads=False),
    Case("train-store-with-dataset-flags", lambda c: ["train", str(c.store()), "--nproc", "2", "--num-nodes", "5",
                                                      "--quiet"], ["--num-nodes applies to a dataset", "is a partition store"]),
    Case("train-model-unknown-without-task", lambda c: ["train", *STATIC, "--model", "GAT", "--quiet"],
         ["--model must be one of tgn, jodie, apan, dyrep, tgat (link) or sage, gcn, gat (node), got 'GAT'"], loads=False),
    flags_case("train-checkpoint-every-and-minutes", "node", ["--checkpoint", "ck", "--checkpoint-every", "5",
                                                               "--checkpoint-minutes", "1"],
               ["--checkpoint-every and --checkpoint-minutes: give one of them"]),
    flags_case("train-resume-without-checkpoint", "link", ["--resume"], ["--resume needs --checkpoint DIR"]),
    Case("train-metrics-out-is-the-input", lambda c: ["train", (d := c.file("g.txt", "1 2 3\n4 5 6\n")),
                                                     "--quiet", "--metrics-out", d], ["g.txt", "it is the input"],
         loads=False),
    Case("train-node-on-temporal-data-without-labels", lambda c: ["train", *TEMPORAL, "--task", "node", "--quiet"],
         ["--task node on a temporal graph needs a label per event", "--task node-property"]),
    Case("train-store-of-2-parts-on-1-rank", lambda c: ["train", str(c.store()), "--quiet"],
         ["has 2 parts but 1 rank(s) run; use --nproc 2"], loads=False),
    Case("demo-seed-negative", lambda c: ["demo", "--seed", "-1", "--quiet"],
         ["--seed must be an integer from 0 to 2**63-1, got -1"], loads=False),
    Case("demo-epochs-zero", lambda c: ["demo", "--epochs", "0", "--quiet"], ["--epochs must be an integer from 1"],
         loads=False),
    Case("demo-metrics-out-not-gnndist", lambda c: ["demo", "--quiet", "--metrics-out", c.file("m.json", "{}")],
         ["m.json", "it exists and is not a metrics file gnndist wrote"], loads=False),
    # ---- train flags checked with the data: the generator's seed, and sizes against this machine's memory
    Case("train-data-seed-negative-link", train("link", "--data-seed", "-1"), ["--data-seed", "got -1"]),
    Case("train-data-seed-negative-node", train("node", "--data-seed", "-1"), ["--data-seed", "got -1"]),
    Case("train-memory-dim-too-large", train("link", "--memory-dim", "200000"),
         ["the tgn trainer needs an estimated", "model with gradients and Adam state", "GiB is available",
          "lower --memory-dim"]),
    Case("train-memory-dim-beyond-counting", train("link", "--memory-dim", str(2**62)),
         ["the tgn trainer is too large to allocate on any machine (its sizes overflow 64-bit counts); lower --memory-dim"]),
    Case("info-generator-too-large", lambda c: ["info", "synthetic-static", "--num-nodes", str(10**11), "--num-edges", "10"],
         ["gnndist info: error: not enough memory for gnndist info: Unable to allocate"]),
    Case("partition-generator-too-large", partition(["synthetic-temporal", "--num-nodes", "10", "--num-events",
                                                     str(10**13)]),
         ["not enough memory for gnndist partition: Unable to allocate"]),
    Case("demo-generator-too-large", lambda c: ["demo", "--num-events", str(10**13), "--quiet"],
         ["not enough memory for gnndist demo: Unable to allocate"]),
    Case("train-hidden-too-large", train("node", "--hidden", "1000000000"),
         ["the sage trainer needs an estimated", "lower --hidden"]),
    Case("train-hidden-activations-too-large", lambda c: [  # a model of 3.6 GiB, whose layers' activations the
        "train", "synthetic-static", "--num-nodes", "500", "--num-edges", "3000", "--task", "node", "--epochs", "1",
        "--hidden", "3000000", "--quiet"],  # estimate left out: it grew to 24 GB and was killed without a word
         ["the sage trainer needs an estimated", "a training step's tensors (at most)",
          "lower --hidden, --batch-size or --fanouts"]),
    Case("train-gat-hidden-not-a-multiple-of-heads", train("node", "--model", "gat", "--hidden", "30"),
         ["GAT hidden size 30 must be a multiple of heads 8"]),
]
# torch_geometric's import calls torch.jit.script, which torch 2.13 deprecates: a warning users do not
# see (Python shows DeprecationWarnings raised in __main__ only), which the subprocess runs allow
PYG_IMPORT_WARNING = "`torch.jit.script` is deprecated"
SUBPROCESS = ["csv-form-feed-only", "snap-time-span-overflows", "info-generator-too-large", "planetoid-16tib-array", "data-seed-negative-static", "info-meta-nested",
              "out-is-the-input", "train-memory-dim-too-large", "demo-seed-negative"]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry below `root` and what it holds: sha256 of files, targets of links, kinds of
    others (a fifo is never opened)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir" if p.is_dir() else "special"
    return out


def run_main(argv: Sequence[str]) -> int:
    try:
        return main(list(argv))
    except SystemExit as e:  # argparse's usage errors
        return int(e.code)


def test_the_corpus_is_large_and_ids_are_unique():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)
    assert set(SUBPROCESS) <= {c.id for c in CASES}
    assert sum(c.id.startswith(("train-", "demo-")) for c in CASES) >= 40


def forbid_loading(monkeypatch) -> None:
    """Make every generator and file loader fail the test if called (keeping their signatures,
    which the parser reads its generator flags from)."""
    def refusing(fn):
        @functools.wraps(fn)
        def refuse(*args, **kwargs):
            pytest.fail(f"a case refused by its flags called {fn.__name__}")
        return refuse
    for table in (GENERATORS, FORMATS):
        for name, (fn, text) in list(table.items()):
            monkeypatch.setitem(table, name, (refusing(fn), text))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, bases, tmp_path, capsys, monkeypatch):
    ctx = Ctx(tmp_path / "case", bases)
    ctx.tmp.mkdir()
    monkeypatch.chdir(ctx.tmp)  # relative outputs (--checkpoint ck) land, if at all, where the snapshot sees
    argv = list(case.setup(ctx))
    if not case.loads:
        forbid_loading(monkeypatch)
    before = snapshot(ctx.tmp)
    capsys.readouterr()
    rc = run_main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"gnndist {argv[0]}: error: "), lines[0]
    for s in case.expect:
        assert s in lines[0], (s, lines[0])
    assert snapshot(ctx.tmp) == before  # inputs unchanged, nothing written


@pytest.mark.parametrize("case_id", SUBPROCESS)
def test_bad_input_in_a_subprocess(case_id, bases, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    ctx = Ctx(tmp_path / "case", bases)
    ctx.tmp.mkdir()
    argv = list(case.setup(ctx))
    before = snapshot(ctx.tmp)
    p = subprocess.run([sys.executable, "-m", "gnndist", *argv], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONWARNINGS": f"default,ignore:{PYG_IMPORT_WARNING}:DeprecationWarning"})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr and "Warning" not in p.stderr and p.stdout == ""
    assert all(s in lines[0] for s in case.expect), lines[0]
    assert snapshot(ctx.tmp) == before


# ---------------------------------------------------------------- outputs (gnndist.outputs)

def png(path: Path, software: str = SOFTWARE) -> Path:
    """A 1x1 PNG with a tEXt Software chunk, written by hand (chunks: length, type, data, crc)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
                     + chunk(b"tEXt", b"Software\0" + software.encode()) + chunk(b"IDAT", zlib.compress(b"\0\0"))
                     + chunk(b"IEND", b""))
    return path


def test_metrics_are_stamped_and_only_gnndist_metrics_are_replaced(tmp_path):
    m = tmp_path / "m.json"
    assert check_output(m, "metrics") == m
    write_metrics(m, {"test": {"ap": 0.9}})
    written = json.loads(m.read_text())
    assert written["gnndist"]["kind"] == "metrics" and written["test"] == {"ap": 0.9}
    write_metrics(m, {"test": {"ap": 0.8}})  # its own file: replaced
    assert json.loads(m.read_text())["test"] == {"ap": 0.8}
    for content in ('{"test": 1}', "[1, 2]", "not json", '{"gnndist": {"kind": "plot"}}', "[" * 100_000):
        m.write_text(content)
        with pytest.raises(GnndistError, match=f"refusing to write the metrics file to {m}: it exists and is not a "
                                               "metrics file gnndist wrote"):
            write_metrics(m, {"x": 1})
        assert m.read_text() == content
    (tmp_path / "d").mkdir()
    with pytest.raises(GnndistError, match="it exists and is a folder; choose another --metrics-out"):
        check_output(tmp_path / "d", "metrics")


def test_outputs_never_touch_inputs(tmp_path):
    data = tmp_path / "uci.txt"
    data.write_text("1 2 3\n")
    store = tmp_path / "store"
    partition_graph(load(*TEMPORAL[:1], num_nodes=40, num_events=300), 2, out=store)
    (tmp_path / "link.json").symlink_to(data)
    os.link(data, tmp_path / "hard.json")
    (tmp_path / "ck").mkdir()
    os.link(data, tmp_path / "ck" / checkpoint_name(1))
    before = snapshot(tmp_path)
    for path, kind, inputs, msg in [
        (data, "metrics", [data], "it is the input"),
        (tmp_path / "link.json", "metrics", [data], "it is the input"),
        (tmp_path / "hard.json", "metrics", [data], "it is a hard link to the input"),
        (store / "meta.json", "metrics", [store], "it is inside the input folder"),
        (store / "part0", "checkpoint", [store], "it is inside the input folder"),
        (tmp_path / "ck", "checkpoint", [data], "it holds a hard link to the input"),
        (tmp_path, "log_dir", [data], "it contains the input"),
        (store / "plot.png", "plot", [store, None, "synthetic-temporal"], "inside the input folder"),
    ]:
        with pytest.raises(GnndistError, match=msg) as e:
            check_output(path, kind, inputs)
        assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert snapshot(tmp_path) == before


def test_checkpoint_log_and_plot_folders_hold_only_gnndist_files(tmp_path):
    ck = tmp_path / "ck"
    for sub in ("rank1/.replaced", ".replaced"):
        (ck / sub).mkdir(parents=True)
    for rel in ("epoch-0002.pt", "rank1/epoch-0003.pt", ".epoch-0004.pt.tmp-ab_12", ".replaced/epoch-0001.pt",
                "rank1/.replaced/epoch-0002.pt"):
        (ck / rel).write_bytes(b"")
    assert check_output(ck, "checkpoint") == ck
    (ck / "rank1" / "notes.txt").write_text("mine")
    with pytest.raises(GnndistError, match="it holds rank1/notes.txt, which is not a gnndist checkpoint file; "
                                           "choose another --checkpoint"):
        check_output(ck, "checkpoint")
    logs = tmp_path / "logs"
    (logs / "run1").mkdir(parents=True)
    (logs / "run1" / "events.out.tfevents.1700000000.host.1.0").write_bytes(b"")
    assert check_output(logs, "log_dir") == logs
    (logs / "events.out.tfevents.x").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(GnndistError, match="it holds events.out.tfevents.x, which is not a TensorBoard event file"):
        check_output(logs, "log_dir")
    assert check_output(png(tmp_path / "mine.png"), "plot")
    for other in (png(tmp_path / "theirs.png", "matplotlib version 3.9"), tmp_path / "ck" / "epoch-0002.pt"):
        with pytest.raises(GnndistError, match="it exists and is not a PNG that gnndist wrote"):
            check_output(other, "plot")


# ---------------------------------------------------------------- checkpoints (gnndist.checkpoint)

def test_checkpoints_keep_the_last_two_complete_epochs(tmp_path):
    d = tmp_path / "ck"
    for e in range(1, 5):
        checkpoint.save(d, {"epoch": e, "w": torch.full((3,), float(e))})
    assert checkpoint.epochs(d) == [3, 4] and sorted(os.listdir(d)) == [checkpoint_name(3), checkpoint_name(4)]
    assert checkpoint.load(d)["epoch"] == 4 and torch.equal(checkpoint.load(d, 3)["w"], torch.full((3,), 3.0))
    newest = d / checkpoint_name(4)
    good = newest.read_bytes()
    for damaged, why in ((good[: len(good) // 2], "it is truncated or not a torch file"), (b"", "it is empty")):
        newest.write_bytes(damaged)
        assert checkpoint.epochs(d) == [3]
        with pytest.raises(GnndistError, match=f"cannot read checkpoint {newest}: {why}.*; epoch 3 is complete: "
                                               "move epoch-0004.pt away to resume from it"):
            checkpoint.load(d)
    assert checkpoint.load(d, 3)["epoch"] == 3
    with pytest.raises(GnndistError, match="holds no checkpoint of epoch 7 \\(it holds epochs 3, 4\\)"):
        checkpoint.load(d, 7)
    checkpoint.save(d, {"epoch": 1, "w": torch.zeros(3)})  # a fresh run in the same folder replaces the old one
    assert checkpoint.epochs(d) == [1]
    (d / checkpoint_name(2)).write_bytes(b"")  # an incomplete older epoch is not kept in place of a whole one
    checkpoint.save(d, {"epoch": 3, "w": torch.zeros(3)})
    assert checkpoint.epochs(d) == [1, 3] and not (d / checkpoint_name(2)).exists()
    with pytest.raises(GnndistError, match="no checkpoint to resume from in"):
        checkpoint.load(tmp_path / "none")


def test_a_failed_run_loses_no_checkpoint(tmp_path):
    """`checkpoint.run`: an earlier run's epochs survive a run that replaces them and fails, in
    place where it saved nothing, in .replaced (named by its error) where it did; a run that
    ends well drops them; a later run without --resume replaces neither the stopped run's epochs
    nor the ones it replaced (it is refused)."""
    d = tmp_path / "ck"
    for e in (2, 3):
        checkpoint.save(d, {"epoch": e, "w": torch.full((3,), float(e))})
    before = {f.name: f.read_bytes() for f in d.iterdir()}

    def failing_run(saves: int, error: BaseException) -> None:
        with checkpoint.run(d, resume=False):
            for e in range(1, saves + 1):
                checkpoint.save(d, {"epoch": e, "w": torch.zeros(3)})
            raise error

    with pytest.raises(GnndistError, match="^the loss became nan$"):
        failing_run(0, GnndistError("the loss became nan"))
    assert {f.name: f.read_bytes() for f in d.iterdir()} == before
    with pytest.raises(GnndistError, match=f"^the loss became nan \\(an earlier run's checkpoint is kept in "
                                           f"{d}/.replaced\\)$"):
        failing_run(1, GnndistError("the loss became nan"))
    assert checkpoint.epochs(d) == [1] and {f.name: f.read_bytes() for f in (d / ".replaced").iterdir()} == before
    assert check_output(d, "checkpoint") == d
    stopped = {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
    for call in (lambda: failing_run(1, GnndistError("x")), lambda: checkpoint.check_folder(d, 0, resume=False)):
        with pytest.raises(GnndistError, match=f"^{d} holds epoch 1 of a run that stopped while replacing an earlier "
                                               f"run's \\(kept in {d}/.replaced\\): --resume continues the stopped run; "
                                               f"to start anew, delete one of them, or choose another --checkpoint$"):
            call()  # which of the two runs to keep is the user's call: a new run replaces neither
        assert {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()} == stopped
        assert {f.name: f.read_bytes() for f in (d / ".replaced").iterdir()} == before
    checkpoint.check_folder(d, 0, resume=True)
    with pytest.raises(KeyboardInterrupt, match=f"^an earlier run's checkpoint is kept in {d}/.replaced$"):
        with checkpoint.run(d, resume=True):  # an interrupt stays one, and says where the files are
            checkpoint.save(d, {"epoch": 2, "w": torch.zeros(3)})
            raise KeyboardInterrupt()
    assert checkpoint.epochs(d) == [1, 2] and {f.name: f.read_bytes() for f in (d / ".replaced").iterdir()} == before
    with checkpoint.run(d, resume=True):  # resuming the failed run keeps what it replaces until it ends
        assert checkpoint.epochs(d) == [1, 2] and (d / ".replaced").is_dir()
        checkpoint.save(d, {"epoch": 3, "w": torch.ones(3)})
    assert checkpoint.epochs(d) == [2, 3] and not (d / ".replaced").exists()
    with checkpoint.run(d, resume=False):
        assert checkpoint.epochs(d) == [] and checkpoint.epochs(d / ".replaced") == [2, 3]
        checkpoint.save(d, {"epoch": 1, "w": torch.ones(3)})
    assert sorted(os.listdir(d)) == [checkpoint_name(1)]


def test_resuming_a_node_checkpoint_says_whose_it_is(tmp_path):
    """A node run's epochs lack what --resume needs, all alike: the line says whose they are, and
    gives no advice to move the newest away (the older one lacks the same)."""
    for e in (1, 2):
        checkpoint.save(tmp_path, {"epoch": e, "config": {"task": "node"}, "model": {}})
    with pytest.raises(GnndistError, match=f"^{tmp_path}/epoch-0002.pt is not a whole training checkpoint \\(a node "
                                           f"run's, for gnndist predict\\): it lacks node_state, rng$"):
        checkpoint.load(tmp_path, needs=("model", "node_state", "rng"))


def test_a_checkpoint_folder_of_another_layout_is_refused(tmp_path, capsys):
    """A run into a folder whose checkpoint was written in the other layout (per-rank folders of a
    W-rank link run, or one folder of epochs), or that holds a rank's folder the run has no rank
    for, would leave the other run's files beside its own (and `gnndist predict` would read
    rank0/): refused before anything starts, nothing changed. A host of a multi-host run holds
    only its own ranks' folders: that is no other layout."""
    ranks, three, flat, host1 = (tmp_path / n for n in ("ranks", "three", "flat", "host1"))
    for folder, held in ((ranks, (0, 1)), (three, (0, 1, 2)), (host1, (2, 3))):
        for r in held:
            checkpoint.save(folder / f"rank{r}", {"epoch": 1, "w": torch.zeros(3)})
    checkpoint.save(flat / ".replaced", {"epoch": 2, "w": torch.zeros(3)})  # set-aside epochs count too
    snapshot = {p: sorted(os.listdir(p)) for p in (ranks, ranks / "rank0", flat, flat / ".replaced", three)}
    per_rank = f"{ranks} holds the per-rank folders of a run on several ranks \\(rank0/, rank1/\\), and this run writes "
    one = (f"{flat} holds a checkpoint written as one folder of epochs \\(by one process, or by a node run\\), and "
           f"this run writes ")
    for folder, rank_folders, resume, message in (
            (ranks, 0, False, per_rank + "one folder of epochs"),
            (three, 2, False, f"{three} holds rank2/ of a run on more ranks, and this run writes a folder per "
                              f"rank for 2 ranks"),
            (flat, 2, False, one + "a folder per rank for 2 ranks")):
        with pytest.raises(GnndistError, match=f"^{message}: choose another --checkpoint, or delete that one$"):
            checkpoint.check_folder(folder, rank_folders, resume)
    for folder, rank_folders in ((ranks, 2), (ranks, 4), (host1, 4), (three, 3)):  # host 0 or host 1 of 4 ranks
        for resume in (False, True):
            checkpoint.check_folder(folder, rank_folders, resume)
    checkpoint.check_folder(flat, 0, resume=True)
    for argv in (["train", *TEMPORAL, "--task", "link", "--checkpoint", str(ranks), "--quiet"],
                 ["train", *STATIC, "--task", "node", "--checkpoint", str(ranks), "--quiet"],
                 ["train", *TEMPORAL, "--task", "link", "--nproc", "2", "--checkpoint", str(flat), "--quiet"],
                 ["train", *TEMPORAL, "--task", "link", "--nproc", "2", "--checkpoint", str(three), "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gnndist train: error: {argv[-2]} holds ") and "\n" not in err
    assert {p: sorted(os.listdir(p)) for p in snapshot} == snapshot


def test_replacing_a_checkpoint_says_so_once(tmp_path, capsys, monkeypatch):
    """A run without --resume that sets an earlier run's epochs aside says so on the first rank
    of each host (what it replaces, where it keeps it, and how to continue it instead); the
    host's other ranks and a resumed run say nothing."""
    d = tmp_path / "ck"
    for e in (2, 3):
        checkpoint.save(d, {"epoch": e, "w": torch.zeros(3)})
    with checkpoint.run(d, resume=True):
        pass
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(GnndistError):
        with checkpoint.run(d, resume=False):
            raise GnndistError("stop")  # before its first save: the epochs go back
    assert capsys.readouterr().err == "" and checkpoint.epochs(d) == [2, 3]
    monkeypatch.undo()
    with checkpoint.run(d, resume=False):
        checkpoint.save(d, {"epoch": 1, "w": torch.ones(3)})
    assert capsys.readouterr().err == (f"replacing the checkpoint of an earlier run in {d} (epochs 2, 3): kept in "
                                       f"{d}/.replaced until this run ends well, then deleted; --resume continues "
                                       f"it instead\n")
    assert checkpoint.epochs(d) == [1] and not (d / ".replaced").exists()
    node = {"epoch": 1, "config": {"task": "node"}}  # a node run's epochs: --resume does not take them
    checkpoint.save(d, node)
    with checkpoint.run(d, resume=False):
        checkpoint.save(d, node)
    assert capsys.readouterr().err == (f"replacing the checkpoint of an earlier run in {d} (epoch 1): kept in "
                                       f"{d}/.replaced until this run ends well, then deleted\n")
    with pytest.raises(GnndistError):
        with checkpoint.run(d, resume=False):
            checkpoint.save(d, node)
            raise GnndistError("stop")
    with pytest.raises(GnndistError, match=f"^{d} holds epoch 1 of a run that stopped while replacing an earlier "
                                           f"run's \\(kept in {d}/.replaced\\): to start anew, delete one of them, "
                                           f"or choose another --checkpoint$"):
        checkpoint.check_folder(d, 0, resume=False)


def test_a_replaced_checkpoint_survives_every_later_failure(tmp_path):
    """What `checkpoint.run` must not lose: epochs moved back by hand beside the empty
    .replaced they came from; those of a W-rank run's rank whose run failed before its first
    save (kept in .replaced, not put back: the other ranks may hold the new run's); those a
    --resume of a failed run finds in .replaced; and the note on an OSError (a full disk)."""
    d = tmp_path / "ck"
    checkpoint.save(d, {"epoch": 4, "w": torch.ones(3)})
    before = {f.name: f.read_bytes() for f in d.iterdir()}

    def run(resume=False, restore=True, saves=0, error=GnndistError("stop")):
        with checkpoint.run(d, resume=resume, restore=restore):
            for e in range(1, saves + 1):
                checkpoint.save(d, {"epoch": e, "w": torch.zeros(3)})
            raise error

    with pytest.raises(GnndistError):
        run(saves=1)
    for f in (d / ".replaced").iterdir():  # the advice of docs/guide/troubleshooting.md: move them back
        os.replace(f, d / f.name)
    (d / checkpoint_name(1)).unlink()
    with pytest.raises(GnndistError):  # beside the empty .replaced: kept, and put back
        run()
    assert {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()} == before
    with pytest.raises(GnndistError, match=f"^stop \\(an earlier run's checkpoint is kept in {d}/.replaced\\)$"):
        run(restore=False)
    assert checkpoint.epochs(d) == [] and {f.name: f.read_bytes() for f in (d / ".replaced").iterdir()} == before
    with pytest.raises(GnndistError, match="an earlier run's checkpoint is kept in"):  # nothing put back
        run(resume=True)
    assert checkpoint.epochs(d) == [] and checkpoint.epochs(d / ".replaced") == [4]
    from gnndist.predict import SavedModel
    with pytest.raises(GnndistError, match=f"^no checkpoint in {d} .*; an earlier run's checkpoint is kept in {d}/.replaced$"):
        SavedModel.load(d)
    with pytest.raises(GnndistError, match="^\\[Errno 28\\] No space left on device \\(an earlier run's checkpoint"):
        run(resume=True, error=OSError(28, "No space left on device"))
    assert checkpoint.epochs(d / ".replaced") == [4]


def test_train_that_fails_keeps_the_checkpoint_it_replaces(tmp_path, monkeypatch, capsys):
    """`gnndist train --checkpoint` into a folder of an earlier run, failing in its second epoch."""
    from gnndist.temporal.trainer import LinkTrainer
    ck = tmp_path / "ck"
    argv = ["train", *TEMPORAL, "--epochs", "2", "--checkpoint", str(ck), "--quiet"]
    assert main(argv) == 0
    before = {f.name: f.read_bytes() for f in ck.iterdir()}
    train_epoch = LinkTrainer.train_epoch

    def failing(self, epoch):
        if epoch == 2:
            raise GnndistError("the training loss became nan; try a smaller --lr")
        return train_epoch(self, epoch)

    monkeypatch.setattr(LinkTrainer, "train_epoch", failing)
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith(f"(an earlier run's checkpoint is kept in {ck}/.replaced)")
    assert {f.name: f.read_bytes() for f in (ck / ".replaced").iterdir()} == before
    assert checkpoint.epochs(ck) == [1]

    def interrupted(self, epoch):  # Ctrl-C in the second epoch of a run replacing them again
        if epoch == 2:
            raise KeyboardInterrupt
        return train_epoch(self, epoch)

    monkeypatch.setattr(LinkTrainer, "train_epoch", interrupted)
    assert main([*argv, "--resume"]) == 130
    assert capsys.readouterr().err.strip() == f"gnndist: interrupted (an earlier run's checkpoint is kept in {ck}/.replaced)"
    assert {f.name: f.read_bytes() for f in (ck / ".replaced").iterdir()} == before


def test_ctrl_c_on_two_ranks_is_one_line_naming_the_kept_checkpoint(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during `--nproc 2` training
    that replaces an earlier run's checkpoint: exit 130, one line naming where it is kept."""
    ck = tmp_path / "ck"
    env = {**os.environ, "GNNDIST_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "gnndist", "train", *TEMPORAL, "--nproc", "2", "--checkpoint", str(ck), "--quiet"]
    assert subprocess.run([*argv, "--epochs", "1"], env=env, capture_output=True).returncode == 0
    p = subprocess.Popen([*argv, "--epochs", "100000", "--patience", "100000"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (ck / "rank0" / checkpoint_name(2)).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"gnndist: interrupted (an earlier run's checkpoint is kept in "
                                            f"{ck}/rank0/.replaced, and the other ranks' in theirs)"), err[-3000:]
    assert "Traceback" not in err and checkpoint.epochs(ck / "rank1" / ".replaced") == [1]


def test_an_interrupted_rank_leaves_its_note_at_once(tmp_path, monkeypatch):
    """A launched rank's SIGINT handler leaves the note on the replaced checkpoint for `launch`
    before anything unwinds (torch's launcher may stop the rank meanwhile; CI once lost both
    ranks' notes); the interrupt itself carries the same note."""
    d, errdir = tmp_path / "ck", tmp_path / "err"
    errdir.mkdir()
    checkpoint.save(d, {"epoch": 1, "w": torch.zeros(3)})
    monkeypatch.setenv(glaunch.ERRDIR, str(errdir))
    monkeypatch.setenv("RANK", "1")
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt, match=f"^an earlier run's checkpoint is kept in {d}/.replaced$"):
            with checkpoint.run(d, resume=False, restore=False):
                checkpoint.save(d, {"epoch": 1, "w": torch.ones(3)})
                glaunch._interrupt_once(signal.SIGINT, None)
                raise AssertionError("not interrupted")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (errdir / "0" / "interrupted-1.note").read_text() == f"an earlier run's checkpoint is kept in {d}/.replaced"
    assert checkpoint.interrupt_note() == ""  # out of the block: nothing to say


def test_ranks_that_crashed_between_writes_share_an_older_epoch(tmp_path):
    """Rank 0 wrote epoch 3, rank 1 died before it: both still hold epoch 2, which they agree on."""
    for rank, last in ((0, 3), (1, 2)):
        for e in range(1, last + 1):
            checkpoint.save(tmp_path / f"rank{rank}", {"epoch": e, "rank": rank})
    held = [set(checkpoint.epochs(tmp_path / f"rank{r}")) for r in (0, 1)]
    common = max(held[0] & held[1])
    assert held == [{2, 3}, {1, 2}] and common == 2
    assert [checkpoint.load(tmp_path / f"rank{r}", common)["rank"] for r in (0, 1)] == [0, 1]


def test_rng_state_round_trip():
    state = checkpoint.rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    checkpoint.set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]
    assert ("cuda" in state) == torch.cuda.is_available()  # absent on a CPU-only machine, and that is fine
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    checkpoint.set_rng_state(torch.load(buf, weights_only=True))
    assert torch.equal(torch.rand(3), first[0])



# ---------------------------------------------------------------- library calls with arguments of the wrong type

def _library_calls():
    """(id, call, expected message part): library calls a script can get wrong, each refused
    with a GnndistError before any work (a part count of 1.5 used to end the process by SIGFPE)."""
    from gnndist import LinkConfig, NodeConfig
    from gnndist.static.trainer import train_node
    from gnndist.temporal.fit import train_link
    g, tg = load(STATIC[0], num_nodes=200, num_edges=600), load(TEMPORAL[0], num_nodes=80, num_events=800)
    return [
        ("parts-float", lambda: partition_graph(g, 1.5), "--parts must be an integer, got 1.5"),
        ("parts-str", lambda: partition_graph(g, "2"), "--parts must be an integer, got '2'"),
        ("parts-none", lambda: partition_graph(g, None), "--parts must be an integer, got None"),
        ("graph-name", lambda: partition_graph("synthetic-static", 2), "partition_graph takes a Graph or a TemporalGraph"),
        ("time-windows-float", lambda: partition_graph(tg, 2, time_windows=1.5), "--time-windows must be an integer, got 1.5"),
        ("imbalance-tol-str", lambda: partition_graph(g, 2, imbalance_tol="1.1"), "--imbalance-tol must be from 1.001"),
        ("recency-str", lambda: partition_graph(tg, 2, recency="1"), "--recency must be a finite number >= 0"),
        ("replicate-hubs-str", lambda: partition_graph(tg, 2, replicate_hubs="3"), "--replicate-hubs must be an integer, got '3'"),
        ("out-int", lambda: partition_graph(g, 2, out=5), "--out must be a path, got 5"),
        ("nproc-float", lambda: train_link(tg, nproc=1.5), "--nproc must be an integer from 1"),
        ("nproc-zero", lambda: train_node(g, nproc=0), "--nproc must be an integer from 1"),
        ("data-int", lambda: train_link(42), "the data must be a Graph, a TemporalGraph, a DataSource"),
        ("link-cfg-of-node", lambda: train_link(tg, NodeConfig()), "cfg must be of type LinkConfig, got NodeConfig"),
        ("node-cfg-none", lambda: train_node(g, None), "cfg must be of type NodeConfig, got NoneType"),
        ("node-cfg-unknown-field", lambda: NodeConfig.for_model("gcn", foo=1), "NodeConfig has no field foo"),
        ("link-cache-size-without-cache", lambda: LinkConfig(cache_size=0.5),
         "--cache-size needs a cache: give --cache degree, presample or adaptive"),
        ("node-cache-size-without-cache", lambda: NodeConfig.for_model("sage", cache="none", cache_size=0.5),
         "--cache-size needs a cache: give --cache degree, presample or adaptive"),
        ("outputs-dict", lambda: train_link(tg, outputs={"checkpoint": "x"}), "outputs must be of type Outputs"),
        ("train-mask-empty", lambda: train_node(dataclasses.replace(g, train_mask=np.zeros(g.num_nodes, bool))),
         "--task node needs training, validation and test nodes; DATA's train_mask selects none"),
        ("train-mask-empty-on-2-ranks", lambda: train_node(dataclasses.replace(g, train_mask=np.zeros(g.num_nodes, bool)),
                                                           nproc=2),
         "--task node needs training, validation and test nodes; DATA's train_mask selects none"),
        ("masks-missing-on-2-ranks", lambda: train_node(Graph(g.indptr, g.indices, x=g.x, y=g.y), nproc=2),
         "--task node needs node features, labels and split masks; DATA has no train_mask, val_mask, test_mask (a "
         "split comes with the data: a Planetoid folder has one; a .npz takes train_mask, val_mask and test_mask "
         "arrays)"),
    ]


LIBRARY_CALLS = _library_calls()


@pytest.mark.parametrize("call, expect", [c[1:] for c in LIBRARY_CALLS], ids=[c[0] for c in LIBRARY_CALLS])
def test_library_call_with_a_wrong_argument_is_one_gnndist_error(call, expect, capfd):
    with pytest.raises(GnndistError) as e:
        call()
    assert expect in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "partitioning" not in capfd.readouterr().err  # the 2-rank cases: refused before the data is split


def test_a_loss_that_becomes_nan_names_the_scale_of_the_data(monkeypatch):
    """Times or edge features too large for float32 arithmetic make a NaN loss as a too large
    --lr does: the line gives both causes, with the data's time span and largest edge feature."""
    from gnndist import LinkConfig
    from gnndist.temporal import fit, split_step
    tg = load(TEMPORAL[0], num_nodes=80, num_events=800)
    real = split_step.batch_loss
    monkeypatch.setattr(split_step, "batch_loss", lambda *a: real(*a) * float("nan"))
    with pytest.raises(GnndistError) as e:
        fit.train_link(tg, LinkConfig(epochs=1, quiet=True))
    span, feat = float(tg.t.max() - tg.t.min()), float(np.abs(tg.edge_feat).max())
    assert str(e.value) == (f"the training loss became nan; try a smaller --lr, or scale the data (this rank's: times "
                            f"spanning {span:.3g}, edge features up to {feat:.3g} in size)")


def test_demo_tells_a_bad_timeout_before_it_makes_data(monkeypatch, capsys):
    monkeypatch.setenv("GNNDIST_TIMEOUT", "abc")
    capsys.readouterr()
    assert main(["demo", "--num-nodes", "80", "--num-events", "800", "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gnndist demo: error: GNNDIST_TIMEOUT must be a number of seconds from 1 to 86400, got 'abc'"]


def test_a_split_for_ranks_that_fails_names_nproc(tmp_path, monkeypatch, capsys):
    """`train --nproc 3` on 3 nodes of which 2 send events: the partitioner's refusal names
    --nproc, the flag this command has, not partition's --parts."""
    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "g.txt"
    data.write_text("1 2 0\n2 3 1\n")
    capsys.readouterr()
    assert main(["train", str(data), "--nproc", "3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith("so --nproc must be at most the 2 nodes that own events (are an event "
                                         "source), got 3") and "--parts" not in err, err


def test_a_cache_path_that_is_a_file_is_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "cachefile").write_text("mine")
    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "cachefile"))
    capsys.readouterr()
    assert main(["train", *TEMPORAL, "--nproc", "2", "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gnndist train: error: the cache {tmp_path}/cachefile (GNNDIST_CACHE, default ~/.cache/gnndist) "
        f"cannot be a folder: {tmp_path}/cachefile is a file"]
    assert (tmp_path / "cachefile").read_text() == "mine"


def test_a_cache_folder_that_cannot_be_made_is_named(monkeypatch, capsys):
    monkeypatch.setenv("GNNDIST_CACHE", "/proc/gnndist-cache")  # /proc takes no new folder, even from root
    capsys.readouterr()
    assert main(["train", *TEMPORAL, "--nproc", "2", "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gnndist train: error: cannot make the partition cache folder /proc/gnndist-cache/partitions (GNNDIST_CACHE, "
        "default ~/.cache/gnndist): No such file or directory"]
