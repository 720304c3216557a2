"""``eval``: the loss and categorical accuracy of a model over every sample of a labelled set
(no accuracy for mean squared error on targets other than 0/1 values: regression)."""

from __future__ import annotations

import argparse

from .train_args import CIRCLE_PLUS, _flag, add_load_arguments, loss_arguments

NAME = "eval"
HELP = "print the loss and categorical accuracy over every sample of a labelled set"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    g = p.add_argument_group("data (onert_train's flags)")
    for flag, dest, text in (
            ("--load_input:raw", "load_input_raw", "inputs, raw (onert_train's layout)"),
            ("--load_expected:raw", "load_expected_raw", "expected outputs, raw"),
            ("--load_input", "load_input", "inputs, .npy/.npz/raw"),
            ("--load_expected", "load_expected", "expected outputs, .npy/.npz/raw")):
        _flag(g, flag, dest=dest, metavar="FILE", default="none", help=text)
    g = p.add_argument_group("scoring")
    _flag(g, "--batch_size", type=int, metavar="N", default=f"{CIRCLE_PLUS} 32",
          help="samples per compiled batch (every sample is scored; the last batch may be "
          "partial)")
    loss_arguments(g)
    _flag(g, "--from_logits", action="store_true", default=f"{CIRCLE_PLUS} off",
          help="the loss reads logits")
    add_load_arguments(g)


def run(ns: argparse.Namespace) -> int:
    import numpy as np

    from circle_jax.losses import loss_name
    from circle_jax.train import Trainer

    from .common import CliError, load_model
    from .config import data_files, load_options
    from .train import labelled_data

    if ns.batch_size is not None and ns.batch_size < 1:
        raise CliError(f"--batch_size must be >= 1, got {ns.batch_size}")
    model = load_model(ns.model, **load_options(ns, qat=None))  # the file as it is
    trainer = Trainer(model, batch_size=ns.batch_size, loss=ns.loss,
                      reduction=ns.loss_reduction_type,
                      from_logits=True if ns.from_logits else None,
                      ignore_index=ns.ignore_index)
    loss_kind = loss_name(trainer.config.loss)
    sparse = loss_kind == "sparse_categorical_crossentropy"
    xs, y = labelled_data(data_files(ns), model, sparse)
    loss, accuracy = trainer.evaluate(model.params, xs, y)
    batch = f"{len(y)} samples, batch {min(trainer.config.batch_size, len(y))}"
    if loss_kind == "mean_squared_error" and not np.isin(y, (0, 1)).all():
        print(f"loss: {loss:.4f} ({batch}; no accuracy: the targets are not one-hot classes)")
    else:
        print(f"loss: {loss:.4f} - categorical_accuracy: {accuracy:.4f} ({batch})")
    return 0
