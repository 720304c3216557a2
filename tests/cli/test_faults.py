"""What a newcomer trips over on the command line (issue 28): a closed pipe, Ctrl-C, output
paths that cannot be written (checked before any work), compare's exit codes and ties, a
batch larger than the data with --keep_remainder, empty and wrong-dtype data files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from circle_jax.cli import build_parser, main
from circle_jax.oracle.compare import CompareReport, Tolerance, abs_diff, nearer
from tests.paths import shared_model
from tests.toy_models import cnn, digits16

UNWRITABLE = "/proc/circle-jax-test/x"  # no file can be created under /proc


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The test CNN, 16 digits as raw float32 and as raw uint8 / float64 (wrong dtypes)."""
    d = tmp_path_factory.mktemp("faults")
    x, y = digits16()
    cnn().save(d / "cnn.circle")
    for name, data in (("x.raw", x.astype("<f4")), ("y.raw", y.astype("<f4")),
                       ("x_u8.raw", (x * 255).astype(np.uint8)),
                       ("x_f64.raw", x.astype("<f8")), ("empty.raw", x[:0])):
        (d / name).write_bytes(data.tobytes())
    np.save(d / "x_f64.npy", x.astype(np.float64) + 0.1)  # float64 values float32 rounds
    return {k: str(d / k) for k in ("cnn.circle", "x.raw", "y.raw", "x_u8.raw", "x_f64.raw",
                                    "empty.raw", "x_f64.npy")} | {"dir": str(d)}


def _train(f: dict[str, str], x: str = "x.raw", *extra: str) -> list[str]:
    flag = "--load_input" if x.endswith(".npy") else "--load_input:raw"
    return ["train", f["cnn.circle"], flag, f[x], "--load_expected:raw", f["y.raw"],
            "--batch_size", "4", "--epoch", "1", *extra]


def _one_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("E: "), err
    assert "Epoch" not in out and "Traceback" not in err
    return err


# ----------------------------------------------------------------------------- closed pipe

def _script() -> str:
    exe = shutil.which("circle-jax", path=os.path.dirname(sys.executable))
    assert exe, "the circle-jax console script is not installed (pip install -e .)"
    return exe


@pytest.mark.parametrize("argv", [["info", "cnn.circle"], ["--help"], ["train", "--help"]],
                         ids=["info", "help", "train-help"])
def test_a_closed_pipe_ends_quietly_with_status_0(files, argv) -> None:
    """``circle-jax info M | head -0``: the reader has gone before the first write (the
    pipe's read end is closed before the process starts writing)."""
    p = _into_closed_pipe([_script(), *[files.get(a, a) for a in argv]])
    assert (p.returncode, p.stderr) == (0, "")


