"""The ``divrl`` command line.

Each subcommand lives in its own module that exposes ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, so that
``divrl --help`` stays fast and an optional dependency of one command never breaks another.

Exit codes: 0 success; 2 a usage or input error that divrl recognised (bad config or
option, invalid data row, missing file, store or model), printed as one paragraph without a
traceback (``divrl --debug COMMAND ...`` shows it); 130 interrupted (Ctrl-C); anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import math
import re
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Add a subcommand by adding one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("divrl.commands.train", "RL training: GRPO/DAPO, DPH-RL, Lp-Reg and baselines"),
    "presample": ("divrl.commands.presample", "DPH-RL: presample the reference store"),
    "score": ("divrl.commands.score", "score a JSONL of completions against a dataset"),
    "data": ("divrl.commands.data", "convert BIRD/Spider/MATH/GSM8K files to verl-schema rows"),
    "eval": ("divrl.commands.eval", "sample and score a model: Pass@k, maj@k, diversity"),
    "export": ("divrl.commands.export", "Hugging Face folder from a sharded (fsdp) checkpoint"),
    "report": ("divrl.commands.report", "Markdown/HTML report comparing runs and the base model"),
    "demo": ("divrl.commands.demo", "toy world end to end: GRPO, DPH-JS, Lp-Reg vs the base"),
    "toy": ("divrl.commands.toy", "build the toy world (SQL + math data, tiny base model)"),
}

# Commands that run a model on the CPU get a --threads option and a thread count chosen for
# the machine they start on (see choose_threads).
THREADED_COMMANDS = ("train", "presample", "eval")
THREADS_ENV = "DIVRL_THREADS"

# a dotted config override, key=value
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")

# seconds between two progress lines in a log file or a pipe
LOGGED_PROGRESS_SECONDS = 30

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130

# divrl's own error classes, by module and name: an error can only be one of them when its
# module is loaded, so they are looked up in sys.modules and nothing is imported for this.
USER_ERRORS = (
    ("divrl.cli", "UsageError"),
    ("divrl.training.config", "ConfigError"),
    ("divrl.data.loading", "DataValidationError"),
    ("divrl.data.loading", "DataFileError"),
    ("divrl.rollout.model_source", "ModelSourceError"),
    ("divrl.data.reference_store", "StoreMismatchError"),
    ("divrl.data.store_files", "ReferenceStoreError"),
    ("divrl.evaluation.reuse", "IncompleteSamplesError"),
    ("divrl.evaluation.report_files", "ReportInputError"),
    ("divrl.data.prompts", "NoUsablePromptsError"),
    ("divrl.data.prompts", "PromptLengthError"),
    ("divrl.data.templates", "TemplateError"),
    ("divrl.rollout.registry", "EngineError"),
)
# Built-in errors that, raised inside divrl, name a missing or unreadable input.
USER_OS_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)

# Log records that are noise at divrl's level of use: (logger name, message start).
QUIET_RECORDS = (("accelerate.utils.other", "Removed shared tensor"),)
# Records kept, but at DEBUG: accelerate's INFO lines for every checkpoint saved or loaded
# (four per checkpoint) repeat what divrl's own checkpoint line says.
DEBUG_RECORDS = (
    ("accelerate.accelerator", "Saving current state to"),
    ("accelerate.accelerator", "Loading states from"),
    ("accelerate.accelerator", "Loading in "),
    ("accelerate.checkpointing", "Model weights saved in"),
    ("accelerate.checkpointing", "Optimizer state saved in"),
    ("accelerate.checkpointing", "Scheduler state saved in"),
    ("accelerate.checkpointing", "Sampler state for dataloader"),
    ("accelerate.checkpointing", "Gradient scaler state saved in"),
    ("accelerate.checkpointing", "Random states saved in"),
    ("accelerate.checkpointing", "All model weights loaded successfully"),
    ("accelerate.checkpointing", "All optimizer states loaded successfully"),
    ("accelerate.checkpointing", "All scheduler states loaded successfully"),
    ("accelerate.checkpointing", "All dataloader sampler states loaded successfully"),
    ("accelerate.checkpointing", "All random states loaded successfully"),
    ("accelerate.checkpointing", "Loading in "),
)
# Libraries whose INFO lines are one per HTTP request (hub downloads).
QUIET_LOGGERS = ("httpx", "httpcore")


class UsageError(ValueError):
    """A command's input is wrong in a way its message explains (raised by the commands)."""


