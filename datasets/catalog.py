"""Datasets by name: where their files come from, and loading one (downloaded on first use).

`load_named(name)` fetches the dataset's files into `data_root()/NAME/` (see `fetch`), reads
them once with their format's reader, checks them (sha256 where the source's file is known
byte for byte, else the published node and event counts), and keeps the graph there as .npy
arrays (`converted/`), which later loads read; a TGB dataset's evaluation protocol goes beside
them (`converted/tgb/`, `tgb.write_protocol`). A file put in that folder by hand is used as
if downloaded.
"""
from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from gnndist.datasets.fetch import MIRROR_ENV, data_root, download, locked, say, verify
from gnndist.datasets.formats import load_csv, load_signed, load_snap
from gnndist.datasets.planetoid import PARTS, load_planetoid
from gnndist.datasets.tgb import SPLIT_FILE, NodeLabels, load_tgb, write_protocol
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph
from gnndist.io import atomic_dir

CONVERTED = "converted"  # the folder, in a dataset's folder, of its graph as arrays
PROTOCOL = "tgb"  # the folder, in a TGB dataset's converted folder, of TGB's split and negatives
FORM_VERSION = 2  # of that folder's layout: a converted folder of another version is made again


@dataclass(frozen=True)
class Remote:
    """One file of a dataset: its URL, and its sha256 where the source's file is known here."""

    url: str
    sha256: Optional[str] = None

    @property
    def name(self) -> str:
        return posixpath.basename(urllib.parse.urlsplit(self.url).path)


@dataclass(frozen=True)
class Named:
    """A dataset by name: its kind, files, what it is and where it comes from."""

    name: str
    kind: str  # "temporal" or "static"
    read: Callable[[str], Union[Graph, TemporalGraph]]  # its reader, given the file (one) or the folder (several)
    files: tuple[Remote, ...]
    size: str  # as its source publishes it
    source: str  # the page that describes it
    licence: str
    paper: str
    nodes: Optional[int] = None  # published counts, checked after reading where no sha256 is known
    events: Optional[int] = None


SNAP_LICENCE = "none stated by SNAP: research use, cite the paper"
JODIE = ("Kumar, Zhang & Leskovec, Predicting Dynamic Embedding Trajectory in Temporal Interaction Networks, "
         "KDD 2019")
PLANETOID = "https://github.com/kimiyoung/planetoid/raw/master/data/"  # PyG's Planetoid reads from here
PLANETOID_PAPER = "Yang, Cohen & Salakhutdinov, Revisiting Semi-Supervised Learning with Graph Embeddings, ICML 2016"
TGB_URL = "https://object-arbutus.alliancecan.ca/swift/v1/14c95234f6cd4a21a47deafe20cce2a7/tgb/"  # TGB 2.3.0's info.py
TGB_PAPER = ("Huang et al., Temporal Graph Benchmark for Machine Learning on Temporal Graphs, NeurIPS 2023 "
             "Datasets and Benchmarks")
TGB_LICENCE = "per dataset, on the TGB website (tgb.complexdatalab.com); TGB's code: MIT"
# sha256 of kimiyoung/planetoid's data files: Cora's and CiteSeer's as the copies here, byte for byte the
# repository's; PubMed's from that repository's git objects (its allx was not in the copy of it seen here)
PLANETOID_SHA256 = {
    "cora": ("23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
             "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
             "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
             "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
             "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
             "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
             "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
             "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875"),
    "citeseer": ("d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
                 "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
                 "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
                 "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
                 "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
                 "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
                 "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
                 "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4"),
    "pubmed": ("fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
               "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
               None,
               "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
               "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
               "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
               "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
               "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5"),
}  # in the order of planetoid.PARTS


def _snap(name: str, file: str, read: Callable[[str], TemporalGraph], size: str, paper: str, nodes: int,
          events: int, page: str) -> Named:
    return Named(name, "temporal", read, (Remote(f"https://snap.stanford.edu/data/{file}"),), size,
                 f"https://snap.stanford.edu/data/{page}.html", SNAP_LICENCE, paper, nodes, events)