def _into_closed_pipe(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` run with standard output a pipe whose reader has already gone (``| head
    -0``), standard error captured."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120,
                              **kwargs)
    finally:
        os.close(w)


@pytest.mark.parametrize(("sig", "status", "message"), [
    (signal.SIGINT, 130, "E: interrupted\n"), (signal.SIGTERM, 143, "E: terminated\n")],
    ids=["SIGINT", "SIGTERM"])
def test_a_signal_is_one_line_its_status_and_no_output_file(files, tmp_path, sig, status,
                                                             message) -> None:
    """Ctrl-C (SIGINT) or ``kill`` (SIGTERM) while the epochs run: one line, no traceback,
    the shell's status for the signal (130, 143), and no export nor its temporary file
    (written only at the end, atomically). Before, SIGTERM ended the process at once."""
    out = tmp_path / "m.circle"
    argv = [_script(), *_train(files, "x.raw", "--export_circle", str(out))[:-2],
            "--epoch", "100000", "--batch_size", "1"]
    # SIGINT as a terminal leaves it (a test runner's worker may ignore it, and an ignored
    # signal stays ignored across exec); set in the child's Python, not by a preexec_fn
    # (a fork of this multithreaded JAX process)
    p = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; signal.signal("
                          "signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
                          *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:  # the parameter block, then the first epoch's line
            if line.startswith("Epoch 1/"):
                break
        else:
            raise AssertionError("training never started")
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert (p.returncode, err) == (status, message)
    assert list(tmp_path.glob("*m.circle*")) == []


@pytest.mark.parametrize("command", ["script", "module"])
def test_sigterm_while_xla_compiles_is_143_not_a_crash(tmp_path, command) -> None:
    """SIGTERM during the epoch's compile (ResNet-8, no compile cache): XLA's threads are
    still compiling when the command returns; the interpreter's teardown under them
    crashed (status 139, a segmentation fault, in 2 of 3 runs). Now: 143, one line."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((16, 32, 32, 3), np.float32))
    np.save(tmp_path / "y.npy", np.eye(10, dtype=np.float32)[np.arange(16) % 10])
    start = [_script()] if command == "script" else [sys.executable, "-m", "circle_jax.cli"]
    p = subprocess.Popen([*start, "train", shared_model("mlperftiny_resnet8_cifar10_float.tflite"),
                          "--load_input", "x.npy", "--load_expected", "y.npy", "--loss", "2",
                          "--batch_size", "5", "--epoch", "50", "--compile_cache", "off"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:  # the parameter block ends as the compile starts
            if line.startswith("====="):
                break
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert "Epoch" not in out  # the signal came during the compile
    assert (p.returncode, err) == (143, "E: terminated\n")


def test_a_closed_standard_output_is_no_error(files, tmp_path) -> None:
    """Started with standard output closed (``>&-``: Python's ``sys.stdout`` is None): the
    command runs and writes its files, status 0, no error."""
    out = tmp_path / "m.circle"
    for argv in (["info", files["cnn.circle"]],
                 _train(files, "x.raw", "--export_circle", str(out))):
        p = subprocess.run(["sh", "-c", 'exec "$0" "$@" >&-', _script(), *argv],
                           stderr=subprocess.PIPE, text=True, timeout=120)
        assert (p.returncode, p.stderr) == (0, "")
    assert out.exists()


def test_a_training_run_piped_into_head_still_writes_its_files(files, tmp_path) -> None:
    """docs/cli.md's ``circle-jax train ... --export_circle F | head -3``: the reader goes
    after three lines of the parameter block, before the first epoch's; training goes on
    and writes F, status 0 (the pipeline's, with pipefail), no error."""
    out = tmp_path / "m.circle"
    argv = [_script(), *_train(files, "x.raw", "--export_circle", str(out))]
    p = subprocess.run(["bash", "-o", "pipefail", "-c", '"$0" "$@" | head -3 > /dev/null',
                        *argv], stderr=subprocess.PIPE, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (0, "")
    assert out.exists()


# ----------------------------------------------------------------------------- output paths

@pytest.mark.parametrize("flags, message", [
    (["--learning_rate", "nan"], "'sgd': learning_rate must be a finite number >= 0, got nan"),
    (["--learning_rate", "-0.1"], "learning_rate must be a finite number >= 0, got -0.1"),
    (["--optimizer", "2", "--beta1", "1"], "b1 (--beta1) must be in [0, 1), got 1.0"),
    (["--optimizer", "2", "--epsilon", "0"], "eps (--epsilon) must be a finite number > 0, "
                                             "got 0.0"),
    (["--optimizer", "momentum", "--momentum", "1.5"], "momentum must be in "
                                                       "[0, 1], got 1.5"),
    (["--lora", "1", "--lora_alpha", "nan"], "LoRA alpha must be a finite number > 0"),
    (["--lora", "1", "--lora_alpha", "0"], "LoRA alpha must be a finite number > 0"),
    (["--num_of_trainable_ops", "-2"], "must be -1 (all), 0 (none) or N (the last N "
                                       "operators), got -2"),
    (["--num_of_trainable_ops", "99"], "--num_of_trainable_ops 99 exceeds the model's"),
    (["--output_sizes", "[0, 1]"], "--output_sizes: 1 bytes for output 0"),  # not whole
    (["--output_sizes", "[0, 8]"], "at least one sample's 40"),  # 10 float32 scores
    # QAT flags a float model cannot use (before: trained as float without a word)
    (["--qat", "on"], "qat=True: the model has no quantized activations"),
    (["--qat_ranges", "ema"], "qat_ranges is an option of quantization-aware training"),
    (["--dequantize", "--qat", "on"], "dequantize=True makes the model float"),
    # refused before the parameter block, in the flags' words (before: after it, one of
    # them naming the classes DynamicLossScale and NoLossScale)
    (["--on_overflow", "retry"], "use loss_scale='dynamic' (--loss_scale dynamic)"),
    (["--accumulate", "3", "--accumulate_mode", "in_step"], "batch size 4 is not divisible "
                                                            "into 3 equal micro-batches"),
    (["--accumulate", "5"], "accumulate=5 updates the weights every 5 steps"),
    (["--loss_scale", "-3", "--precision", "fp16-fp16"], "loss scale"),
])
def test_training_options_out_of_range_are_refused_before_training(files, capsys, flags,
                                                                    message) -> None:
    """A learning rate or optimizer option that cannot train (NaN, negative, a beta of 1, an
    epsilon of 0, a momentum over 1), a LoRA alpha that is NaN or 0 (NaN, or adapters that
    never train) are one line before the first epoch, not a NaN loss or a divergence after
    it; so is a number of trainable operators below -1 (onert's incorrect state). All
    before the parameter block is printed."""
    assert main(_train(files, "x.raw", *flags)) == 1
    out, err = capsys.readouterr()
    assert err.startswith("E: ") and err.count("\n") == 1 and message in err, err
    assert "training parameter" not in out and "Traceback" not in err


def test_a_seed_jax_cannot_take_is_a_usage_error(files, capsys) -> None:
    """Before, an internal OverflowError from JAX's random key after the compile."""
    with pytest.raises(SystemExit) as e:
        main(_train(files, "x.raw", "--shuffle", "--seed", str(1 << 64)))
    assert e.value.code == 2
    assert f"argument --seed: {1 << 64} is outside the 64-bit integers a seed can be" in \
        _one_error(capsys)


@pytest.mark.parametrize("flag", ["--export_circle", "--export_tflite", "--export_circleplus",
                                  "--export_checkpoint", "--export_wof"])
def test_unwritable_outputs_are_refused_before_training(files, capsys, flag) -> None:
    assert main(_train(files, "x.raw", flag, "/proc/x.circle")) == 1
    err = _one_error(capsys)
    assert f"cannot write {flag} '/proc/x.circle': cannot create a file in '/proc'" in err
    assert ".tmp" not in err
    assert main(_train(files, "x.raw", flag, "")) == 1  # before: nothing written, status 0
    assert f"{flag} '' is an empty path; expected a file path" in _one_error(capsys)


def test_unwritable_outputs_of_the_other_commands(files, tmp_path, capsys) -> None:
    np.save(tmp_path / "x.npy", digits16()[0][:2])
    for argv, flag in ((["golden", files["cnn.circle"], "--input", str(tmp_path / "x.npy"),
                         "-o", UNWRITABLE], "-o"),
                       (["run", files["cnn.circle"], "--input", str(tmp_path / "x.npy"),
                         "--output_dir", UNWRITABLE], "--output_dir"),
                       (["export", files["cnn.circle"], "--circle", "/proc/x.circle"],
                        "--circle")):
        assert main(argv) == 1, argv
        assert f"E: cannot write {flag} '" in _one_error(capsys)
    (tmp_path / "file").write_text("")
    assert main(["run", files["cnn.circle"], "--input", str(tmp_path / "x.npy"),
                 "--output_dir", str(tmp_path / "file")]) == 1
    assert "it is a file, expected a directory" in _one_error(capsys)


# ----------------------------------------------------------------------------- compare

def test_compare_report_path_is_a_usage_error_and_help_lists_status_3(files, capsys) -> None:
    argv = ["compare", files["cnn.circle"], "--load_input:raw", files["x.raw"],
            "--load_expected:raw", files["y.raw"], "--report", "/proc/r.json"]
    assert main(argv) == 3  # not 1, which says the runtimes disagree
    assert "cannot write --report '/proc/r.json'" in _one_error(capsys)
    helptext = build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
    assert "3 circle-jax cannot" in " ".join(helptext.split())


@pytest.mark.parametrize("flags", [["--with", "litert"], ["--nope"], ["--steps", "x"]])
def test_a_bad_compare_flag_exits_3_not_the_peers_2(files, capsys, flags) -> None:
    """compare's 2 says the peer refuses; a flag argparse rejects is circle-jax's 3."""
    argv = ["compare", files["cnn.circle"], "--load_input:raw", files["x.raw"],
            "--load_expected:raw", files["y.raw"], *flags]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 3
    assert _one_error(capsys).startswith("E: ")
    with pytest.raises(SystemExit) as e:  # other commands keep argparse's 2
        main(["train", files["cnn.circle"], "--nope"])
    assert e.value.code == 2


def test_the_arbiter_names_no_winner_on_a_tie() -> None:
    assert (nearer(7.08e-8, 7.08e-8), nearer(1e-8, 2e-8), nearer(2e-8, 1e-8)) == \
        ("tie", "circle-jax", "onert")

    def table(cj: float, on: float) -> str:
        step = {"step": 1, "loss": {"circle-jax": 1.0, "onert": 1.0}, "max_weight_diff": 0.0,
                "tensor": None, "arbiter": {"circle-jax": cj, "onert": on,
                                            "nearer": nearer(cj, on)}}
        report = CompareReport(True, None, [step], {"trained_loss": 1.0, "export_loss": 1.0,
                                                    "agree": True},
                               {"tolerance": {"atol": 1e-5, "rtol": 1e-4}})
        json.dumps(report.as_json())
        return report.table().splitlines()[-1]

    assert table(7.08e-8, 7.08e-8).endswith("circle-jax 7.08e-08 away, onert 7.08e-08: "
                                            "they tie (equally near)")
    # values the 3 digits shown cannot tell apart are printed with more
    assert table(7.081e-8, 7.0812e-8).endswith("circle-jax 7.081e-08 away, onert "
                                               "7.0812e-08: circle-jax is nearer")


def test_non_finite_values_agree_only_with_themselves() -> None:
    """Two runs that diverge alike (the same infinity, NaN and NaN) agree; a NaN or
    infinity against anything else differs by infinity. Before, every NaN or infinity
    disagreed, with a NaN difference (and numpy's RuntimeWarning on the terminal)."""
    inf, nan = np.inf, np.nan
    tol = Tolerance()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered"
        assert tol.close([1.0, inf, -inf, nan], [1.0, inf, -inf, nan])
        for a, b in ((inf, 1.0), (1.0, inf), (inf, -inf), (nan, 1.0), (1.0, nan), (nan, inf)):
            assert not tol.close([a], [b]), (a, b)
            assert abs_diff(a, b) == inf, (a, b)
        assert abs_diff([inf, nan, 2.0], [inf, nan, 1.5]).tolist() == [0.0, 0.0, 0.5]


# ----------------------------------------------------------------------------- data

def test_keep_remainder_with_a_batch_larger_than_the_data_trains_one_step(files,
                                                                          capsys) -> None:
    argv = [*_train(files), "--batch_size", "64", "--keep_remainder", "--epoch", "3",
            "--learning_rate", "0.5"]
    assert main(argv) == 0
    losses = [float(line.split("loss: [0] ")[1].split()[0])
              for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch")]
    assert len(losses) == 3 and losses[2] < losses[0]


@pytest.mark.parametrize("x, message", [
    ("empty.raw", r"raw data file '.*empty.raw' is empty; expected samples of 256 bytes "
                  r"\(float32\[8, 8, 1\] = 256 bytes\)"),
    ("x_u8.raw", r"input file has 4 samples, expected file has 16; the input file's 1024 "
                 r"bytes are 16 samples of uint8 or int8: is it uint8\? \(raw files carry no "
                 r"dtype; write it as float32\)"),
    ("x_f64.raw", r"input file has 32 samples, expected file has 16; the input file's 8192 "
                  r"bytes are 16 samples of float64 or int64: is it float64\?"),
    ("x_f64.npy", r"array in '.*x_f64.npy' has dtype float64, expected float32: \d+ of its "
                  r"1024 values change in the cast"),
], ids=["empty", "uint8-raw", "float64-raw", "float64-npy-lossy"])
def test_wrong_data_is_one_line_saying_what_is_wrong(files, capsys, x, message) -> None:
    import re

    assert main(_train(files, x)) == 1
    assert re.search(message, _one_error(capsys))


def test_an_output_without_a_sample_axis_is_one_line(tmp_path, capsys) -> None:
    """TF's converter made aeq_branching_conv_fc's [3, 4, 4, 1] -> [48]: at its declared
    batch the loss output has no row per sample. The loss's shape check says so before the
    per-sample accuracy is taken (which broadcast [48] against [3]: an internal error)."""
    import re

    x = np.random.default_rng(0).standard_normal((12, 4, 4, 1)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.zeros(12, np.float32))
    argv = ["train", shared_model("aeq_branching_conv_fc.tflite"), "--load_input",
            str(tmp_path / "x.npy"), "--load_expected", str(tmp_path / "y.npy"),
            "--batch_size", "3", "--epoch", "1", "--loss", "1", "--compile_cache", "off"]
    assert main(argv) == 1
    assert re.search(r"mean_squared_error: prediction shape \(48,\) != target shape \(3,\)",
                     _one_error(capsys))


def test_raw_bytes_that_read_as_nan_are_named_as_a_dtype_guess(files, tmp_path,
                                                               capsys) -> None:
    """``run`` has no expected file to count against: the size alone is the hint."""
    assert main(["run", files["cnn.circle"], "--input", files["x_u8.raw"], "--output_dir",
                 str(tmp_path)]) == 1
    err = _one_error(capsys)
    assert "holds NaN or infinity" in err and "16 samples of uint8 or int8: is it uint8?" in err


def test_nan_in_raw_data_whose_count_matched_guesses_no_dtype(files, tmp_path,
                                                              capsys) -> None:
    """train: a float32 .raw input with a NaN, as many samples as the expected file: its
    size fits float32, so no "is it uint8?" (before: a guess from the size alone)."""
    x = np.fromfile(files["x.raw"], np.float32)
    x[70] = np.nan  # in sample 1 of 64 values each
    x.tofile(tmp_path / "nan.raw")
    assert main(_train({**files, "nan.raw": str(tmp_path / "nan.raw")}, "nan.raw")) == 1
    err = _one_error(capsys)
    assert "sample 1 holds NaN or infinity" in err and "is it" not in err, err


_HANDLER = """
import sys
from circle_jax.cli import info, main
def run(args):
    for _ in range(int(sys.argv[1])):
        print("a line of output")
    return 5
info.run = run
sys.exit(main(["info", "model.circle"]))
"""


@pytest.mark.parametrize("lines", [1, 100_000], ids=["cut-at-the-end", "cut-during-the-work"])
def test_a_closed_pipe_keeps_the_status_of_the_work(lines: int) -> None:
    """Output still buffered when the command ends, or cut during the work (more than a
    pipe holds): the work goes on and the command exits with its own status (compare's
    verdict), quietly. (Standard output buffered, as by default: PYTHONUNBUFFERED unset.)"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = _into_closed_pipe([sys.executable, "-c", _HANDLER, str(lines)], env=env)
    assert (p.returncode, p.stderr) == (5, "")  # the handler's own status


def test_golden_overlay_clashing_with_its_outputs_is_refused_before_any_work(files, tmp_path,
                                                                            capsys) -> None:
    """--overlay the -o directory itself, or a file golden writes in it: one line naming
    --overlay, and nothing written."""
    np.save(tmp_path / "x.npy", digits16()[0][:2])
    out = tmp_path / "out"
    argv = ["golden", files["cnn.circle"], "--input", str(tmp_path / "x.npy"), "-o", str(out)]
    assert main([*argv, "--overlay", str(out)]) == 1
    assert "cannot write --overlay" in _one_error(capsys) and not out.exists()
    out.mkdir()
    for name in ("index.json", "input.h5"):
        assert main([*argv, "--overlay", str(out / name)]) == 1
        assert f"golden writes '{name}'" in _one_error(capsys)
    assert os.listdir(out) == []


def test_compare_refuses_one_path_for_report_and_overlay(files, tmp_path, capsys) -> None:
    r = str(tmp_path / "r.json")
    argv = ["compare", files["cnn.circle"], "--load_input:raw", files["x.raw"],
            "--load_expected:raw", files["y.raw"], "--report", r, "--overlay", r]
    assert main(argv) == 3
    assert "--report and --overlay both write" in _one_error(capsys)
    assert not os.path.exists(r)


@pytest.mark.parametrize("flag, value", [("--atol", "-1"), ("--rtol", "-0.5"),
                                         ("--atol", "nan")])
def test_compare_refuses_a_negative_tolerance_as_a_bad_flag(files, capsys, flag,
                                                             value) -> None:
    argv = ["compare", files["cnn.circle"], "--load_input:raw", files["x.raw"],
            "--load_expected:raw", files["y.raw"], flag, value]
    assert main(argv) == 3
    assert f"{flag} must be a number >= 0, got {float(value)}" in _one_error(capsys)


def test_an_output_under_a_regular_file_names_that_file(files, tmp_path, capsys,
                                                        monkeypatch) -> None:
    """-o afile/out and --overlay afile/ov.json, afile a regular file: one line saying
    'afile' is a file (not an errno, nor that it does not exist)."""
    monkeypatch.chdir(tmp_path)
    np.save("x.npy", digits16()[0][:2])
    (tmp_path / "afile").write_text("")
    golden = ["golden", files["cnn.circle"], "--input", "x.npy"]
    for argv, flag, path in (([*golden, "-o", "afile/out"], "-o", "afile/out"),
                             ([*golden, "-o", "g", "--overlay", "afile/ov.json"], "--overlay",
                              "afile/ov.json"),
                             (["run", files["cnn.circle"], "--input", "x.npy",
                               "--output_dir", "afile/a/b"], "--output_dir", "afile/a/b")):
        assert main(argv) == 1
        assert (f"E: cannot write {flag} '{path}': 'afile' is a file, expected a directory"
                in _one_error(capsys))
    assert sorted(os.listdir(tmp_path)) == ["afile", "x.npy"]