def _number(text: str, kind: type, what: str, ok) -> float | int:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def finite_float(text: str) -> float:
    """argparse ``type``: a finite number (NaN and infinity are refused)."""
    return _number(text, float, "a finite number", math.isfinite)


def positive_float(text: str) -> float:
    """argparse ``type``: a finite number > 0."""
    return _number(text, float, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)


def non_negative_int(text: str) -> int:
    """argparse ``type``: a whole number >= 0 (a seed, a top-k)."""
    return _number(text, int, "a whole number >= 0", lambda v: v >= 0)


def seed_int(text: str) -> int:
    """argparse ``type``: a seed, a whole number from 0 to 2**31 - 1 (numpy's seeds are
    below 2**32, and seeds get offsets such as the prompt index)."""
    return _number(text, int, "a whole number from 0 to 2147483647", lambda v: 0 <= v < 2**31)


def positive_int(text: str) -> int:
    """argparse ``type``: a whole number >= 1 (a count, a size)."""
    return _number(text, int, "a whole number >= 1", lambda v: v >= 1)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with divrl's one error format: ``divrl COMMAND: message`` on one line, as
    every command prints its own input errors (argparse's is a usage block and ``error:``)."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to every option that has a default and does not name it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == []
            or default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


class _DropRecords(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def matches(self, record: logging.LogRecord) -> bool:
        # accelerate's process-aware logger puts "[RANK n] " in front of the message
        return re.sub(r"^\[RANK \d+\] ", "", str(record.msg)).startswith(self.prefix)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.matches(record)


class _DemoteRecords(_DropRecords):
    """Logs a matching INFO record at DEBUG: shown only when the root logger is at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.matches(record) or record.levelno > logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def setup_logging(level: int = logging.INFO) -> None:
    """One handler for every log line: divrl's root handler.

    huggingface_hub adds its own stream handler to its library logger and still lets records
    propagate to the root, so with a root handler each of its lines would print twice; its
    handler is removed. Accelerate's per-checkpoint "Removed shared tensor" note (tied
    embeddings, expected) is filtered out, and its per-checkpoint "saved in" / "loaded"
    lines are logged at DEBUG (:data:`DEBUG_RECORDS`).
    """
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s")
    # the hub adds its handler when this module is first imported: import it now
    with contextlib.suppress(ImportError):  # installed with transformers
        import huggingface_hub.utils.logging  # noqa: F401
    hub_logger = logging.getLogger("huggingface_hub")
    for handler in list(hub_logger.handlers):
        hub_logger.removeHandler(handler)
    hub_logger.propagate = True
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for records, kind in ((QUIET_RECORDS, _DropRecords), (DEBUG_RECORDS, _DemoteRecords)):
        for name, prefix in records:
            logger = logging.getLogger(name)
            if not any(type(f) is kind and f.prefix == prefix for f in logger.filters):
                logger.addFilter(kind(prefix))


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of divrl's own input errors (see :data:`USER_ERRORS`)."""
    if isinstance(exc, UsageError):  # this module's class also when run as ``python -m``
        return True
    for module_name, class_name in USER_ERRORS:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return isinstance(exc, USER_OS_ERRORS)


def error_paragraph(command: str, exc: BaseException) -> str:
    """One paragraph: ``divrl COMMAND: message`` and how to see the traceback. A message
    is one line (so that paths in it can be copied), except that a list in it (lines
    starting with ``- ``) keeps one item per line, indented under the first line."""
    hint = f"(run `divrl --debug {command} ...` for the traceback)"
    lines = [" ".join(line.split()) for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    if not any(line.startswith("- ") for line in lines[1:]):
        message = " ".join(lines) or type(exc).__name__
        return f"divrl {command}: {message} {hint}"
    rest = [f"  {line}" if line.startswith("- ") else line for line in lines[1:]]
    return "\n".join([f"divrl {command}: {lines[0]}", *rest]) + f" {hint}"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def choose_threads(cpus: int | None = None, local_processes: int | None = None) -> int:
    """torch intra-op threads for one process: the CPUs this process may use, shared by the
    local processes of a ``torchrun`` launch; at least 1.

    Never the machine's load: the thread count changes the order of floating-point sums,
    so a choice that followed other work would give one seed different numbers on an idle
    and on a busy machine. On a busy machine ``--threads 1`` can be much faster (a toy
    GRPO step measured 21.5 s with two threads beside other jobs, 3.7 s on one;
    docs/training.md): the log says so when the load is high, and the choice stays yours.
    """
    import os

    if cpus is None:
        cpus = usable_cpus()
    if local_processes is None:
        local_processes = _whole_number(os.environ.get("LOCAL_WORLD_SIZE") or "1") or 1
    return max(1, cpus // max(1, local_processes))


def _whole_number(text: str) -> int | None:
    """``text`` as an integer >= 1 (spaces around allowed), else None."""
    text = text.strip()
    return int(text) if text.isdigit() and int(text) >= 1 else None


def check_threads(value: int, source: str) -> int:
    """``value`` when it is a thread count this process can use (1 .. its CPUs), else
    :class:`UsageError` naming ``source`` (the option or variable it came from)."""
    cpus = usable_cpus()
    if not 1 <= value <= cpus:
        raise UsageError(
            f"{source}={value}: the number of threads must be from 1 to {cpus} (the CPUs this "
            "process may use)"
        )
    return value


def _env_threads(name: str, what: str) -> int | None:
    """The thread count in environment variable ``name`` (None when unset or empty), or
    :class:`UsageError` naming it when it is not a whole number >= 1."""
    import os

    raw = os.environ.get(name, "")
    if not raw.strip():
        return None
    first = raw.split(",")[0] if name == "OMP_NUM_THREADS" else raw  # OpenMP: "4,2" = levels
    value = _whole_number(first)
    if value is None:
        raise UsageError(
            f"${name}={raw!r} is not a whole number of threads >= 1 ({what}): set it to "
            f"one, e.g. {name}=1, or unset it"
        )
    return value


def configure_threads(requested: int | None) -> str:
    """Set torch's intra-op threads: ``--threads``, else ``$DIVRL_THREADS``, else what
    ``$OMP_NUM_THREADS`` asks (torch reads it), else :func:`choose_threads`. Returns how the
    number was chosen, for the log.

    Raises:
        UsageError: a count outside 1 .. the usable CPUs, or a variable that is not a whole
            number >= 1 (OpenMP ignores such an ``OMP_NUM_THREADS``: it is refused rather
            than reported as used).
    """
    import os

    source = "--threads"
    if requested is None:
        requested, source = _env_threads(THREADS_ENV, "divrl's thread count"), f"${THREADS_ENV}"
    omp = None
    if requested is not None:
        check_threads(requested, source)
    else:
        omp = _env_threads("OMP_NUM_THREADS", "OpenMP ignores such a value")
    import torch

    if requested is None and omp is not None:
        return f"{torch.get_num_threads()} (from $OMP_NUM_THREADS={omp})"
    hint = ""
    if requested is None:
        requested, source = choose_threads(), "the CPUs this process may use"
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if requested > 1 and load > 0.5:
            hint = (
                f"; the machine's load is {load:.1f}: on a busy machine --threads 1 can be "
                "much faster"
            )
    torch.set_num_threads(requested)
    return f"{requested} ({source}; --threads N or ${THREADS_ENV} to change{hint})"


class LineStream:
    """A text stream for a log file or a pipe: progress bars redrawn in place (``\\r``,
    cursor movement) become one line per redraw, so that a log holds occasional lines."""

    _ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

    def __init__(self, stream) -> None:
        self.stream = stream
        self.column = 0  # characters written since the last newline

    def write(self, text: str) -> int:
        out = []
        for i, part in enumerate(self._ESCAPE.sub("", text).split("\r")):
            if i and self.column:
                out.append("\n")
                self.column = 0
            line = part.rstrip(" ") if i else part
            out.append(line)
            tail = line.rsplit("\n", 1)
            self.column = len(tail[-1]) if len(tail) > 1 else self.column + len(line)
        self.stream.write("".join(out))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def plain_progress_when_logged() -> None:
    """When stderr is not a terminal, divrl's progress bars redraw at most every
    :data:`LOGGED_PROGRESS_SECONDS` and each redraw is a line (:class:`LineStream`), and
    transformers' and huggingface_hub's bars are off; tqdm and they read their settings when
    first imported, so this runs before."""
    import os

    if sys.stderr.isatty() or isinstance(sys.stderr, LineStream):
        return
    for key in ("TQDM_MININTERVAL", "TQDM_MAXINTERVAL"):
        os.environ.setdefault(key, str(LOGGED_PROGRESS_SECONDS))
    # transformers' and the hub's own bars ("Loading weights" per model load, dozens in a
    # demo) say nothing divrl's log lines do not; both read this when first imported, and
    # divrl's subprocesses inherit it
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.stderr = LineStream(sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    import os

    # before torch loads: idle OpenMP threads sleep instead of spinning, which on a shared
    # CPU would take the cores other threads and processes need
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    stderr = sys.stderr
    plain_progress_when_logged()
    try:
        return _main(argv)
    finally:
        sys.stderr = stderr


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv[:1]
    if debug:
        argv = argv[1:]
    parser = build_parser_for(argv)
    args = parse_args(parser, argv)
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 2
    setup_logging()
    command = args.command
    try:
        if command in THREADED_COMMANDS:
            logging.getLogger("divrl").info(
                "torch threads: %s", configure_threads(getattr(args, "threads", None))
            )
        return int(importlib.import_module(args._module).run(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\ndivrl {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug or not is_user_error(exc):
            raise
        print(error_paragraph(command, exc), file=sys.stderr)
        return EXIT_USER_ERROR


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; ``key=value`` overrides are accepted anywhere on the line, also after
    an option (``divrl train CONFIG --resume data.limit=64``), for commands that take them."""
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list):
        overrides = [a for a in extra if OVERRIDE.match(a)]
        args.overrides += overrides
        extra = [a for a in extra if a not in overrides]
    if extra:
        # the subcommand's parser, so that the error names the command
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        command = getattr(args, "command", None)
        sub = actions[0].choices.get(command) if actions and command else None
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def build_parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Build the parser, importing only the module of the subcommand named in ``argv``."""
    parser = ArgumentParser(
        prog="divrl",
        description="RLVR that keeps diversity: DPH-RL, Lp-Reg and their baselines.",
        epilog="`divrl --debug COMMAND ...` shows the traceback of an input error; exit codes: "
        "0 done, 2 input error, 130 interrupted.",
    )
    from divrl import __version__

    parser.add_argument("--version", action="version", version=f"divrl {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks (must come before COMMAND)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=HelpFormatter
        )
        sub_parser.set_defaults(_module=module_name)
        if name in THREADED_COMMANDS:
            sub_parser.add_argument(
                "--threads",
                type=int,
                default=None,
                help="torch intra-op threads (default: $DIVRL_THREADS, else $OMP_NUM_THREADS, "
                "else the CPUs this process may use; 1 to that count)",
            )
        if argv and argv[0] == name:
            importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


if __name__ == "__main__":
    sys.exit(main())
