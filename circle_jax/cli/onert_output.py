"""onert_train's console output: the parameter block, the epoch lines, the timing summary
(and, with ``-m``, a memory block), plus the transient lines circle-jax adds on stderr
("compiling…"; the epoch bar is tqdm's). Formatting only: nothing here trains or
measures."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RULE = "==================================="


def parameter_block(learning_rate: float, batch_size: int, loss: str, reduction: str,
                    optimizer: str, trainable_ops: int | None, extra: dict[str, str]) -> str:
    """onert_train's ``== training parameter ==`` block; ``extra`` lines follow onert's.
    ``trainable_ops`` None (trainable params chosen by name, which no count of last
    operators says) leaves onert's ``num_of_trainable_ops`` line out."""
    ops = {} if trainable_ops is None else {"num_of_trainable_ops": str(trainable_ops)}
    rows = {"learning_rate": f"{learning_rate:g}", "batch_size": str(batch_size),
            "loss_info": f"{{loss = {loss.replace('_', ' ')}, reduction = "
                         f"{reduction.replace('_', ' ')}}}",
            "optimizer": optimizer, **ops, **extra}
    lines = ["== training parameter ==", *(f"- {k:20} = {v}" for k, v in rows.items()),
             "========================"]
    return "\n".join(lines)


@dataclass(frozen=True)
class EpochResult:
    """What one epoch line shows (``None``: not measured, not printed)."""

    epoch: int  # 1-based
    epochs: int
    ms_per_step: float
    loss: float
    accuracy: float | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    extra: dict[str, str] = field(default_factory=dict)


def epoch_line(r: EpochResult) -> str:
    """``Epoch 1/5 - time: 0.225ms/step - loss: [0] 0.0340 - ...`` (4 decimals)."""
    parts = [f"Epoch {r.epoch}/{r.epochs}", f"time: {r.ms_per_step:.3f}ms/step",
             f"loss: [0] {r.loss:.4f}"]
    if r.accuracy is not None:
        parts.append(f"categorical_accuracy: [0] {r.accuracy:.4f}")
    if r.val_loss is not None:
        parts.append(f"val_loss: [0] {r.val_loss:.4f}")
        if r.val_accuracy is not None:
            parts.append(f"val_categorical_accuracy: [0] {r.val_accuracy:.4f}")
    parts.extend(f"{k}: {v}" for k, v in r.extra.items())
    return " - ".join(parts)


@dataclass(frozen=True)
class Timing:
    """The phases of a run in milliseconds, and what they hold.

    ``prepare_ms`` covers reading the data and compiling the training epoch (``compile_ms``
    of it; ``loaded``: its compiled programs all came from the cache); ``execute_ms`` the
    epochs (steps, validation, checkpoint writes), compile excluded; ``epoch_ms`` each
    epoch; ``first_epoch_note`` what epoch 1 holds beyond steady-state steps (the compiled
    epoch's first run), empty when nothing.
    """

    load_ms: float
    prepare_ms: float
    execute_ms: float
    epoch_ms: Sequence[float]
    compile_ms: float = 0.0
    cache: str = "off"  # "off", or the persistent compilation cache's directory
    first_epoch_note: str = ""
    loaded: bool = False


def timing_summary(t: Timing) -> str:
    """onert_train's timing block, then one legend line saying what each phase contains."""
    lines = [RULE, f"{'MODEL_LOAD':12} takes {t.load_ms:.4f} ms",
             f"{'PREPARE':12} takes {t.prepare_ms:.4f} ms",
             f"{'EXECUTE':12} takes {t.execute_ms:.4f} ms"]
    for i, ms in enumerate(t.epoch_ms):
        note = f" ({t.first_epoch_note})" if i == 0 and t.first_epoch_note else ""
        lines.append(f"- {'Epoch ' + str(i + 1):12} takes {ms:.4f} ms{note}")
    lines.append(RULE)
    cache = "persistent cache off" if t.cache == "off" else f"persistent cache {t.cache}"
    epoch = ("the training epoch loaded from the cache" if t.loaded
             else "XLA compile of the training epoch")
    epochs = "the epoch's" if len(t.epoch_ms) == 1 else f"the {len(t.epoch_ms)} epochs'"
    lines.append(f"(PREPARE: data + {epoch} {t.compile_ms:.1f} ms, "
                 f"{cache}; EXECUTE: {epochs} steps, validation and checkpoints, compile "
                 "excluded)")
    return "\n".join(lines)


def memory_summary(rss_kb: dict[str, int], peak_kb: int) -> str:
    """The ``-m`` block: resident memory at the end of each phase and the peak, in KB."""
    lines = ["RSS (at the end of each phase)"]
    lines += [f"{phase:12} takes {kb} kb" for phase, kb in rss_kb.items()]
    lines += [f"{'PEAK':12} takes {peak_kb} kb", RULE]
    return "\n".join(lines)


class Ticker:
    """Calls ``tick()`` every ``every_s`` seconds from a daemon thread until `stop`."""

    def __init__(self, tick: Callable[[], object], every_s: float = 1.0) -> None:
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(tick, every_s), daemon=True)
        self._thread.start()

    def _run(self, tick: Callable[[], object], every_s: float) -> None:
        while not self._done.wait(every_s):
            tick()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def clear_line(stream: object = None) -> None:
    """Erase a transient line (progress bar, ticker) before printing a result line."""
    print("\r\033[K", end="", flush=True, file=stream or sys.stdout)


class CompileNotice:
    """A "compiling… 3 s" line on stderr while a long compile runs.

    On a terminal the line appears after ``after_s`` and updates every second, then is
    erased; elsewhere (with ``-v``) one line when it starts and one with the elapsed time
    when it ends.
    """

    def __init__(self, what: str, terminal: bool, verbose: bool, after_s: float = 1.0) -> None:
        self.what, self.terminal, self.verbose, self.after_s = what, terminal, verbose, after_s
        self._shown = self._stopped = False
        self._t0 = time.perf_counter()
        self._ticker: Ticker | None = None

    def start(self) -> CompileNotice:
        self._t0 = time.perf_counter()
        if self.terminal:
            self._ticker = Ticker(self._tick, every_s=min(self.after_s, 1.0))
        elif self.verbose:
            print(f"{self.what}…", file=sys.stderr, flush=True)
        return self

    def _tick(self) -> None:
        elapsed = time.perf_counter() - self._t0
        if elapsed >= self.after_s:
            self._shown = True
            print(f"\r\033[K{self.what}… {elapsed:.0f} s", end="", file=sys.stderr, flush=True)

    def stop(self, measured_ms: float | None = None, what: str | None = None) -> None:
        """End the notice; with ``-v`` say how long it took (``measured_ms`` when the
        caller measured the compile itself, else the time since ``start``), naming it
        ``what`` when that is not what was announced (a compile that turned out a load)."""
        if self._stopped:
            return
        self._stopped = True
        elapsed_ms = (time.perf_counter() - self._t0) * 1000
        if self._ticker is not None:
            self._ticker.stop()
            if self._shown:
                clear_line(sys.stderr)
        if self.verbose:
            ms = elapsed_ms if measured_ms is None else measured_ms
            print(f"{what or self.what}: done in {ms:.1f} ms", file=sys.stderr, flush=True)
