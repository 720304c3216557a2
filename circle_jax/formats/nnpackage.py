"""nnpackage directories: the model file named by ``metadata/MANIFEST`` (JAX-free).

An nnpackage is a directory holding model file(s) and ``metadata/MANIFEST``, JSON whose
``"models"`` list names the files (relative to the package) and ``"model-types"`` their kinds.
circle-jax reads single-model packages; its ``"models"`` entry is the model.
"""

from __future__ import annotations

import json
import os

from ..errors import CircleFormatError

MANIFEST = os.path.join("metadata", "MANIFEST")


def nnpackage_model_path(package: str | os.PathLike) -> str:
    """The path of the model file of the nnpackage directory ``package``.

    Refused with one CircleFormatError line: a directory without ``metadata/MANIFEST``, a
    MANIFEST that is not JSON or names no model, a multi-model package, a model file that
    is missing or not circle/tflite.
    """
    root = os.fspath(package)
    manifest = os.path.join(root, MANIFEST)
    try:
        with open(manifest, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise CircleFormatError(f"{root!r} is a directory but not an nnpackage: no "
                                f"{MANIFEST} in it (give a .circle/.tflite file or an "
                                "nnpackage directory)") from None
    except (OSError, ValueError) as e:
        raise CircleFormatError(f"{manifest}: cannot read the nnpackage MANIFEST ({e})") from None
    models = meta.get("models") if isinstance(meta, dict) else None
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise CircleFormatError(f"{manifest}: expected a JSON object whose \"models\" lists the "
                                "package's model files")
    if len(models) > 1:
        raise CircleFormatError(f"{manifest}: {len(models)} models {models}; circle-jax reads "
                                "single-model nnpackages")
    kinds = meta.get("model-types") or []
    if kinds and kinds[0] not in ("circle", "tflite"):
        raise CircleFormatError(f"{manifest}: model type {kinds[0]!r} (expected circle or tflite)")
    path = os.path.join(root, models[0])
    if not os.path.isfile(path):
        raise CircleFormatError(f"{manifest} names {models[0]!r}, which is not a file in the "
                                "package")
    return path
