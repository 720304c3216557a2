"""The command line as onert_train scripts use it: every onert_train flag with its arity,
``onert-train-jax`` (onert_train's command line verbatim), nnpackage directories, --version,
circle+ defaults (epochs included), -v/-m doing what they say, --help stating every default
and onert's code tables, params' aliases, one-line errors, the persistent compile cache.

Most tests call ``main(argv)`` in-process; two use subprocesses (the console scripts, and a
repeated run that must find its compiled epoch in the cache).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.cli import build_onert_train_parser, build_parser, main, onert_train_main
from circle_jax.cli.cache import cache_dir
from circle_jax.losses import LOSS_TABLE, REDUCTION_TABLE
from circle_jax.optim import OPTIMIZER_TABLE
from circle_jax.train import select_trainable
from tests.paths import KERAS_DATA, REPO_ROOT
from tests.toy_models import cnn, digits16

# onert_train's options (formats.md): flag -> (values on the command line, namespace
# attribute, parsed value)
ONERT_FLAGS = [
    (["--epoch", "3"], "epoch", 3),
    (["--batch_size", "4"], "batch_size", 4),
    (["--learning_rate", "0.05"], "learning_rate", 0.05),
    (["--loss", "1"], "loss", 1),
    (["--loss", "2"], "loss", 2),
    (["--loss_reduction_type", "2"], "loss_reduction_type", 2),
    (["--optimizer", "2"], "optimizer", 2),
    (["--metric", "0"], "metric", 0),
    (["--metric", "-1"], "metric", -1),
    (["--validation_split", "0.25"], "validation_split", 0.25),
    (["--num_of_trainable_ops", "-1"], "num_of_trainable_ops", -1),
    (["--load_input:raw", "x.raw"], "load_input_raw", "x.raw"),
    (["--load_expected:raw", "y.raw"], "load_expected_raw", "y.raw"),
    (["--checkpoint", "in.ckpt"], "checkpoint", "in.ckpt"),
    (["--export_circle", "o.circle"], "export_circle", "o.circle"),
    (["--export_circleplus", "o.circle"], "export_circleplus", "o.circle"),
    (["--export_checkpoint", "o.ckpt"], "export_checkpoint", "o.ckpt"),
    (["-m"], "mem_poll", True),
    (["--mem_poll"], "mem_poll", True),
    (["-v", "2"], "verbose_level", 2),
    (["--verbose_level", "1"], "verbose_level", 1),
    (["--output_sizes", "[0, 40, 2, 80]"], "output_sizes", ((0, 40), (2, 80))),
    (["--epoch=7"], "epoch", 7),  # boost's --name=value form
    (["-v1"], "verbose_level", 1),
]


@pytest.mark.parametrize("argv, attr, want", ONERT_FLAGS, ids=lambda v: str(v))
def test_every_onert_train_flag_parses_with_its_arity(argv, attr, want) -> None:
    """After the flag (and its value, if any) MODEL still parses as the positional."""
    for parser, prefix in ((build_onert_train_parser(), []), (build_parser(), ["train"])):
        ns = parser.parse_args([*prefix, *argv, "model.circle"])
        assert getattr(ns, attr) == want and ns.model == "model.circle", (prefix, argv)
        ns = parser.parse_args([*prefix, "model.circle", *argv])
        assert getattr(ns, attr) == want and ns.model == "model.circle", (prefix, argv)


def test_onert_defaults_when_flags_are_absent() -> None:
    ns = build_onert_train_parser().parse_args(["m.circle"])
    assert ns.mem_poll is False and ns.metric is None and ns.epoch is None
    from circle_jax.cli.config import train_run

    run = train_run(ns)
    assert run.metric == -1 and run.verbosity == 0 and run.train["epochs"] is None


@pytest.mark.parametrize("main_fn, prog", [(main, "circle-jax"),
                                           (onert_train_main, "onert-train-jax")])
def test_version(main_fn, prog, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main_fn(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"{prog} {cj.__version__}")


BAD = [
    (["train", "m.circle", "--epoch", "x"], "argument --epoch: invalid int value: 'x'"),
    (["train", "m.circle", "--loss", "7"], "invalid loss '7': expected onert code 1 (mean "
                                           "squared error) or 2 (categorical crossentropy)"),
    (["train", "m.circle", "--optimizer", "lamb"], "invalid optimizer 'lamb'"),
    (["train", "m.circle", "--metric", "3"], "argument --metric: invalid choice: 3"),
    (["train", "m.circle", "--output_sizes", "[0]"], "invalid --output_sizes '[0]'"),
    (["train", "m.circle", "-m", "1"], "unrecognized arguments: 1"),  # -m takes no value
    (["train", "m.circle", "--nope"], "unrecognized arguments: --nope"),
    ([], "the following arguments are required: COMMAND (see circle-jax --help)"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=lambda v: str(v))
def test_bad_flags_are_one_error_line(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("E: ") and "Traceback" not in err, err
    assert message in err, err
    assert "circle-jax circle-jax" not in err


@pytest.mark.parametrize("argv, message", [
    (["--num_of_trainable_ops", "2", "--trainable", "op0.bias"],
     "give --num_of_trainable_ops or --trainable, not both"),
    (["--example"], "--example trains the bundled model"),
    (["--validation_split", "1.5"], "--validation_split must be in [0, 1), got 1.5"),
    (["--epoch", "0"], "--epoch must be >= 1, got 0"),
    (["--checkpoint_every_steps", "2"], "--checkpoint_every_steps needs --export_checkpoint"),
    (["--checkpoint", "missing.ckpt"], "checkpoint file 'missing.ckpt' does not exist"),
])
def test_inconsistent_flags_are_one_error_line(argv, message, capsys) -> None:
    assert main(["train", "m.circle", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err == f"E: {err[3:]}" and message in err, err


def test_help_states_every_default_and_onert_codes() -> None:
    for parser in (build_onert_train_parser(), build_parser()._subparsers._group_actions[0]
                   .choices["train"]):
        actions = [a for a in parser._actions
                   if a.option_strings and a.dest not in ("help", "version")]
        missing = [a.option_strings[0] for a in actions if "(default: " not in (a.help or "")]
        assert not missing and len(actions) >= 34, missing
        text = parser.format_help()
        for table in (LOSS_TABLE, REDUCTION_TABLE, OPTIMIZER_TABLE):  # the library's tables
            assert " ".join(table.code_help().split()) in " ".join(text.split())
        for flag in ("--mem_poll", "--output_sizes", "--verbose_level", "--load_input:raw"):
            assert flag in text


def test_every_subcommand_help_states_defaults() -> None:
    sub = build_parser()._subparsers._group_actions[0].choices
    for name, parser in sub.items():
        for a in parser._actions:
            if a.option_strings and a.dest != "help":
                assert "(default: " in (a.help or ""), (name, a.option_strings)


# ----------------------------------------------------------------------------- training runs


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A small CNN as .circle and as an nnpackage, 16 digits as raw input/expected."""
    d = tmp_path_factory.mktemp("cli")
    x, y = digits16()
    cnn().save(d / "cnn.circle")
    (d / "x.raw").write_bytes(x.astype("<f4").tobytes())
    (d / "y.raw").write_bytes(y.astype("<f4").tobytes())
    (d / "pkg" / "metadata").mkdir(parents=True)
    shutil.copy(d / "cnn.circle", d / "pkg" / "cnn.circle")
    (d / "pkg" / "metadata" / "MANIFEST").write_text(json.dumps(
        {"major-version": "1", "minor-version": "2", "patch-version": "0", "configs": [],
         "models": ["cnn.circle"], "model-types": ["circle"]}))
    return {k: str(d / v) for k, v in (("dir", ""), ("model", "cnn.circle"), ("x", "x.raw"),
                                       ("y", "y.raw"), ("pkg", "pkg"))}


