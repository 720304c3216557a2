"""The training command line: onert_train's flags exactly as onert_train parses them (names,
arity, defaults, numeric codes), then circle-jax's additions. Every help text states its
default; the code tables come from the library (`LOSS_TABLE`, `REDUCTION_TABLE`,
`OPTIMIZER_TABLE`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from circle_jax.codes import CodeTable
from circle_jax.losses.reduction import REDUCTION_TABLE
from circle_jax.losses.registry import LOSS_TABLE
from circle_jax.optim.optimizers import OPTIMIZER_TABLE

CIRCLE_PLUS = "the model's circle+ value, else"


def _table_type(table: CodeTable) -> Any:
    def parse(text: str) -> str | int:
        try:
            return table.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {table.what} {text!r}: expected onert code {table.code_help(' or ')}"
                f" or a name: {', '.join(table.spellings())}") from None

    return parse


def output_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """onert_train's --output_sizes: a JSON array of (output index, byte size) pairs."""
    try:
        values = json.loads(text)
    except ValueError:
        values = None
    if (not isinstance(values, list) or len(values) % 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                       for v in values)):
        raise argparse.ArgumentTypeError(
            f"invalid --output_sizes {text!r}: expected a JSON array of (output index, byte "
            "size) pairs, e.g. '[0, 40, 2, 80]'")
    return tuple(zip(values[::2], values[1::2]))


def seed_value(text: str) -> int:
    """A ``--seed``: an integer JAX's random keys take (64 bits, signed)."""
    value = int(text)
    if not -(1 << 63) <= value < 1 << 63:
        raise argparse.ArgumentTypeError(f"{text} is outside the 64-bit integers a seed "
                                         "can be")
    return value


def _flag(group: Any, *names: str, default: str, help: str, **kw: Any) -> None:
    """An option whose help ends with its default."""
    group.add_argument(*names, help=f"{help} (default: {default})", **kw)


def add_onert_train_arguments(p: argparse.ArgumentParser) -> None:
    """onert_train's command line: PATH and its options, with onert_train's arity."""
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help=".circle/.tflite file or nnpackage directory (its metadata/MANIFEST "
                   "names the model)")
    g = p.add_argument_group("onert_train options")
    _flag(g, "--epoch", type=int, metavar="N", default=f"{CIRCLE_PLUS} 5",
          help="epochs to train")
    _flag(g, "--batch_size", type=int, metavar="N", default=f"{CIRCLE_PLUS} 32",
          help="samples per step")
    add_step_arguments(g)
    _flag(g, "--metric", type=int, choices=[-1, 0], default="-1", metavar="N",
          help="metric: -1 (none), 0 (categorical accuracy: argmax, first max wins)")
    _flag(g, "--validation_split", type=float, metavar="F", default="0.0",
          help="the LAST fraction (0..1) of the samples validates instead of training")
    _flag(g, "--load_input:raw", dest="load_input_raw", metavar="FILE", default="none",
          help="input data: raw, the model's dtype, samples concatenated (planar for several "
          "inputs)")
    _flag(g, "--load_expected:raw", dest="load_expected_raw", metavar="FILE", default="none",
          help="expected outputs, raw like --load_input:raw")
    for flag, text in (
            ("--checkpoint", "load an onert checkpoint (weights, Adam m/v, step) before training"),
            ("--export_circle", "write the trained model"),
            ("--export_circleplus", "write the trained model with its training parameters "
             "(circle+)"),
            ("--export_checkpoint", "write an onert checkpoint after every epoch")):
        _flag(g, flag, metavar="FILE", default="none", help=text)
    _flag(g, "-m", "--mem_poll", action="store_true", default="off",
          help="print the process's memory (RSS at the end of each phase, peak) after the "
          "timing summary")
    _flag(g, "-v", "--verbose_level", type=int, choices=[0, 1, 2], default="0", metavar="N",
          help="0 results only; 1 also messages between phases (loading, compiling, data, "
          "files written) on stderr; 2 everything (trainable params, devices, XLA compiles)")
    _flag(g, "--output_sizes", type=output_sizes, metavar="JSON", default="the model's sizes",
          help="onert's output buffer sizes, a JSON array of (index, bytes) pairs such as "
          "'[0, 40, 2, 80]'; checked against the model's outputs (circle-jax sizes outputs "
          "from the model)")


