"""The module ``divrl toy new NAME`` writes: a runnable world on the world scaffold.

As written, the new world is a stand-in task that builds, trains and scores end to end:
bit strings whose answer is their parity (``\\boxed{0}`` or ``\\boxed{1}``, scored by the
``toy_math`` verifier), splits ``train``, ``test`` and ``ood_long`` (strings twice as
long), a ``full`` size and a ``tiny`` one that builds in seconds, and the scale of its
presets. The user replaces ``generate`` and the corpus of ``train_model`` with their task.

The module registers itself when it lives outside divrl (:func:`register_world` at import,
found by a fresh ``divrl`` process through the ``divrl.toy_worlds`` entry point of the
package that holds it); inside ``divrl/toy/`` it does not, and its registration is one line
in ``WORLDS`` (:func:`registration_line`).
"""

from __future__ import annotations

import keyword
import re
import string
from pathlib import Path

from divrl.toy.presets import PresetScale

__all__ = [
    "METHODS",
    "PRESET_SCALE",
    "check_world_name",
    "entry_point_module",
    "in_tree",
    "registration_line",
    "render_world_module",
]

#: the methods whose presets the new world declares (its registration's ``methods``)
METHODS: tuple[str, ...] = ("grpo", "dph_js", "lp_reg")
#: the scale of the new world's presets: parity prompts of up to 12 bits are ~30 tokens and
#: the answer ``\boxed{1}`` 3 tokens plus the end; the model's context is 48
PRESET_SCALE = PresetScale(max_prompt_length=32, max_new_tokens=8)
HELP = "bit-string parity (the scaffold's stand-in task: replace generate and train_model)"

_TEMPLATE = string.Template('''\
"""The $name toy world, written on the world scaffold by `divrl toy new $name`.

As written it is a runnable stand-in: bit strings whose answer is their parity, scored by
the toy_math verifier (a \\\\boxed{} answer). Replace generate() with your task's rows and
train_model()'s corpus with its supervised traces, keep `splits` equal to what generate()
returns, and bump `build_version` whenever the rows or the training change.
"""

from __future__ import annotations

import dataclasses
import random

from divrl.data import Example
from divrl.toy.model import ToyModelConfig
from divrl.toy.scaffold import PresetScale, WorldScaffold
from divrl.toy.sft import SFTConfig
from divrl.toy.tokenizer import ANSWER_MARKER
$register_import

@dataclasses.dataclass(frozen=True)
class ${camel}Config:
    """What determines the world besides the seed (hashed into its cache key)."""

    n_train: int = 256
    n_test: int = 64
    n_long: int = 64
    bits: int = 6
    model: ToyModelConfig = dataclasses.field(
        default_factory=lambda: ToyModelConfig(
            hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_length=48
        )
    )
    sft: SFTConfig = dataclasses.field(
        default_factory=lambda: SFTConfig(steps=100, batch_size=32, warmup_steps=5, threads=1)
    )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _row(split: str, i: int, bits: str) -> Example:
    return Example(
        id=f"{split}-{i}",
        prompt=f"parity of {bits}?{ANSWER_MARKER}",
        data_source="toy_math",
        ground_truth=str(bits.count("1") % 2),
        extra_info={"index": i, "split": split},
    )


#: size name -> config; `full` is the default, `tiny` builds in seconds (for tests)
SIZES = {
    "full": ${camel}Config(),
    "tiny": ${camel}Config(
        n_train=16, n_test=4, n_long=4, sft=SFTConfig(steps=5, batch_size=8, warmup_steps=1)
    ),
}


class ${camel}World(WorldScaffold):
    name = "$name"
    build_version = "1"
    sizes = SIZES
    splits = ("train", "test", "ood_long")
    preset_scale = PresetScale(max_prompt_length=$max_prompt_length, max_new_tokens=$max_new_tokens)

    def generate(self, out, final, seed, cfg):
        rng = random.Random(seed)

        def draw(split, n, k):
            return [_row(split, i, "".join(rng.choice("01") for _ in range(k))) for i in range(n)]

        rows = {
            "train": draw("train", cfg.n_train, cfg.bits),
            "test": draw("test", cfg.n_test, cfg.bits),
            "ood_long": draw("ood_long", cfg.n_long, 2 * cfg.bits),
        }
        return rows, rows["train"]

    def train_model(self, model_dir, seed, cfg, generated, progress):
        corpus = [(r.prompt, f"\\\\boxed{{{r.ground_truth}}}") for r in generated]
        return self.train_on(model_dir, corpus, cfg, seed, progress)


WORLD = ${camel}World()
$register_call''')

_REGISTER_IMPORT = "from divrl.toy.worlds import WorldKind, register_world\n"
_REGISTER_CALL = """
# A fresh `divrl` process imports this module through the `divrl.toy_worlds` entry point of
# the package that holds it (`divrl toy new` printed the line for its pyproject.toml).
register_world(
    "$name",
    WorldKind.scaffolded(
        f"{__name__}:WORLD",
        "$help",
        presets="toy/$name",
        methods=$methods,
    ),
)
"""


def check_world_name(name: str, taken: list[str]) -> None:
    """Raise ValueError (one line saying what to change) unless ``name`` can name a new
    world: a lowercase Python identifier that no registered world has."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ValueError(
            f"world name {name!r}: give a lowercase Python identifier (letters, digits and "
            "underscores, starting with a letter), e.g. parity"
        )
    if name in taken:
        raise ValueError(f"world {name!r} already exists: pick a name other than {taken}")


def in_tree(folder: Path) -> bool:
    """Whether ``folder`` is divrl's own ``divrl/toy/`` (the world is then registered in
    ``WORLDS`` rather than by itself)."""
    return folder.resolve() == Path(__file__).resolve().parent


def render_world_module(name: str, *, self_registering: bool) -> str:
    """The text of world ``name``'s module."""
    camel = "".join(part.capitalize() for part in name.split("_") if part)
    call = ""
    if self_registering:
        call = string.Template(_REGISTER_CALL).substitute(
            name=name, help=HELP, methods=_methods_literal()
        )
    return _TEMPLATE.substitute(
        name=name,
        camel=camel,
        max_prompt_length=PRESET_SCALE.max_prompt_length,
        max_new_tokens=PRESET_SCALE.max_new_tokens,
        register_import=_REGISTER_IMPORT if self_registering else "",
        register_call=call,
    )


def entry_point_module(path: Path) -> str:
    """The dotted module name of the file ``path``: its stem, under every enclosing folder
    that is a package (has ``__init__.py``)."""
    parts = [path.stem]
    folder = path.resolve().parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def registration_line(name: str) -> str:
    """World ``name``'s entry in ``WORLDS`` (``divrl/toy/worlds.py``) for a module written
    into ``divrl/toy/``."""
    return (
        f'    "{name}": WorldKind.scaffolded("divrl.toy.{name}_world:WORLD", "{HELP}", '
        f'presets="toy/{name}", methods={_methods_literal()}),'
    )


def _methods_literal() -> str:
    return "(" + ", ".join(f'"{m}"' for m in METHODS) + ")"