def _data(f: dict[str, str]) -> list[str]:
    return ["--load_input:raw", f["x"], "--load_expected:raw", f["y"]]


def _epochs(out: str) -> list[str]:
    return re.findall(r"^Epoch (\d+/\d+) - ", out, re.M)


def test_onert_train_command_line_verbatim_with_nnpackage(files, capsys) -> None:
    """An onert_train invocation (nnpackage MODEL, -m without a value, -v 0, --metric -1)
    runs unchanged: same parameter block, epoch lines and summary, then the -m block."""
    argv = [files["pkg"], *_data(files), "--epoch", "1", "--batch_size", "4", "--loss", "2",
            "--optimizer", "1", "--learning_rate", "0.01", "-m", "-v", "0", "--metric", "-1",
            "--output_sizes", "[0, 40]"]
    assert onert_train_main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""  # -v 0: results only
    assert "- optimizer            = sgd\n" in out and "categorical_accuracy" not in out
    assert _epochs(out) == ["1/1"]
    assert re.search(r"^EXECUTE      takes \d+\.\d{4} ms$", out, re.M)
    assert re.search(r"^RSS \(at the end of each phase\)\n(MODEL_LOAD|PREPARE|EXECUTE) ", out,
                     re.M)
    assert re.search(r"^PEAK         takes [1-9]\d* kb$", out, re.M), out


