"""Docs that cannot rot: every fenced block of README.md and docs/**/*.md says what it is (```sh,
```python, ```text or ```json), and every sh and Python block is run by these tests, in order,
one working folder per page:

- as written, where it takes seconds;
- with smaller sizes, where an HTML comment just before it says which, one `OLD => NEW` a line
  (each OLD must occur in the block):
      <!-- smaller:
      --epochs 50 => --epochs 1
      -->
- or not at all, where the comment before it says why: `<!-- not run: several hosts -->`.

Whether run or not, every `gnndist ...`, `python -m gnndist ...`, `torchrun ... -m gnndist ...`
and `python benchmarks/X.py ...` command of an sh block is parsed by the real parsers
(`gnndist.cli.build_parser`, torchrun's, the benchmark's `parser()`), so a renamed flag fails
here; a Python block that is not run must still compile and import what it names.

Datasets by name (`uci`, `cora`, `bitcoin-otc`) are read from ../shared/datasets, put into a fresh
$GNNDIST_DATA as a user would put files there by hand (docs/datasets.md); downloads go to a
mirror that refuses them.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from gnndist.cli import EPILOG, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DATA = ROOT.parent / "shared" / "datasets"
BY_NAME = {  # dataset name -> its files in ../shared/datasets
    "uci": ["uci_collegemsg/CollegeMsg.txt.gz"],
    "bitcoin-otc": ["bitcoin_otc/soc-sign-bitcoinotc.csv.gz"],
    "cora": [f"cora/ind.cora.{p}" for p in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")],
}
LANGS = {"sh", "python", "text", "json"}
TIMEOUT_S = 600


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence
    lang: str
    text: str
    not_run: str = ""  # the reason, where the block is not run
    smaller: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def runnable(self) -> str:
        """The text the test runs: the block with its smaller sizes in place."""
        text = self.text
        for old, new in self.smaller:
            assert old in text, f"{self.where}: the smaller size's {old!r} is not in the block"
            text = text.replace(old, new)
        return text


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of `doc`, each with the HTML comment just before it (blank lines between
    allowed) read as its marks."""
    out, comment, lines = [], "", doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("<!--"):
            j = i
            while "-->" not in lines[j]:
                j += 1
            comment, i = "\n".join(lines[i:j + 1]), j + 1
            continue
        fence = re.match(r"\s*```(\S*)\s*$", line)
        if fence:
            j = i + 1
            while not lines[j].strip().startswith("```"):
                j += 1
            b = Block(doc, i + 1, fence.group(1), "\n".join(lines[i + 1:j]) + "\n")
            marks(b, comment)
            out.append(b)
            comment, i = "", j + 1
            continue
        if line.strip():
            comment = ""
        i += 1
    return out


def marks(b: Block, comment: str) -> None:
    """Read `<!-- not run: REASON -->` or `<!-- smaller: OLD => NEW ... -->` into `b`."""
    if not comment:
        return
    body = comment.strip()[len("<!--"):-len("-->")].strip()
    if body.startswith("not run:"):
        b.not_run = body[len("not run:"):].strip()
        assert b.not_run, f"{b.where}: say why the block is not run"
    elif body.startswith("smaller:"):
        for pair in body[len("smaller:"):].strip().splitlines():
            old, sep, new = pair.partition(" => ")
            assert sep and old.strip(), f"{b.where}: a smaller size is `OLD => NEW`, got {pair!r}"
            b.smaller.append((old.strip(), new.strip()))
    else:
        raise AssertionError(f"{b.where}: the comment before the block is neither `not run:` nor `smaller:`")


ALL = [b for doc in DOCS for b in blocks(doc)]


def test_every_block_says_what_it_is():
    bad = [f"{b.where}: ```{b.lang}" for b in ALL if b.lang not in LANGS]
    assert not bad, f"a fenced block is one of ```{', ```'.join(sorted(LANGS))}: {bad}"
    marked = [b.where for b in ALL if b.lang in ("text", "json") and (b.not_run or b.smaller)]
    assert not marked, f"text and json blocks are not run, so they take no marks: {marked}"


def test_the_docs_never_name_the_projects_test_data():
    """Users have no ../shared: the docs and the CLI's help name datasets by name or generators."""
    named = [str(d.relative_to(ROOT)) for d in DOCS if "../shared" in d.read_text() or "shared/datasets" in d.read_text()]
    assert not named, named
    assert "shared/" not in EPILOG


