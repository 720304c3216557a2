"""``info``: a model's summary, its params with their short aliases, the graph passes a
default load runs and what they change, unsupported operators; for a file with signatures,
each with its inputs and outputs (and the Flex operators it runs), its resource variables
(dtype, shape, initialised or not) and its Flex operators."""

from __future__ import annotations

import argparse

NAME = "info"
HELP = "print a model's summary and its params' aliases (op3.bias)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")


def params_table(model: object, param_keys: dict) -> str:
    """One line per param: alias, dtype/shape, tensor name (aliases work wherever names do)."""
    from circle_jax.graph.aliases import alias_table, param_aliases

    aliases = param_aliases(model, param_keys)  # type: ignore[arg-type]
    others: dict[str, list[str]] = {}
    for alias, name in alias_table(model, param_keys).items():  # type: ignore[arg-type]
        if alias != aliases[name]:
            others.setdefault(name, []).append(alias)
    lines = [f"\nparams ({len(param_keys)}; aliases are accepted wherever names are):"]
    for name in aliases:  # in operator order
        k, i = param_keys[name]
        t = model.subgraphs[k].tensors[i]  # type: ignore[attr-defined]
        also = f" (also {', '.join(others[name])})" if name in others else ""
        lines.append(f"  {aliases[name]:14} {t.dtype}{list(t.shape)!s:16} {name}{also}")
    return "\n".join(lines)


def trainability(model: object, param_keys: dict) -> str:
    """Each param trainable or frozen with the reason (default policy), and the shared
    constants a default load unties."""
    from circle_jax.graph.params_policy import classify_params, describe_roles, shared_constants

    roles = classify_params(model, param_keys)  # type: ignore[arg-type]
    shapes = {n: model.subgraphs[k].tensors[i].shape  # type: ignore[attr-defined]
              for n, (k, i) in param_keys.items()}
    lines = [describe_roles(roles, shapes)]
    by_key = {key: name for name, key in param_keys.items()}
    for key, ops in shared_constants(model, param_keys, roles).items():  # type: ignore[arg-type]
        lines.append(f"  shared: {by_key[key]} is read by operators {ops}: one param per "
                     "reader (--tie_shared_weights keeps one)")
    return "\n".join(lines)


def default_passes(model: object) -> str:
    """What the passes of a default `load` (the onert profile) change in ``model``."""
    from circle_jax.numerics import get_numerics
    from circle_jax.passes import pipeline, run, weight_only

    prof = get_numerics(None)
    done = run(model, pipeline(dequantize=weight_only(model),  # type: ignore[arg-type]
                               untie=not prof.tie_shared_weights,
                               add_bias=prof.add_missing_bias, policy=prof.trainable_policy))
    lines = [f"graph passes of a default load ({prof.name} profile):"]
    return "\n".join(lines + [line for r in done.passes for line in r.describe()])


def missing_bias_line(model: object) -> str | None:
    """The weighted operators without a bias, which --add_missing_bias may give one; None
    when there are none."""
    from circle_jax.graph.params_policy import missing_biases

    ops = model.main.operators  # type: ignore[attr-defined]
    found = [f"op{j} ({ops[j].key})" for j, _, _ in missing_biases(model)]  # type: ignore[arg-type]
    if not found:
        return None
    return (f"without a bias: {', '.join(found)}; --add_missing_bias all|none|ALIASES gives "
            "them a zero one that trains (keras and torch profiles: all)")


def _spec(t: object) -> str:
    return f"{t.dtype}{list(t.shape)}"  # type: ignore[attr-defined]


def signatures_section(model: object) -> str | None:
    """Each signature with its inputs and outputs and the Flex operators it runs (those
    without a kernel marked), the variables, the Flex operators; None for a model with
    neither signatures nor variables."""
    from circle_jax.graph.variables import flex_op, init_subgraphs, variables
    from circle_jax.ops.registry import definition
    from circle_jax.passes import reachable

    sigs = model.signature_defs  # type: ignore[attr-defined]
    found = variables(model)  # type: ignore[arg-type]
    if not sigs and not found:
        return None
    subgraphs = model.subgraphs  # type: ignore[attr-defined]
    lines = [f"signatures ({len(sigs)}):"]
    flex_all: dict[str, list[str]] = {}
    for s in sigs:
        sg = subgraphs[s.subgraph_index]
        ins = ", ".join(f"{n}: {_spec(sg.tensors[i])}" for n, i in s.inputs.items())
        outs = ", ".join(f"{n}: {_spec(sg.tensors[i])}" for n, i in s.outputs.items())
        within = reachable(model, s.subgraph_index)  # type: ignore[arg-type]
        flex = sorted({name for k in within for op in subgraphs[k].operators
                       if (name := flex_op(op)) is not None})
        for name in flex:
            flex_all.setdefault(name, []).append(s.key)
        missing = [n for n in flex if definition(f"CUSTOM:Flex{n}") is None]
        note = f"  [Flex: {', '.join(flex)}" + (
            f"; no kernel for {', '.join(missing)}: refused]" if missing else "]") if flex else ""
        lines.append(f"  {s.key}({ins}) -> {outs}  (subgraph {s.subgraph_index}){note}")
    inits = init_subgraphs(model)  # type: ignore[arg-type]
    done = sum(v.initialised for v in found.values())
    if found:
        lines.append(f"\nvariables ({len(found)}; {done} initialised by init subgraph(s) "
                     f"{', '.join(map(str, inits)) or 'none'}"
                     + ("; the others hold nothing until a signature such as restore assigns "
                        "them" if done < len(found) else "") + "):")
    for v in found.values():
        state = "initialised" if v.initialised else "not initialised"
        lines.append(f"  {v.name:28} {v.dtype + str(list(v.shape)):20} {state}")
    if flex_all:
        lines.append(f"\nFlex operators ({len(flex_all)}):")
        for name, keys in sorted(flex_all.items()):
            kernel = "kernel registered" if definition(f"CUSTOM:Flex{name}") is not None \
                else "no kernel"
            lines.append(f"  Flex{name} (TF op {name}; {kernel}): in {', '.join(keys)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from circle_jax.formats.reader import read_model
    from circle_jax.lowering.interpreter import param_table, unsupported_operators
    from circle_jax.model import summarize
    from circle_jax.passes import pipeline, weight_only
    from circle_jax.passes import run as run_passes

    m = read_model(args.model)
    # params as a default load has them: a weight-only quantized model's dequantized (the
    # pass keeps tensor indices, so the summary of the file counts them too)
    floats = run_passes(m, pipeline(dequantize=weight_only(m)))
    keys = param_table(floats)
    print(summarize(m, keys))
    print(params_table(floats, keys))
    print("\n" + trainability(floats, keys))
    print("\n" + default_passes(m))
    bias = missing_bias_line(m)
    if bias:
        print(bias)
    section = signatures_section(m)
    if section:
        print("\n" + section)
    missing = unsupported_operators(m)
    if missing:
        print(f"\nunsupported operators ({len(missing)}): " + "; ".join(missing))
    return 0
