"""Google's Model Explorer (the optional ``ai-edge-model-explorer`` package): per-operator
node data built with its own classes (``model_explorer.node_data_builder``), and its local
web server showing a model with such overlays.

How Model Explorer names what it draws (its built-in TFLite adapter,
``builtin_tflite_flatbuffer``, run on every shared model and the Keras test models:
tests/oracle/test_overlay.py):

- it reads TFL3 files only: a Circle file is shown through a TFL3 copy written by
  circle-jax's writer (same operators, tensors, names and order);
- a subgraph's graph id is its name; an unnamed subgraph takes the key of the first
  SignatureDef naming it, else ``"main"`` (subgraph 0) or ``"subgraph_<k>"``; two subgraphs
  of one name share an id, so their node data cannot be told apart;
- operator ``i`` of a subgraph is node ``"i"``; the graph's inputs, its constants and its
  outputs are further nodes numbered after the operators.

The package is imported only when used; without it `ExplorerMissing` says, in one line, how
to install it.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CircleFormatError, CircleJaxError
from ..graph import ir

INSTALL = 'pip install "circle-jax[explorer]"'
ADAPTER = "builtin_tflite_flatbuffer"
HOST = "127.0.0.1"

#: node colours from the smallest value (stop 0) to the largest (stop 1)
GRADIENT = (("#ffffff", 0.0), ("#ffd54f", 0.5), ("#d32f2f", 1.0))


class ExplorerMissing(CircleJaxError, ImportError):
    """Model Explorer (``ai-edge-model-explorer``) is not installed."""


def explorer(module: str = "node_data_builder") -> Any:
    """``model_explorer.<module>``, or `ExplorerMissing` naming the install command."""
    try:
        return importlib.import_module(f"model_explorer.{module}")
    except ImportError as e:
        raise ExplorerMissing(f"Model Explorer is not installed ({e}); install it with: "
                              f"{INSTALL}") from None


def graph_id(model: ir.Model, k: int = 0) -> str:
    """Model Explorer's id of subgraph ``k`` (the rules in the module docstring)."""
    name = model.subgraphs[k].name
    if name:
        return name
    keys = [s.key for s in model.signature_defs if s.subgraph_index == k]
    if keys:
        return keys[0]
    return "main" if k == 0 else f"subgraph_{k}"


def node_data(model: ir.Model, values: Mapping[int, float], name: str, k: int = 0, *,
              log_scale: bool = False) -> Any:
    """A ``ModelNodeData`` giving operator ``i`` of subgraph ``k`` the value ``values[i]``,
    coloured by the `GRADIENT` from the smallest value to the largest: linearly in the
    value (Model Explorer's own gradient), or with ``log_scale`` linearly in its logarithm
    (each node's colour set here; values <= 0 take the first colour). Non-finite values
    are left out (a browser cannot parse NaN in JSON)."""
    ndb = explorer()
    finite = {i: float(v) for i, v in sorted(values.items()) if math.isfinite(v)}
    colours = _log_colours(finite) if log_scale else {}
    results = {str(i): ndb.NodeDataResult(value=v, bgColor=colours.get(i))
               for i, v in finite.items()}
    gradient = [ndb.GradientItem(stop=stop, bgColor=colour) for colour, stop in GRADIENT]
    graph = ndb.GraphNodeData(results=results, name=name, gradient=gradient)
    return ndb.ModelNodeData(graphsData={graph_id(model, k): graph})


def _log_colours(values: Mapping[int, float]) -> dict[int, str]:
    """The `GRADIENT` colour of each value, placed linearly in log10 between the smallest
    and the largest positive value."""
    logs = {i: math.log10(v) for i, v in values.items() if v > 0}
    lo, hi = min(logs.values(), default=0.0), max(logs.values(), default=0.0)
    return {i: _colour_at((logs[i] - lo) / (hi - lo) if i in logs and hi > lo else
                          float(i in logs)) for i in values}


def _colour_at(t: float) -> str:
    """The `GRADIENT` colour at stop ``t`` (0..1), interpolated in RGB."""
    for (c0, s0), (c1, s1) in zip(GRADIENT, GRADIENT[1:]):
        if t <= s1:
            f = (t - s0) / (s1 - s0)
            a, b = (tuple(int(c[j:j + 2], 16) for j in (1, 3, 5)) for c in (c0, c1))
            return "#" + "".join(f"{round(x + f * (y - x)):02x}" for x, y in zip(a, b))
    return GRADIENT[-1][0]