def add_step_arguments(g: Any) -> None:
    """What one optimizer step needs, onert_train's flags: learning rate, loss, reduction,
    optimizer, trainable operators."""
    _flag(g, "--learning_rate", type=float, metavar="F", default=f"{CIRCLE_PLUS} 0.001",
          help="learning rate")
    loss_arguments(g)
    _table_flag(g, "--optimizer", OPTIMIZER_TABLE, "sgd")
    for flag, text in (("beta1", "Adam/AdamW's first-moment decay"),
                       ("beta2", "Adam/AdamW's second-moment decay"),
                       ("epsilon", "Adam/AdamW/RMSprop's epsilon"),
                       ("weight_decay", "AdamW's decoupled decay; torch profile: also SGD, "
                        "Adam and RMSprop's L2 term"),
                       ("momentum", "SGD and RMSprop's momentum")):
        _flag(g, f"--{flag}", type=float, metavar="F",
              default="the optimizer's for the profile (printed in the parameter block)",
              help=f"{text}; an optimizer that does not take it refuses it")
    _flag(g, "--num_of_trainable_ops", type=int, metavar="N", default=f"{CIRCLE_PLUS} -1",
          help="-1 all, 0 none, N the last N operators in circle order")


def loss_arguments(g: Any) -> None:
    """--loss and --loss_reduction_type, onert_train's codes or names; --ignore_index."""
    _table_flag(g, "--loss", LOSS_TABLE, "mse")
    _table_flag(g, "--loss_reduction_type", REDUCTION_TABLE, "sum over batch size")
    _flag(g, "--ignore_index", type=int, metavar="LABEL", default="none",
          help="with sparse_categorical_crossentropy: the label of positions that do not "
          "count (a sequence's padding); the loss is the mean over the other tokens")


def _table_flag(g: Any, flag: str, table: CodeTable, default: str) -> None:
    _flag(g, flag, type=_table_type(table), metavar="CODE|NAME",
          default=f"{CIRCLE_PLUS} {default}",
          help=f"{table.what}: onert code {table.code_help()}; or a name: "
          f"{', '.join(table.spellings())}")


def add_selection_arguments(g: Any) -> None:
    """circle-jax's choices of what trains and what the loss reads."""
    _flag(g, "--loss_output", metavar="INDEX|NAME", default="0",
          help="the model output the loss is computed on (its index or tensor name); the "
          "expected data has that output's shape")
    _flag(g, "--trainable", action="append", metavar="NAMES", default="all params",
          help="train only these params: names or aliases such as op3.bias (comma-separated, "
          "repeatable; `circle-jax info MODEL` lists them); replaces --num_of_trainable_ops")
    _flag(g, "--from_logits", action="store_true", default=f"{CIRCLE_PLUS} off",
          help="the loss reads logits")


def add_circle_jax_arguments(p: argparse.ArgumentParser) -> None:
    """circle-jax's additions to onert_train's command line."""
    g = p.add_argument_group("circle-jax additions")
    _flag(g, "--example", action="store_true", default="off",
          help="train the bundled branching CNN on the bundled 8x8 digits (20 epochs, batch 32, "
          "adam, cce, metric 0, validation 0.2 unless given)")
    for flag, text in (("--load_input", ".npy/.npz/raw input data"),
                       ("--load_expected", ".npy/.npz/raw expected data"),
                       ("--export_tflite", "write the trained model as .tflite (LiteRT runs it)"),
                       ("--export_wof", "write the trained weights as .wof")):
        _flag(g, flag, metavar="FILE", default="none", help=text)
    _flag(g, "--checkpoint_every_steps", type=int, metavar="N", default="every epoch",
          help="rewrite --export_checkpoint every N steps")
    _flag(g, "--checkpoint_order", choices=["auto", "onert", "ascending"], default="auto",
          help="entry order of --export_checkpoint: onert's (asks the onert wheel; "
          "onert_train imports it), ascending tensor index, or auto (onert's when the wheel "
          "can tell)")
    add_selection_arguments(g)
    add_load_arguments(g)
    add_personalize_arguments(p.add_argument_group("personalizing (docs/personalizing.md)"))
    _flag(g, "--seed", type=seed_value, default="0", help="shuffling seed; seeds a new head and "
          "LoRA adapters too")
    _flag(g, "--shuffle", action="store_true", default="off (onert's sequential batches)",
          help="shuffle the samples every epoch")
    _flag(g, "--keep_remainder", action="store_true", default="off (onert drops it)",
          help="train on a trailing partial batch")
    _flag(g, "--accumulate", type=int, metavar="K", default="1",
          help="micro-batches accumulated per update")
    _flag(g, "--accumulate_mode", choices=["stream", "in_step"], default="stream",
          help="stream: each step is a micro-batch; in_step: each batch splits into K")
    _flag(g, "--precision", metavar="POLICY", default="float32",
          help="precision policy, e.g. p=f32,c=bf16,o=f32")
    _flag(g, "--loss_scale", metavar="none|dynamic|FLOAT", default="none",
          help="loss scaling")
    _flag(g, "--on_overflow", choices=["skip", "retry"], default="skip",
          help="what a step with non-finite scaled gradients does")
    _flag(g, "--devices", type=int, metavar="N", default="1 (all of them in a multi-process "
          "run)", help="shard every batch over N devices (data parallel; the batch size must "
          "be a multiple of N; CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    _flag(g, "--coordinator_address", metavar="HOST:PORT", default="none (one process)",
          help="multi-process training: process 0's address, the same in every process")
    _flag(g, "--num_processes", type=int, metavar="N", default="none",
          help="multi-process training: how many processes take part")
    _flag(g, "--process_id", type=int, metavar="K", default="none",
          help="multi-process training: this process's id, 0..N-1 (0 prints and writes files)")
    _flag(g, "--compile_cache", metavar="DIR|off", default="$CIRCLE_JAX_CACHE, else "
          "$XDG_CACHE_HOME/circle-jax/xla or ~/.cache/circle-jax/xla",
          help="JAX's persistent compilation cache: a repeated run of the same model and "
          "flags skips XLA's compile; 'off' disables it")