def test_nnpackage_model_and_bad_package(files, tmp_path, capsys) -> None:
    assert main(["info", files["pkg"]]) == 0
    assert "CONV_2D" in capsys.readouterr().out
    (tmp_path / "metadata").mkdir()
    assert main(["info", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an nnpackage: no metadata/MANIFEST" in err, err
    (tmp_path / "metadata" / "MANIFEST").write_text('{"models": ["a.circle", "b.circle"]}')
    assert main(["info", str(tmp_path)]) == 1
    assert "single-model nnpackages" in capsys.readouterr().err


def test_circleplus_values_are_the_defaults_epochs_included(files, tmp_path, capsys) -> None:
    hp = tmp_path / "hp.json"
    hp.write_text(json.dumps({
        "optimizer": {"type": "sgd", "args": {"learningRate": 0.02}},
        "loss": {"type": "categorical crossentropy", "args": {"reduction": "sum"}},
        "batchSize": 8, "fineTuning": 0, "epochs": 2}))
    plus = str(tmp_path / "plus.circle")
    assert main(["traininfo", files["model"], "--set", str(hp), "-o", plus]) == 0
    capsys.readouterr()
    assert main(["train", plus, *_data(files)]) == 0
    out = capsys.readouterr().out
    assert _epochs(out) == ["1/2", "2/2"], out
    assert "- learning_rate        = 0.02\n- batch_size           = 8\n" in out
    assert "reduction = sum}" in out
    assert main(["train", plus, *_data(files), "--epoch", "1", "--batch_size", "4"]) == 0
    out = capsys.readouterr().out
    assert _epochs(out) == ["1/1"] and "- batch_size           = 4\n" in out


def test_verbose_levels(files, capsys) -> None:
    base = ["train", files["model"], *_data(files), "--epoch", "1", "--batch_size", "4"]
    assert main([*base, "-v", "1"]) == 0
    out, err1 = capsys.readouterr()
    assert "compiling the training epoch…" in err1, err1
    assert re.search(r"^compiling the training epoch: done in \d+\.\d ms$", err1, re.M), err1
    assert re.search(r"^loaded .*cnn.circle: 5 operators, 4 params", err1, re.M), err1
    assert "data: 16 samples" in err1 and "op0.weight" not in err1
    assert main([*base, "-v", "2"]) == 0
    err2 = capsys.readouterr().err
    assert re.search(r"^  train  op0\.weight +\[4, 3, 3, 1\] conv/w$", err2, re.M), err2
    assert len(err2.splitlines()) > len(err1.splitlines())


def test_info_aliases_are_unique_and_accepted_for_training(files, capsys) -> None:
    assert main(["info", files["model"]]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^  (op\d+\.\w+) +float32\[.*\] +(\S+)$", out, re.M)
    assert dict(rows) == {"op0.weight": "conv/w", "op0.bias": "conv/b",
                          "op3.weight": "fc/w", "op3.bias": "fc/b"}, out
    aliases = [a for a, _ in rows]
    assert len(set(aliases)) == len(aliases) == len(cj.load(files["model"]).params)
    model = cj.load(files["model"])
    name = dict(rows)["op0.bias"]
    assert select_trainable(model, ["op0.bias"]) == {name}
    out_path = os.path.join(files["dir"], "alias_trained.circle")
    argv = ["train", files["model"], *_data(files), "--epoch", "1", "--batch_size", "4",
            "--learning_rate", "0.1", "--trainable", "op0.bias", "--export_circle", out_path]
    assert main(argv) == 0
    assert "- trainable            = op0.bias\n" in capsys.readouterr().out
    trained = cj.load(out_path).params
    changed = {k for k, v in model.params.items()
               if not np.array_equal(np.asarray(v), np.asarray(trained[k]))}
    assert changed == {name}
    assert main([*argv[:-4], "--trainable", "op9.bias"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown weight name(s) ['op9.bias']" in err, err


def test_cache_dir_resolution(tmp_path) -> None:
    home = os.path.expanduser("~")
    assert cache_dir(None, {}) == os.path.join(home, ".cache", "circle-jax", "xla")
    assert cache_dir(None, {"XDG_CACHE_HOME": "/x"}) == "/x/circle-jax/xla"
    assert cache_dir(None, {"XDG_CACHE_HOME": "/x", "CIRCLE_JAX_CACHE": "/c"}) == "/c"
    assert cache_dir("/f", {"CIRCLE_JAX_CACHE": "/c"}) == "/f"
    assert cache_dir(None, {"CIRCLE_JAX_CACHE": "off"}) is None
    assert cache_dir("off", {"CIRCLE_JAX_CACHE": "/c"}) is None
    assert os.environ["CIRCLE_JAX_CACHE"] == "off"  # tests/conftest.py: nothing in ~/.cache
    # a relative directory is named where the run starts, wherever JAX later writes
    assert cache_dir("c", {}) == os.path.join(os.getcwd(), "c")


def test_an_uncreatable_default_cache_is_skipped_a_named_one_refused(files, capsys,
                                                                     monkeypatch) -> None:
    """A read-only home (the default cache): a ``W:`` line, then training without the
    cache; the same directory named by ``$CIRCLE_JAX_CACHE`` or ``--compile_cache``: one
    ``E:`` line before any work."""
    argv = ["train", files["model"], *_data(files), "--epoch", "1", "--batch_size", "4"]
    monkeypatch.delenv("CIRCLE_JAX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/circle-jax-test")  # nothing can be created
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ("W: cannot create the compile cache directory '/proc/circle-jax-test/"
                   "circle-jax/xla': No such file or directory; training without it (give "
                   "--compile_cache DIR or off)\n")
    assert "persistent cache off;" in out and _epochs(out) == ["1/1"]
    for named in (["--compile_cache", "/proc/circle-jax-test"], []):
        monkeypatch.setenv("CIRCLE_JAX_CACHE", "/proc/circle-jax-test")
        assert main(argv + named) == 1
        out, err = capsys.readouterr()
        assert not _epochs(out) and err == (
            "E: cannot create the compile cache directory '/proc/circle-jax-test': No such "
            "file or directory (give --compile_cache DIR or off)\n")


def test_a_full_compile_cache_is_one_warning(files, tmp_path, capsys, monkeypatch) -> None:
    """The compile cache's disk full while the run's programs are written: the run trains
    and exports as usual, and one ``W:`` line says that the next run compiles again
    (before, nothing was said and every run compiled)."""
    from circle_jax.formats import atomic

    def full(path, data, **kwargs):
        if "programs" in os.fspath(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        return write(path, data, **kwargs)

    write = atomic.atomic_write
    monkeypatch.setattr(atomic, "atomic_write", full)
    out_file = tmp_path / "m.circle"
    argv = ["train", files["model"], *_data(files), "--epoch", "1", "--batch_size", "4",
            "--compile_cache", str(tmp_path / "cache"), "--export_circle", str(out_file)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert _epochs(out) == ["1/1"] and out_file.exists()
    assert err == (f"W: the compile cache could not keep this run's compiled programs in "
                   f"'{tmp_path / 'cache' / 'programs'}' (No space left on device); the next "
                   "run compiles them again\n")


def _script(name: str) -> str:
    exe = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    assert exe, f"the {name} console script is not installed (pip install -e .)"
    return exe


def test_repeated_run_prepares_from_the_persistent_cache(files, tmp_path) -> None:
    """Two ``onert-train-jax`` processes, one cache: the second, in a terminal (stderr on a
    pseudo-terminal: the epoch bar drawn), loads its compiled programs (``programs/``: the
    fresh state and the epoch), starting as it starts (the first run recorded them under
    its flags and files, ``programs/runs/``), says so, and prints the same losses.

    The compile of this small CNN is about 0.8 s and its cached load about 0.3 s here; the
    assertion keeps a 25% margin for a shared machine.
    """
    env = {**os.environ, "CIRCLE_JAX_CACHE": str(tmp_path / "xla")}
    argv = [_script("onert-train-jax"), files["model"], *_data(files), "--epoch", "2",
            "--batch_size", "4", "-v", "1"]
    prepare, losses, legends, early = [], [], [], []
    for terminal in (False, True):
        stdout, stderr = _run(argv, env, terminal)
        legends.append(stdout.splitlines()[-1])
        prepare.append(float(re.search(r"^PREPARE +takes (\S+) ms$", stdout, re.M)[1]))
        losses.append(re.findall(r"loss: \[0\] (\S+)", stdout))
        early.append(re.findall(r"^loading the (\d+) compiled programs this run used last "
                                r"time\r?$", stderr, re.M))
        assert f"persistent cache {tmp_path / 'xla'}" in stdout
    assert "/2 [" in stderr and "epoch" in stderr, stderr  # tqdm's bar, on the terminal only
    assert all(line.startswith(("Epoch", "=", "-", "MODEL_LOAD", "PREPARE", "EXECUTE", "("))
               for line in stdout.splitlines()[stdout.splitlines().index("=" * 24) + 1:])
    programs = tmp_path / "xla" / "programs"
    entries = sorted(p.name for p in programs.glob("*.jaxexec"))
    assert len(entries) == 2 and early == [[], ["2"]], early
    records = list((programs / "runs").iterdir())
    assert len(records) == 1 and sorted(json.loads(records[0].read_text())) == entries
    assert "XLA compile of the training epoch" in legends[0], legends
    assert "the training epoch loaded from the cache" in legends[1], legends
    assert prepare[1] < 0.75 * prepare[0], prepare
    assert losses[0] == losses[1] and len(losses[0]) == 2


def test_a_run_is_named_by_its_flags_and_files_but_not_its_epochs(files) -> None:
    """The name a run's programs are recorded under (`run_name`): the same for another
    number of epochs or verbosity, which change no program; another for other flags or a
    data file written since."""
    from circle_jax.cli.config import train_run
    from circle_jax.cli.train import run_name

    def name(*flags: str) -> str:
        return run_name(train_run(build_onert_train_parser().parse_args(
            [files["model"], *_data(files), "--batch_size", "4", *flags])))

    base = name("--epoch", "2")
    assert name("--epoch", "5", "-v", "1") == base
    assert name("--epoch", "2", "--learning_rate", "0.5") != base
    stat = os.stat(files["y"])
    os.utime(files["y"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    try:
        assert name("--epoch", "2") != base
    finally:
        os.utime(files["y"], ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _run(argv: list[str], env: dict, terminal: bool) -> tuple[str, str]:
    """(stdout, stderr) of a successful run; ``terminal``: stderr is a pseudo-terminal."""
    if not terminal:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout, p.stderr
    import fcntl
    import pty
    import struct
    import termios

    main_fd, side_fd = pty.openpty()
    fcntl.ioctl(side_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # 80 columns
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=side_fd, text=True,
                           timeout=300, env=env)
        os.set_blocking(main_fd, False)
        try:
            err = os.read(main_fd, 1 << 16).decode(errors="replace")
        except BlockingIOError:
            err = ""
    finally:
        os.close(side_fd)
        os.close(main_fd)
    assert p.returncode == 0, err
    return p.stdout, err


def test_cli_functions_are_simple() -> None:
    """No function of the command line has a cyclomatic complexity over 10."""
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert ruff, "ruff is not installed (pip install -e .[test])"
    root = REPO_ROOT
    p = subprocess.run([ruff, "check", "--select", "C901", "--config",
                        "lint.mccabe.max-complexity=10", "circle_jax/cli", "circle_jax/codes.py",
                        "circle_jax/graph/aliases.py"], capture_output=True, text=True, cwd=root)
    assert p.returncode == 0, p.stdout


def test_aliases_are_unique_on_every_shared_model() -> None:
    from circle_jax.formats.reader import read_model
    from circle_jax.graph.aliases import alias_table, param_aliases
    from circle_jax.lowering.interpreter import param_table
    from tests.paths import shared_model, shared_model_names

    names = shared_model_names()
    assert len(names) >= 20
    for name in names:
        m = read_model(shared_model(name))
        keys = param_table(m)
        aliases = param_aliases(m, keys)
        assert set(aliases) == set(keys), name
        assert len(set(aliases.values())) == len(keys), name  # one alias per param, unique
        assert all(re.fullmatch(r"(sg\d+\.)?(op\d+\.\w+|t\d+)", a) for a in aliases.values())
        table = alias_table(m, keys)
        assert all(table[a] == n for n, a in aliases.items()), name


def test_code_tables_parse_codes_and_names() -> None:
    assert LOSS_TABLE.parse("2") == 2 and LOSS_TABLE.parse("CCE") == "categorical_crossentropy"
    assert REDUCTION_TABLE.parse("sum over batch size") == "sum_over_batch_size"
    assert OPTIMIZER_TABLE.parse("Adam-ONERT micro") == "adam_onert_micro"
    with pytest.raises(ValueError, match=r"unknown onert optimizer code 3: use 1 \(sgd\) or "
                                         r"2 \(adam\)"):
        OPTIMIZER_TABLE.parse("3")


def test_wof_takes_aliases_like_names(files) -> None:
    from circle_jax.checkpoints import wof_bytes

    model = cj.load(files["model"])
    assert wof_bytes(model, trainable=["op0.bias", "op3.weight"]) == \
        wof_bytes(model, trainable=["conv/b", "fc/w"])
    assert wof_bytes(model, trainable=["op0.bias"]) != wof_bytes(model, trainable=["op0.weight"])
    with pytest.raises(ValueError, match=r"unknown weight name\(s\) \['op7\.bias'\]"):
        wof_bytes(model, trainable=["op7.bias"])


def test_aliases_of_a_shared_constant_name_each_readers_copy(capsys) -> None:
    """A constant read by three convolutions: `info` shows one alias per reader; the loaded
    (untied, onert's default) model gives each reader's alias its own copy."""
    path = os.path.join(KERAS_DATA, "branching_cnn.tflite")
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  op0\.bias +float32\[4\] +arith\.constant1 \(also op1\.bias, "
                     r"op2\.bias\)$", out, re.M), out
    assert ("pass untie_shared_constants (copy: shared tensor): 2 change(s)\n"
            "  arith.constant1/op1: arith.constant1\n") in out
    model = cj.load(path)
    assert model.resolve_params(["op0.bias", "op1.bias", "op2.bias"]) == {
        "arith.constant1", "arith.constant1/op1", "arith.constant1/op2"}
    tied = cj.load(path, tie_shared_weights=True)
    assert tied.resolve_params(["op1.bias"]) == {"arith.constant1"}


def test_non_finite_data_is_refused_before_compiling(files, tmp_path, capsys) -> None:
    x = np.frombuffer(open(files["x"], "rb").read(), "<f4").copy()
    per = x.size // 16
    x[5 * per + 3] = np.nan
    bad = tmp_path / "x_nan.raw"
    bad.write_bytes(x.astype("<f4").tobytes())
    argv = ["train", files["model"], "--load_input:raw", str(bad), "--load_expected:raw",
            files["y"], "--epoch", "1", "--batch_size", "4"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("E: "), err
    assert "x_nan.raw" in err and "sample 5 holds NaN" in err, err
    assert "Epoch" not in out


def test_an_internal_error_is_one_line_with_a_pointer_to_v2(files, capsys, monkeypatch) -> None:
    from circle_jax.cli import info

    def broken(args):
        raise KeyError("boom")

    monkeypatch.setattr(info, "run", broken)
    assert main(["info", files["model"]]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("E: internal error: KeyError"), err
    assert "-v 2" in err and "Traceback" not in err


def test_an_internal_error_in_train_without_v_is_one_line(files, capsys, monkeypatch) -> None:
    """train's --verbose_level is None when absent (circle+ defaults): still one line."""
    from circle_jax.cli import train

    def broken(args):
        raise KeyError("boom")

    monkeypatch.setattr(train, "run", broken)
    assert main(["train", files["model"], "--load_input:raw", files["x"],
                 "--load_expected:raw", files["y"]]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("E: internal error: KeyError"), err


def test_non_finite_validation_data_ends_the_run(files, tmp_path, capsys) -> None:
    """NaN only in the validation split (the last samples): refused before compiling."""
    x = np.frombuffer(open(files["x"], "rb").read(), "<f4").copy()
    x[-1] = np.inf
    bad = tmp_path / "x_val_inf.raw"
    bad.write_bytes(x.astype("<f4").tobytes())
    argv = ["train", files["model"], "--load_input:raw", str(bad), "--load_expected:raw",
            files["y"], "--epoch", "1", "--batch_size", "4", "--validation_split", "0.25"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "sample 15 holds NaN or infinity" in err and err.count("\n") == 1, err