def test_the_readme_is_at_most_300_lines_and_keeps_the_ci_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ('torch==2.13.0 -e ".[test]"', "python -m pytest"):
        assert command in ci
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest\n' in text
    assert "pip install torch==2.13.0 -e . && gnndist demo\n" in text


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_link_between_the_docs_leads_somewhere(doc):
    for target, frag in re.findall(r"\]\((?!https?:)([^)#\s]*)(?:#([^)\s]+))?\)", doc.read_text()):
        path = (doc.parent / target).resolve() if target else doc
        assert path.exists(), f"{doc.relative_to(ROOT)}: no {target}"
        if frag:
            headings = {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
            assert frag in headings, f"{doc.relative_to(ROOT)}: {target} has no heading #{frag}"


# ---------------------------------------------------------------- flags, by the real parsers

def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, comments dropped, split at
    `&&`, `||`, `;` and `|`, redirections left out."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        words: list[str] = []
        tokens = list(lex)
        k = 0
        while k < len(tokens):
            t = tokens[k]
            if t in ("&&", "||", ";", "|", "&"):
                out.append(words)
                words = []
            elif t in (">", ">>", "<", "2>", ">&"):
                k += 1  # the file it redirects to
            else:
                words.append(t)
            k += 1
        out.append(words)
    return [w for w in out if w]


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its subcommands' parsers."""
    out = set()
    for action in parser._actions:
        out.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def _parse(parser: argparse.ArgumentParser, argv: list[str], what: str) -> None:
    """`argv` parses, and names each option in full (argparse would take an abbreviation, which
    a renamed flag can still be)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        assert e.code == 0, f"{what}: {err.getvalue().strip()}"
    known = _options(parser)
    partial = [a for a in argv if a.startswith("--") and a.split("=")[0] not in known]
    assert not partial, f"{what}: {partial} is not an option's full name"


def check_gnndist(argv: list[str], what: str) -> None:
    cmd = next((a for a in argv if not a.startswith("-")), None)
    _parse(build_parser(cmd), argv, what)


def _benchmark_parser(script: str):
    path = ROOT / script
    assert path.is_file(), f"no {script}"
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.parser()


def check_command(words: list[str], what: str) -> int:
    """Parse one command if it is gnndist's, torchrun's or a benchmark's; how many were parsed."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value before the command
    if not words:
        return 0
    if words[0] == "gnndist":
        check_gnndist(words[1:], what)
        return 1
    if words[0] in ("python", "python3") and words[1:3] == ["-m", "gnndist"]:
        check_gnndist(words[3:], what)
        return 1
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                args = get_args_parser().parse_args(words[1:])
            except SystemExit:
                raise AssertionError(f"{what}: torchrun: {err.getvalue().strip()}") from None
        assert args.module and args.training_script == "gnndist", f"{what}: torchrun runs `-m gnndist`"
        own = words[1:words.index("gnndist")]
        known = _options(get_args_parser())
        assert all(a.split("=")[0] in known for a in own if a.startswith("--")), f"{what}: a torchrun option in part"
        check_gnndist(list(args.training_script_args), what)
        return 1
    if words[0] in ("python", "python3") and len(words) > 1 and words[1].startswith("benchmarks/"):
        _parse(_benchmark_parser(words[1]), words[2:], what)
        return 1
    return 0


SHELL = [b for b in ALL if b.lang == "sh"]


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_every_documented_command_parses(block):
    for words in commands(block.text):
        check_command(words, f"{block.where}: {shlex.join(words)}")


def test_the_clis_examples_parse():
    examples = [ln for ln in EPILOG.splitlines() if ln.startswith("  ")]
    assert len(examples) > 5 and all(ln.split()[0] == "gnndist" for ln in examples)
    for words in commands("\n".join(examples)):
        assert check_command(words, f"gnndist --help example: {shlex.join(words)}") == 1


def check_imports(code: str, what: str) -> None:
    """The gnndist names a Python block imports or reads from `gnndist.` exist."""
    import gnndist
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gnndist":
            mod = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(mod, alias.name), f"{what}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gnndist":
                    importlib.import_module(alias.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gnndist"):
            assert hasattr(gnndist, node.attr), f"{what}: gnndist has no {node.attr}"


PYTHON = [b for b in ALL if b.lang == "python"]


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_every_python_block_compiles_and_imports_what_it_names(block):
    check_imports(block.text, block.where)


# ---------------------------------------------------------------- running the blocks

@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    """$GNNDIST_DATA with the datasets by name the docs use, put there by hand, and a cache of
    partitions shared by the pages."""
    if not DATA.is_dir():
        pytest.skip("the project's test data (../shared/datasets) is not here")
    root = tmp_path_factory.mktemp("docs-data")
    for name, files in BY_NAME.items():
        (root / "data" / name).mkdir(parents=True)
        for f in files:
            shutil.copy(DATA / f, root / "data" / name / Path(f).name)
    return root


def plain_gnndist(line: str) -> Optional[list[str]]:
    """The arguments of a line that is one `gnndist ...` command and nothing else of the shell
    (no operators, redirections or variables), which the test runs in its own process."""
    if "$" in line or "`" in line:
        return None
    cmds = commands(line)
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, "#"
    if len(cmds) != 1 or cmds[0][0] != "gnndist" or any(set(t) <= set("&|;<>") for t in lex):
        return None
    return cmds[0][1:]


RUN_DOCS = [d for d in DOCS if any(b.lang in ("sh", "python") and not b.not_run for b in blocks(d))]


@pytest.mark.parametrize("doc", RUN_DOCS, ids=[str(d.relative_to(ROOT)) for d in RUN_DOCS])
def test_the_docs_blocks_run(doc, data_dirs, tmp_path, monkeypatch):
    """Each page's blocks, in order, in one folder of their own: a block may use what the
    blocks before it wrote. A line that is one gnndist command runs in this process (as
    `gnndist.cli.main`, what the console script calls; ranks it starts are processes of their
    own), other lines in bash, Python blocks as scripts of their own."""
    env = {"GNNDIST_DATA": str(data_dirs / "data"), "GNNDIST_CACHE": str(data_dirs / "cache"),
           "GNNDIST_DATA_MIRROR": "http://127.0.0.1:9",  # a download is refused, not tried
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
           "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    for i, b in enumerate(x for x in blocks(doc) if x.lang in ("sh", "python") and not x.not_run):
        text = b.runnable()
        if b.lang == "python":
            script = tmp_path / f"block{i}.py"
            script.write_text(text)
            p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S)
            assert p.returncode == 0, f"{b.where} failed (exit {p.returncode}):\n{text}\n{p.stderr[-3000:]}"
            continue
        for line in text.replace("\\\n", " ").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            argv = plain_gnndist(line)
            if argv is not None:
                assert main(argv) == 0, f"{b.where}: `{line}` failed"
                continue
            p = subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True,
                               timeout=TIMEOUT_S)
            assert p.returncode == 0, f"{b.where}: `{line}` failed (exit {p.returncode}):\n{p.stderr[-3000:]}"