def add_load_arguments(g: Any) -> None:
    """How the model is loaded: the numerics profile and its overrides (train and export)."""
    _flag(g, "--numerics", choices=["onert", "keras", "onert-micro", "torch"], default="onert",
          help="numerics profile: untied shared constants, added biases, how CCE reads the "
          "output, the optimizers' numerics (torch: torch.optim's) (docs/numerics.md)")
    _flag(g, "--tie_shared_weights", action="store_true", default="the profile's (onert: off)",
          help="train a constant read by several operators as one weight, not one copy "
          "per reading operator")
    _flag(g, "--add_missing_bias", metavar="none|all|ALIASES",
          default="the profile's: keras, torch all; onert, onert-micro none",
          help="give weighted operators without a bias a zero one that trains: all of them, "
          "none, or those named (op3,op5: operators `circle-jax info` lists as missing one)")
    _flag(g, "--signature", metavar="KEY", default="subgraph 0",
          help="use this SignatureDef's subgraph (`circle-jax info` lists the keys)")
    _flag(g, "--restore", metavar="CKPT", default="the file's initial values",
          help="an on-device training file: its variables take what its own restore "
          "signature reads from this TF V1 checkpoint")
    _flag(g, "--dequantize", action="store_true", default="off (only weight-only quantized "
          "models are, and export in their own layout)",
          help="make every quantized tensor float32: a float model runs, trains and is "
          "exported (docs/quantized.md)")
    _flag(g, "--qat", choices=["on", "off"], default="on; eval: neither, the file's integer "
          "kernels",
          help="a fully quantized (integer) model trains by quantization-aware training and "
          "exports as an integer model (on), or trains dequantized in float (off)")
    _flag(g, "--qat_forward", choices=["integer", "fake_quant"],
          default="integer; fake_quant with --qat_ranges ema",
          help="QAT's forward values: the integer kernels', what the exported file computes "
          "(integer), or the fake-quant float graph's (fake_quant); gradients are the "
          "fake-quant graph's either way")
    _flag(g, "--qat_ranges", choices=["file", "ema"], default="file",
          help="QAT's activation ranges: the file's scales and zero points (file), or "
          "re-estimated each step by moving min/max as TF's QAT does (ema; needs the "
          "fake_quant forward), which export writes")
    _flag(g, "--qat_range_decay", type=float, metavar="D", default="0.999 (TF's)",
          help="with --qat_ranges ema: range = range * D + batch range * (1 - D), D in [0, 1)")


def add_personalize_arguments(g: Any, seed: bool = False) -> None:
    """A new classifier head and LoRA adapters (`circle_jax.Model.personalize`)."""
    _flag(g, "--new_head", type=int, metavar="K", default="none",
          help="replace the classifier head by a fresh K-class one, which alone trains "
          "unless --trainable / --num_of_trainable_ops add more")
    _flag(g, "--lora", type=int, metavar="R", default="none",
          help="add rank-R LoRA adapters; only they (and a new head) train, the base "
          "weights are frozen")
    _flag(g, "--lora_alpha", type=float, metavar="A", default="R",
          help="LoRA scale numerator: the adapters' product is scaled by A/R")
    _flag(g, "--lora_targets", metavar="ALIASES|fc|conv|matmul|all", default="all",
          help="the operators given adapters: kinds or weight names/aliases, comma-separated")
    _flag(g, "--export_unmerged", action="store_true", default="off (adapters merged into "
          "the weights)", help="write the exported models with the adapter operators")
    if seed:
        _flag(g, "--seed", type=seed_value, default="0", help="the seed of the new head and "
              "adapters (as the run that wrote the weights)")