def _jodie(name: str, users: int, items: int, events: int, features: str) -> Named:
    return Named(name, "temporal", load_csv, (Remote(f"https://snap.stanford.edu/jodie/{name}.csv"),),
                 f"{users:,} users, {items:,} items, {events:,} events, {features}state labels",
                 "https://snap.stanford.edu/jodie/", "none stated: research use, cite the paper", JODIE,
                 users + items, events)


def _planetoid(name: str, size: str, nodes: int, data_paper: str) -> Named:
    files = tuple(Remote(f"{PLANETOID}ind.{name}.{part}", sha)
                  for part, sha in zip(PARTS, PLANETOID_SHA256[name]))
    return Named(name, "static", load_planetoid, files, size, "https://github.com/kimiyoung/planetoid",
                 "MIT (the Planetoid repository)", f"{PLANETOID_PAPER}; data: {data_paper}", nodes)


def _tgb(name: str, zip_name: str, size: str) -> Named:
    return Named(name, "temporal", load_tgb, (Remote(TGB_URL + zip_name),), size, "https://tgb.complexdatalab.com/",
                 TGB_LICENCE, TGB_PAPER)


CATALOG: dict[str, Named] = {d.name: d for d in (
    _snap("uci", "CollegeMsg.txt.gz", load_snap, "1,899 nodes, 59,835 events (messages, 193 days)",
          "Panzarasa, Opsahl & Carley, Patterns and dynamics of users' behavior and interaction: Network analysis of "
          "an online community, JASIST 2009", 1899, 59835, "CollegeMsg"),
    _snap("email-eu-temporal", "email-Eu-core-temporal.txt.gz", load_snap, "986 nodes, 332,334 events (e-mails, "
          "803 days)", "Paranjape, Benson & Leskovec, Motifs in Temporal Networks, WSDM 2017", 986, 332334,
          "email-Eu-core-temporal"),
    _snap("bitcoin-otc", "soc-sign-bitcoinotc.csv.gz", load_signed, "5,881 nodes, 35,592 events (trust ratings "
          "-10..10)", "Kumar, Spezzano, Subrahmanian & Faloutsos, Edge Weight Prediction in Weighted Signed Networks, "
          "ICDM 2016", 5881, 35592, "soc-sign-bitcoin-otc"),
    _snap("bitcoin-alpha", "soc-sign-bitcoinalpha.csv.gz", load_signed, "3,783 nodes, 24,186 events (trust "
          "ratings -10..10)", "Kumar, Spezzano, Subrahmanian & Faloutsos, Edge Weight Prediction in Weighted Signed "
          "Networks, ICDM 2016", 3783, 24186, "soc-sign-bitcoin-alpha"),
    _jodie("wikipedia", 8227, 1000, 157474, "172 edge features, "),
    _jodie("reddit", 10000, 984, 672447, "172 edge features, "),
    _jodie("mooc", 7047, 97, 411749, "4 edge features, "),
    _jodie("lastfm", 980, 1000, 1293103, ""),
    _planetoid("cora", "2,708 nodes, 5,278 edges, 1,433 features, 7 classes, public split", 2708,
               "Sen et al., Collective Classification in Network Data, AI Magazine 2008"),
    _planetoid("citeseer", "3,327 nodes, 4,552 edges, 3,703 features, 6 classes, public split", 3327,
               "Sen et al., Collective Classification in Network Data, AI Magazine 2008"),
    _planetoid("pubmed", "19,717 nodes, 44,324 edges, 500 features, 3 classes, public split", 19717,
               "Namata et al., Query-driven Active Surveying for Collective Classification, MLG 2012"),
    _tgb("tgbl-wiki", "tgbl-wiki-v2.zip", "9,227 nodes, 157,474 events, 172 edge features (TGB's version 2)"),
    _tgb("tgbl-review", "tgbl-review-v2.zip", "about 352,637 nodes, 4.9 million events (TGB's version 2)"),
    _tgb("tgbl-coin", "tgbl-coin-v2.zip", "about 638,486 nodes, 22.8 million events (TGB's version 2)"),
    _tgb("tgbn-trade", "tgbn-trade.zip", "255 nodes, 468,245 events, node labels (255 classes)"),
    _tgb("tgbn-genre", "tgbn-genre.zip", "1,505 nodes, 17.9 million events, node labels (513 classes)"),
)}
_FORMAT = {load_snap: "snap", load_signed: "signed", load_csv: "csv", load_planetoid: "planetoid", load_tgb: "tgb"}
_ARRAYS = {"static": ("indptr", "indices", "x", "y", *MASKS),
           "temporal": ("src", "dst", "t", "edge_feat", "edge_label", "orig_ids")}


