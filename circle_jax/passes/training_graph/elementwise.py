"""Backward rules of elementwise operators: arithmetic with numpy broadcasting and fused
activations, and the activation operators, each from its output where that is enough.

- ADD / SUB: the cotangent (negated for SUB's subtrahend) summed over each operand's
  broadcast axes; MUL: ``g * other operand``; DIV: ``g / d`` and ``-g * n / d**2``.
- RELU / RELU6 / RELU_N1_TO_1: the cotangent strictly inside the linear range (TF's rule);
  LOGISTIC ``g * y * (1 - y)``; TANH ``g * (1 - y * y)``; LEAKY_RELU ``g`` where
  ``x > 0`` else ``alpha * g``.
- SOFTMAX ``y = softmax(beta * x)``: ``beta * y * (g - sum(g * y, last axis))``.
- A converted LayerNorm's and RMSNorm's: NEG ``-g``; SQUARED_DIFFERENCE ``(a - b)**2``:
  ``2 g (a - b)`` and its negation, each summed over its broadcast axes; RSQRT
  ``y = x**-0.5``: ``-0.5 g y**3``; SQRT ``g * 0.5 / y``; SQUARE ``2 g x``; EXP ``g y``;
  LOG ``g / x``.
- MAXIMUM / MINIMUM: ``g`` to the first operand where it is selected, ties included
  (``x >= y`` / ``x <= y``, TF's mask), to the second elsewhere, each summed over its
  broadcast axes.
- PRELU ``y = x`` where ``x > 0`` else ``alpha * x`` (alpha broadcast): the input's
  ``g`` where ``x > 0`` else ``alpha * g``; alpha's ``g * x`` where ``x <= 0``, summed over
  its broadcast axes.
"""

from __future__ import annotations

from .rule import Backward, Cotangents, Rule, activation_backward, clamp_backward


def add(b: Backward) -> Cotangents:
    gz = activation_backward(b)
    return {p: b.e.unbroadcast(gz, b.shape(p)) for p in (0, 1) if p in b.wanted}


def sub(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    out: Cotangents = {}
    if 0 in b.wanted:
        out[0] = e.unbroadcast(gz, b.shape(0))
    if 1 in b.wanted:
        out[1] = e.unbroadcast(e.unary("NEG", gz), b.shape(1))
    return out


def mul(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    return {p: e.unbroadcast(e.mul(gz, b.x(1 - p)), b.shape(p)) for p in (0, 1)
            if p in b.wanted}


def div(b: Backward) -> Cotangents:
    e = b.e
    gz = activation_backward(b)
    gn = e.div(gz, b.x(1))
    out: Cotangents = {}
    if 0 in b.wanted:
        out[0] = e.unbroadcast(gn, b.shape(0))
    if 1 in b.wanted:  # -g * n / d**2 = -(g / d) * (n / d)
        ratio = e.div(b.x(0), b.x(1))
        out[1] = e.unbroadcast(e.unary("NEG", e.mul(gn, ratio)), b.shape(1))
    return out


def _select(comparison: str) -> Rule:
    def backward(b: Backward) -> Cotangents:
        e = b.e
        first = e.mask(comparison, b.x(0), b.x(1))
        out: Cotangents = {}
        if 0 in b.wanted:
            out[0] = e.unbroadcast(e.mul(b.grad, first), b.shape(0))
        if 1 in b.wanted:
            out[1] = e.unbroadcast(e.mul(b.grad, e.sub(e.scalar(1.0), first)), b.shape(1))
        return out

    return Rule(backward)


def _clamp(lo: float | None, hi: float | None) -> Rule:
    return Rule(lambda b: {0: clamp_backward(b.e, b.y, b.grad, lo, hi)})


def logistic(b: Backward) -> Cotangents:
    e = b.e
    return {0: e.mul(b.grad, e.mul(b.y, e.sub(e.scalar(1.0), b.y)))}


def tanh(b: Backward) -> Cotangents:
    e = b.e
    return {0: e.mul(b.grad, e.sub(e.scalar(1.0), e.mul(b.y, b.y)))}


def leaky_relu(b: Backward) -> Cotangents:
    e = b.e
    alpha = float(b.op.options.alpha or 0.0)
    positive = e.mask("GREATER", b.x(0), e.scalar(0.0))
    # 1 where x > 0, alpha elsewhere: alpha + (1 - alpha) * [x > 0]
    slope = e.add(e.scalar(alpha), e.scale(positive, 1.0 - alpha))
    return {0: e.mul(b.grad, slope)}


def softmax(b: Backward) -> Cotangents:
    e = b.e
    beta = float(b.op.options.beta or 1.0)
    gy = e.mul(b.grad, b.y)
    dot = e.reduce("SUM", gy, [-1], keep_dims=True)
    return {0: e.scale(e.sub(gy, e.mul(b.y, dot)), beta)}


def neg(b: Backward) -> Cotangents:
    return {0: b.e.unary("NEG", b.grad)}


def squared_difference(b: Backward) -> Cotangents:
    e = b.e
    ga = e.scale(e.mul(b.grad, e.sub(b.x(0), b.x(1))), 2.0)
    out: Cotangents = {}
    if 0 in b.wanted:
        out[0] = e.unbroadcast(ga, b.shape(0))
    if 1 in b.wanted:
        out[1] = e.unbroadcast(e.unary("NEG", ga), b.shape(1))
    return out


def rsqrt(b: Backward) -> Cotangents:
    e = b.e
    return {0: e.scale(e.mul(b.grad, e.mul(b.y, e.mul(b.y, b.y))), -0.5)}


def sqrt(b: Backward) -> Cotangents:
    e = b.e
    return {0: e.div(e.scale(b.grad, 0.5), b.y)}


def square(b: Backward) -> Cotangents:
    e = b.e
    return {0: e.scale(e.mul(b.grad, b.x(0)), 2.0)}


def exp(b: Backward) -> Cotangents:
    return {0: b.e.mul(b.grad, b.y)}


def log(b: Backward) -> Cotangents:
    return {0: b.e.div(b.grad, b.x(0))}


def prelu(b: Backward) -> Cotangents:
    e = b.e
    positive = e.mask("GREATER", b.x(0), e.scalar(0.0))
    rest = e.sub(e.scalar(1.0), positive)
    out: Cotangents = {}
    if 0 in b.wanted:  # 1 where x > 0, alpha elsewhere
        slope = e.add(positive, e.mul(rest, b.x(1)))
        out[0] = e.unbroadcast(e.mul(b.grad, slope), b.shape(0))
    if 1 in b.wanted:
        out[1] = e.unbroadcast(e.mul(e.mul(b.grad, b.x(0)), rest), b.shape(1))
    return out


RULES = {
    "ADD": Rule(add), "SUB": Rule(sub), "MUL": Rule(mul), "DIV": Rule(div),
    "RELU": _clamp(0.0, None), "RELU6": _clamp(0.0, 6.0), "RELU_N1_TO_1": _clamp(-1.0, 1.0),
    "LOGISTIC": Rule(logistic), "TANH": Rule(tanh), "LEAKY_RELU": Rule(leaky_relu),
    "SOFTMAX": Rule(softmax), "NEG": Rule(neg),
    "SQUARED_DIFFERENCE": Rule(squared_difference), "RSQRT": Rule(rsqrt), "SQRT": Rule(sqrt),
    "SQUARE": Rule(square), "EXP": Rule(exp), "LOG": Rule(log), "PRELU": Rule(prelu),
    "MAXIMUM": _select("GREATER_EQUAL"), "MINIMUM": _select("LESS_EQUAL"),
}