def read_overlay(path: str | os.PathLike) -> Any:
    """The ``ModelNodeData`` in the JSON file ``path`` (graph id -> ``GraphNodeData``),
    checked field by field against Model Explorer's classes (dacite, strict); one-line
    `CircleFormatError` when it does not fit."""
    ndb = explorer()
    import dacite  # a dependency of ai-edge-model-explorer

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise CircleFormatError(f"overlay {os.fspath(path)!r}: cannot read it as JSON "
                                f"({(str(e).splitlines() or [''])[0]})") from None
    try:
        return dacite.from_dict(ndb.ModelNodeData, {"graphsData": doc},
                                config=dacite.Config(strict=True))
    except (dacite.DaciteError, TypeError) as e:
        raise CircleFormatError(
            f"overlay {os.fspath(path)!r} is not Model Explorer node data (a JSON object "
            f"of graph id -> GraphNodeData): {(str(e).splitlines() or [''])[0]}") from None


def tflite_path(model: ir.Model, path: str, directory: str) -> str:
    """``path`` itself when it is a TFL3 ``.tflite`` file, else a TFL3 copy of ``model``
    written under ``directory`` with the same base name and ``.tflite``."""
    if model.format == "tflite" and path.endswith(".tflite"):
        return path
    from ..formats.writer import export_model

    base = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    copy = os.path.join(directory, base + ".tflite")
    with open(copy, "wb") as f:
        f.write(export_model(model, file_format="tflite"))
    return copy


def check_port(port: int, host: str = HOST) -> None:
    """Refuse, in one line, a port that is out of range or already taken on ``host``."""
    if not 0 < port < 65536:
        raise CircleJaxError(f"--port must be in 1..65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if s.connect_ex((host, port)) == 0:
            raise CircleJaxError(f"port {port} on {host} is already in use; choose another "
                                 "with --port")


def node_ids(tflite: str) -> dict[str, set[str]]:
    """Graph id -> its node ids, as Model Explorer's built-in TFLite adapter builds them for
    the TFL3 file ``tflite``."""
    adapter = explorer("builtin_tflite_flatbuffer_adapter").BuiltinTfliteFlatbufferAdapter()
    graphs = adapter.convert(tflite, {})["graphCollections"][0].graphs
    return {g["id"]: {n["id"] for n in g["nodes"]} for g in graphs}


def check_nodes(overlays: Mapping[str, Any], tflite: str, path: str) -> None:
    """Refuse, in one line, an overlay (path -> its `read_overlay` data) naming nodes its
    graph lacks in the model shown (an overlay made for another model)."""
    nodes = node_ids(tflite)
    for overlay, model_data in overlays.items():
        for graph, data in model_data.graphsData.items():
            unknown = sorted(set(data.results) - nodes.get(graph, set()),
                             key=lambda i: (len(i), i))
            if unknown:
                shown = ", ".join(map(repr, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
                raise CircleFormatError(
                    f"overlay {overlay!r} names node(s) {shown} that graph "
                    f"{graph!r} of {path!r} does not have (made for another model?)")


def view(path: str | os.PathLike, overlays: Sequence[str | os.PathLike] = (), *,
          port: int = 8080, open_browser: bool = True) -> None:
    """Show the model at ``path`` (.circle/.tflite or an nnpackage directory) in Model
    Explorer on ``http://127.0.0.1:<port>`` with the node data files ``overlays``, until
    interrupted (Ctrl+C). The model and every overlay are read and checked first (an
    overlay naming a graph or a node the model lacks is refused); port 8080 lets Model
    Explorer take the first free port of 8080..8099."""
    from ..formats.nnpackage import nnpackage_model_path
    from ..formats.reader import read_model

    path = os.fspath(path)
    if os.path.isdir(path):
        path = nnpackage_model_path(path)
    model = read_model(path)
    ids = {graph_id(model, k) for k in range(len(model.subgraphs))}
    data = {os.fspath(overlay): read_overlay(overlay) for overlay in overlays}
    for overlay, model_data in data.items():
        missing = sorted(set(model_data.graphsData) - ids)
        if missing:
            raise CircleFormatError(f"overlay {overlay!r} is for graph(s) "
                                    f"{', '.join(map(repr, missing))}; {path!r} has "
                                    f"{', '.join(map(repr, sorted(ids)))}")
    if port != 8080:
        check_port(port)
    apis = explorer("apis")
    with tempfile.TemporaryDirectory(prefix="circle-jax-view-") as tmp:
        shown = tflite_path(model, path, tmp)
        if data:
            check_nodes(data, shown, path)
        config = apis.config().add_model_from_path(shown, adapterId=ADAPTER)
        for overlay in overlays:
            config.add_node_data_from_path(os.fspath(overlay))
        apis.visualize_from_config(config, host=HOST, port=port,
                                   no_open_in_browser=not open_browser)