def is_named(name_or_path: str) -> bool:
    """Whether DATA names a dataset of the catalogue: its name, with no file or folder of that name here."""
    return name_or_path in CATALOG and not os.path.lexists(name_or_path)


def format_of(name: str) -> str:
    """The format of a named dataset's files (a `registry.FORMATS` name)."""
    return _FORMAT[CATALOG[name].read]


def identity(name: str) -> list[str]:
    """What tells a named dataset apart, for cache keys, without fetching it: its files and the form."""
    return [f"dataset {name}", f"form {FORM_VERSION}"] + [f"{f.url} {f.sha256}" for f in CATALOG[name].files]


def catalog() -> list[dict[str, Any]]:
    """The catalogue as `gnndist datasets --json` prints it: one object per dataset."""
    root = data_root()
    return [{"name": d.name, "kind": d.kind, "format": format_of(d.name), "size": d.size, "nodes": d.nodes,
             "events": d.events, "source": d.source, "licence": d.licence, "paper": d.paper,
             "files": [{"url": f.url, "sha256": f.sha256} for f in d.files], "folder": str(root / d.name),
             "downloaded": (root / d.name / CONVERTED / "meta.json").is_file()}
            for d in CATALOG.values()]


def catalog_text() -> str:
    """The catalogue as `gnndist datasets` prints it."""
    lines = [f"datasets by name (gnndist train|partition|info|predict NAME; fetched on first use into {data_root()}, "
             f"GNNDIST_DATA):"]
    for d in catalog():
        lines += [f"  {d['name']:<20} {d['kind']}: {d['size']}" + ("  [downloaded]" if d["downloaded"] else ""),
                  f"  {'':<20} source {d['source']}; licence: {d['licence']}",
                  f"  {'':<20} cite: {d['paper']}"]
    return "\n".join(lines)


def tgb_protocol(name: str) -> Optional[Path]:
    """The folder of TGB's evaluation protocol of the dataset `name` (converted now if not yet),
    or None where `name` names no TGB dataset."""
    if not is_named(name) or CATALOG[name].read is not load_tgb:
        return None
    folder = data_root() / name / CONVERTED
    if not (folder / PROTOCOL / SPLIT_FILE).is_file() or _form(folder) != FORM_VERSION:
        load_named(name)
    return folder / PROTOCOL


def _form(conv: Path) -> Optional[int]:
    """The form version of the converted folder `conv` (None: none there)."""
    try:
        return json.loads((conv / "meta.json").read_text()).get("gnndist_form")
    except (OSError, ValueError, AttributeError):
        return None


def load_named(name: str) -> Union[Graph, TemporalGraph]:
    """The named dataset's graph: read from its converted arrays, else fetched (what is missing),
    checked, read and converted first, holding its folder's lock."""
    d = CATALOG[name]
    folder = data_root() / name
    graph = _read_converted(folder, d)
    if graph is not None:
        return graph
    with locked(folder, name):
        graph = _read_converted(folder, d)  # made meanwhile by a process that held the lock
        if graph is not None:
            return graph
        missing = [f for f in d.files if not (folder / f.name).exists()]
        for f in d.files:
            if f in missing:
                download(f.url, folder / f.name, f.sha256)
            else:
                verify(folder / f.name, f.sha256, f.url)
        graph = _read_checked(folder, d, missing)
        _write_converted(folder, d, graph)
        # said once it worked: a failure is its one error line
        say(f"{name}: {_how(missing)} into {folder}, and kept its graph in {CONVERTED}/ for the runs to come")
    return graph


def _how(fetched: list[Remote]) -> str:
    """How a dataset's files came: downloaded (from where), or put there before."""
    if not fetched:
        return "read the files put there"
    base = os.path.commonprefix([f.url for f in fetched]).rpartition("/")[0] + "/"
    what = fetched[0].url if len(fetched) == 1 else f"{len(fetched)} files from {base}"
    mirror = os.environ.get(MIRROR_ENV)
    return f"downloaded {what}" + (f" (through {MIRROR_ENV}={mirror})" if mirror else "")


