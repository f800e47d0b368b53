"""The command line: help, one-line usage errors with exit status 2."""
import subprocess
import sys

import pytest

from gnndist.cli import SUBCOMMANDS, main


def run(*argv):
    return subprocess.run([sys.executable, "-m", "gnndist", *argv], capture_output=True, text=True, timeout=120)


def test_help_lists_every_subcommand():
    p = run("--help")
    assert p.returncode == 0
    for name in SUBCOMMANDS:
        assert f"\n    {name}" in p.stdout


def test_train_help_gives_each_tasks_defaults():
    """The defaults the help names are the configs' (per task, and per model where they differ)."""
    from gnndist.static.config import NodeConfig
    from gnndist.temporal.config import LinkConfig

    text = " ".join(run("train", "--help").stdout.split())
    link, sage, gat = LinkConfig(), NodeConfig.for_model("sage"), NodeConfig.for_model("gat")
    dyrep = LinkConfig(model="dyrep")
    assert f"most training epochs (default: {link.epochs})" in text and link.epochs == sage.epochs
    assert f"(default: {','.join(map(str, sage.fanouts))})" in text
    assert f"(default: link tgn {link.patience}, jodie" in text and f"dyrep {dyrep.patience}, tgat" in text
    assert "; node none)" in text and sage.patience is None
    assert f"(default: link {link.batch_size}; node {sage.batch_size})" in text
    assert f"(default: link tgn {link.lr:g}, jodie" in text and f"dyrep {dyrep.lr:g}, tgat" in text
    assert f"; node sage {sage.lr:g}, gcn" in text and f"gat {gat.lr:g})" in text
    assert f"node memory size (default: tgn {link.memory_dim}, jodie" in text and f"dyrep {dyrep.memory_dim}," in text
    assert f"hidden size (default: sage {sage.hidden}, gcn" in text
    assert dyrep.lr != link.lr and dyrep.memory_dim != link.memory_dim and dyrep.patience != link.patience


@pytest.mark.parametrize("argv", [
    ["train", "synthetic-temporal", "--epochs", "0"],
    ["train", "synthetic-temporal", "--model"],
    ["train", "synthetic-static", "--fanouts", "15,x"],
    ["partition"],
    ["no-such-command"],
])
def test_usage_errors_are_one_line_with_status_2(argv):
    p = run(*argv)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "error:" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("argv", [
    ["--help"], ["train", "--help"], ["predict", "--help"], ["no-such-command"],
    ["train", "synthetic-temporal", "--epochs", "0"],
    ["train", "synthetic-static", "--task", "node", "--hidden", "0"],
    ["train", "synthetic-static", "--task", "node", "--memory-dim", "8"],
    ["demo", "--seed", "-1"],
])
def test_help_and_bad_flags_answer_before_torch_loads(argv):
    """Only the named subcommand's module is imported to parse, and flags are checked before the
    trainers (and torch) load: help and flag errors come at once."""
    code = ("import sys; from gnndist.cli import main\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "print(rc, 'torch' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    rc, torch_loaded = p.stderr.strip().splitlines()[-1].split()
    assert rc in ("0", "2") and torch_loaded == "False", p.stderr


def test_resume_without_checkpoint_is_a_user_error(capsys):
    assert main(["train", "synthetic-temporal", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gnndist train: error: --resume needs --checkpoint DIR"


def test_task_defaults_to_what_the_data_is(tmp_path):
    import json

    import numpy as np

    from gnndist.datasets.registry import data_kind

    snap = tmp_path / "events.txt"
    snap.write_text("1 2 10\n2 3 11\n")
    np.savez(tmp_path / "g.npz", foo=np.zeros(1))
    assert data_kind("synthetic-static") == "static" and data_kind("synthetic-temporal") == "temporal"
    assert data_kind(str(snap)) == "temporal" and data_kind(str(tmp_path / "g.npz")) == "static"
    out = tmp_path / "m.json"
    assert main(["train", "synthetic-static", "--num-nodes", "300", "--num-edges", "1200", "--epochs", "1",
                 "--quiet", "--metrics-out", str(out)]) == 0
    assert json.loads(out.read_text())["task"] == "node"


def test_a_reader_that_goes_away_stops_the_output_quietly():
    """`gnndist ... | head`: the pipe's reader closed, gnndist stops without an error line (it
    said "error: [Errno 32] Broken pipe"), with SIGPIPE's status as shells report it."""
    p = subprocess.Popen([sys.executable, "-m", "gnndist", "datasets"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before gnndist writes anything
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141 and err == b""


def test_another_broken_pipe_is_an_error_line(monkeypatch, capsys):
    """Only stdout's reader going away is quiet: a broken pipe elsewhere (e.g. to a rank being
    started) is one error line, status 2."""
    import gnndist.cli.datasets_cli as datasets_cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(datasets_cli, "run", broken)
    assert main(["datasets"]) == 2
    assert capsys.readouterr().err == "gnndist datasets: error: [Errno 32] Broken pipe\n"