def _read_checked(folder: Path, d: Named, fetched: list[Remote]) -> Union[Graph, TemporalGraph]:
    """The graph read from the dataset's files, checked against the published counts; a failure
    deletes the files fetched now (a next try downloads them again), never those put there before."""
    target = str(folder / d.files[0].name) if len(d.files) == 1 else str(folder)
    try:
        graph = d.read(target)
        problem = _count_problem(d, graph)
        if problem:
            raise GnndistError(f"{target}: {problem}")
    except GnndistError as e:
        for f in fetched:
            (folder / f.name).unlink(missing_ok=True)
        urls = ", ".join(f.url for f in d.files)
        if fetched:
            raise GnndistError(f"{first_line(e)}: not {d.name} as its source publishes it (deleted what was "
                               f"downloaded from {urls}; try again)") from None
        raise GnndistError(f"{first_line(e)}: not {d.name} as its source publishes it (the files in {folder} "
                           f"were put there before: replace them with those of {urls}, or remove them to "
                           f"download them)") from None
    return graph


def _count_problem(d: Named, g: Union[Graph, TemporalGraph]) -> Optional[str]:
    """What differs from the published node and event counts, if anything."""
    got = [("nodes", d.nodes, g.num_nodes)] + ([("events", d.events, g.num_events)]
                                               if isinstance(g, TemporalGraph) else [])
    wrong = [f"{n:,} {what} (published: {want:,})" for what, want, n in got if want is not None and n != want]
    return "holds " + " and ".join(wrong) if wrong else None


def _raw_stamp(folder: Path, d: Named) -> dict[str, list[int]]:
    """Size and modification time of each of the dataset's files that is there."""
    out = {}
    for f in d.files:
        try:
            st = (folder / f.name).stat()
        except FileNotFoundError:
            continue
        out[f.name] = [st.st_size, st.st_mtime_ns]
    return out


def _write_converted(folder: Path, d: Named, graph: Union[Graph, TemporalGraph]) -> None:
    arrays = {k: getattr(graph, k, None) for k in _ARRAYS[d.kind]}
    labels = getattr(graph, "node_labels", None)
    if labels is not None:
        arrays.update({f"node_labels.{k}": getattr(labels, k) for k in ("t", "node", "cls", "weight")})
    with atomic_dir(folder / CONVERTED) as tmp:
        for k, a in arrays.items():
            if a is not None:
                np.save(tmp / f"{k}.npy", np.ascontiguousarray(a))
        if d.read is load_tgb:
            write_protocol(str(folder / d.files[0].name), graph, tmp / PROTOCOL)
        meta = {"gnndist_form": FORM_VERSION, "name": d.name, "kind": d.kind, "files": _raw_stamp(folder, d),
                "num_nodes": graph.num_nodes, "num_classes": None if labels is None else labels.num_classes}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def _read_converted(folder: Path, d: Named) -> Optional[Union[Graph, TemporalGraph]]:
    """The graph from its converted arrays; None if there are none, they are of another form, or
    a file of the dataset changed since (put there by hand after)."""
    conv = folder / CONVERTED
    try:
        meta = json.loads((conv / "meta.json").read_text())
        stamp = _raw_stamp(folder, d)
        if meta.get("gnndist_form") != FORM_VERSION or any(meta["files"].get(k) != v for k, v in stamp.items()):
            return None
        a = {p.stem: np.load(p, allow_pickle=False) for p in conv.glob("*.npy")}
        if d.kind == "static":
            return Graph(**{k: a.get(k) for k in _ARRAYS["static"]})
        g = TemporalGraph(a["src"], a["dst"], a["t"], a.get("edge_feat"), a.get("edge_label"),
                          num_nodes=int(meta["num_nodes"]))
        g.orig_ids = a["orig_ids"]
        if "node_labels.t" in a:
            g.node_labels = NodeLabels(*(a[f"node_labels.{k}"] for k in ("t", "node", "cls", "weight")),
                                       num_classes=int(meta["num_classes"]))
        return g
    except (OSError, ValueError, KeyError, TypeError, GnndistError):
        return None
