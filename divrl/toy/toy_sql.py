"""Toy SQL: tiny generated SQLite databases and templated questions with several solution styles.

Every database has a child table (``item``, ``book``, ...) with ``id``, ``nm`` (a unique
name), three numeric columns with distinct values and a foreign key named after its parent
table (``shop``, ``club``, ...), which has ``id`` and ``nm``. The question names every
table and column it needs, so the model writes a query from the question alone and the
database is only needed to execute it.

Four question families, each with an *easy* and a *hard* variant and two or three
equivalent solution styles (the first one is the majority style and the gold query):

======== ============================ ========================================= ==========================
family   question                     styles                                    hard variant
======== ============================ ========================================= ==========================
count    how many item have pr>=30?   COUNT(*) / COUNT(nm)                      ``>=``/``<=`` comparisons
argmax   which item has the lowest pr? ORDER BY .. LIMIT 1 / = (SELECT MIN ..)  lowest instead of highest
join     names of item not in shop x? JOIN / IN (sub-query)                     negated membership
sum      total pr of item with qt<30? plain / CTE / nested sub-query            condition on another column
======== ============================ ========================================= ==========================

The supervised corpus teaches a *reliability gap between styles*: each style is used at a
fixed rate whatever the family (so the model never ties style to family), the majority
style makes a family-specific systematic mistake on most hard variants (it writes the
strict comparison, keeps ``DESC``, drops the negation, sums the condition column), and
every style makes random mistakes (a shifted constant, another column, a flipped
comparison or direction, another parent) at a style-specific rate. A policy that collapses
onto the majority style therefore loses the hard variants, the coverage the minority
styles give.
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROMPT_PREFIX = "SQL: "

CHILD_TABLES = (
    "item",
    "book",
    "car",
    "song",
    "dog",
    "toy",
    "film",
    "shoe",
    "cake",
    "ship",
    "lamp",
    "bike",
    "game",
    "tree",
    "fish",
    "coat",
)
PARENT_TABLES = ("shop", "club", "city", "team", "band", "farm", "zone", "firm", "lab", "park")
NUMERIC_COLUMNS = ("pr", "qt", "age", "wt", "len", "pts", "yr", "sz", "cost", "rank", "kg", "hp")
PARENT_NAMES = ("red", "blue", "oak", "sun", "ice", "fox", "elm", "sky", "ash", "bay", "jet", "gem")
_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")

FAMILIES = ("count", "argmax", "join", "sum")
COMPARISONS = (">", "<", ">=", "<=")
_STRICT = {">=": ">", "<=": "<", ">": ">", "<": "<"}
_FLIP = {">": "<", "<": ">", ">=": "<=", "<=": ">="}

# family -> styles; the first is the majority style (and the style of the gold query).
STYLES: dict[str, tuple[str, ...]] = {
    "count": ("count_star", "count_col"),
    "argmax": ("order_limit", "max_subquery"),
    "join": ("join", "in_subquery"),
    "sum": ("plain", "cte", "nested"),
}

#: each style's label under the one SQL style classifier, ``divrl.evaluation.styles.sql_shape``
#: (what ``divrl eval`` and ``divrl toy measure`` count); distinct within every family
STYLE_SHAPES: dict[str, str] = {
    "count_star": "count(*)",
    "count_col": "count(col)",
    "order_limit": "order+limit",
    "max_subquery": "scalar-subquery",
    "join": "join",
    "in_subquery": "in-subquery",
    "plain": "sum",
    "cte": "cte+sum",
    "nested": "from-subquery+sum",
}


@dataclass(frozen=True)
class Schema:
    """One database: a child table with three numeric columns and a parent table."""

    db_id: str
    child: str
    parent: str
    columns: tuple[str, str, str]


@dataclass(frozen=True)
class Database:
    """A schema with its rows; ``values[c]`` are the column's (distinct) values."""

    schema: Schema
    names: tuple[str, ...]
    parent_names: tuple[str, ...]
    parent_of: tuple[int, ...]  # 0-based parent index of each child row
    values: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Question:
    """The semantic content of a question; rendering it in a style gives a query.

    ``col`` is the column asked about (counted, maximised, summed), ``cond_col``/``op``/
    ``value`` the filter (count, sum), ``parent_name``/``negated`` the membership (join),
    ``lowest`` the direction (argmax).
    """

    family: str
    db: Schema
    hard: bool
    col: str = ""
    cond_col: str = ""
    op: str = ""
    value: int = 0
    lowest: bool = False
    parent_name: str = ""
    negated: bool = False

    @property
    def text(self) -> str:
        """The natural-language question (without prefix and answer marker)."""
        t, p = self.db.child, self.db.parent
        if self.family == "count":
            return f"how many {t} have {self.cond_col}{self.op}{self.value}?"
        if self.family == "argmax":
            return f"which {t} has the {'lowest' if self.lowest else 'highest'} {self.col}?"
        if self.family == "join":
            return f"names of {t} {'not in' if self.negated else 'in'} {p} {self.parent_name}?"
        if self.family == "sum":
            return f"total {self.col} of {t} with {self.cond_col}{self.op}{self.value}?"
        raise ValueError(f"unknown family {self.family!r}; expected one of {FAMILIES}")


@dataclass(frozen=True)
class ToySQLConfig:
    """How the toy SQL world is generated and how the supervised corpus errs."""

    n_train_dbs: int = field(
        default=16, metadata={"help": "databases for SFT, the train and the in-domain test split"}
    )
    n_cross_dbs: int = field(
        default=4, metadata={"help": "held-out databases (unseen schemas) for cross_domain"}
    )
    rows: int = field(default=24, metadata={"help": "rows in each child table"})
    parents: int = field(default=5, metadata={"help": "rows in each parent table"})
    family_weights: tuple[float, ...] = field(
        default=(0.3, 0.2, 0.25, 0.25), metadata={"help": "sampling weight of each family"}
    )
    hard_share: float = field(
        default=0.45, metadata={"help": "share of hard variants in SFT, train and test"}
    )
    cross_hard_share: float = field(
        default=0.6, metadata={"help": "share of hard variants in the cross-domain split"}
    )
    style_rates: tuple[float, ...] = field(
        default=(0.6, 0.25, 0.15),
        metadata={
            "help": "rate of the 1st, 2nd, 3rd style in SFT, whatever the family "
            "(renormalised over the family's styles)"
        },
    )
    systematic_error: float = field(
        default=0.9,
        metadata={"help": "probability that the majority style errs on a hard variant"},
    )
    random_errors: tuple[float, ...] = field(
        default=(0.06, 0.3, 0.3),
        metadata={"help": "random-mistake probability of the 1st, 2nd, 3rd style"},
    )
    family_error_scale: tuple[float, ...] = field(
        default=(0.3, 1.0, 1.6, 1.6),
        metadata={
            "help": "per family (count, argmax, join, sum): factor on every style's "
            "random-mistake probability (longer queries slip more)"
        },
    )

    def __post_init__(self) -> None:
        if self.n_train_dbs < 1 or self.n_cross_dbs < 1:
            raise ValueError("n_train_dbs and n_cross_dbs must be >= 1")
        if self.n_train_dbs + self.n_cross_dbs > len(CHILD_TABLES) * len(PARENT_TABLES):
            raise ValueError("too many databases for the name pools; lower n_train_dbs")
        if not 8 <= self.rows <= len(_SYLLABLES) ** 2 // 4:
            raise ValueError(f"rows must be in [8, {len(_SYLLABLES) ** 2 // 4}]")
        if not 2 <= self.parents <= len(PARENT_NAMES):
            raise ValueError(f"parents must be in [2, {len(PARENT_NAMES)}]")
        if len(self.family_weights) != len(FAMILIES) or min(self.family_weights) < 0:
            raise ValueError(f"family_weights needs {len(FAMILIES)} non-negative weights")
        for name in ("hard_share", "cross_hard_share", "systematic_error"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1]")
        if len(self.style_rates) != 3 or len(self.random_errors) != 3:
            raise ValueError("style_rates and random_errors need 3 entries (one per style rank)")
        if min(self.style_rates) <= 0 or not all(0 <= p <= 1 for p in self.random_errors):
            raise ValueError("style_rates must be > 0 and random_errors in [0, 1]")
        if len(self.family_error_scale) != len(FAMILIES) or min(self.family_error_scale) < 0:
            raise ValueError(f"family_error_scale needs {len(FAMILIES)} non-negative factors")
        if max(self.random_errors) * max(self.family_error_scale) > 1:
            raise ValueError("random_errors x family_error_scale must stay <= 1")


# ----------------------------------------------------------------------------- databases


def make_schemas(cfg: ToySQLConfig, seed: int) -> tuple[list[Schema], list[Schema]]:
    """Train and cross-domain schemas.

    Cross-domain schemas reuse table names seen in training but pair a child table with a
    parent it never had in training (and get fresh columns and rows): new schemas, not new
    words, so a cross-domain miss is about the question and not about copying an unseen name.
    """
    rng = random.Random(f"toy_sql-schemas-{seed}")
    pairs = [(c, p) for c in CHILD_TABLES for p in PARENT_TABLES]
    rng.shuffle(pairs)
    train_pairs = pairs[: cfg.n_train_dbs]
    children = {c for c, _ in train_pairs}
    parents = {p for _, p in train_pairs}
    cross_pairs = [(c, p) for c, p in pairs[cfg.n_train_dbs :] if c in children and p in parents][
        : cfg.n_cross_dbs
    ]
    if len(cross_pairs) < cfg.n_cross_dbs:
        raise ValueError(
            f"only {len(cross_pairs)} unseen pairings of training tables; "
            "lower n_cross_dbs or raise n_train_dbs"
        )
    schemas = []
    for i, (child, parent) in enumerate(train_pairs + cross_pairs):
        cols = tuple(rng.sample(NUMERIC_COLUMNS, 3))
        kind = "train" if i < cfg.n_train_dbs else "cross"
        schemas.append(Schema(f"{kind}_{i:02d}_{child}_{parent}", child, parent, cols))
    return schemas[: cfg.n_train_dbs], schemas[cfg.n_train_dbs :]


def make_database(schema: Schema, cfg: ToySQLConfig, seed: int) -> Database:
    rng = random.Random(f"toy_sql-db-{seed}-{schema.db_id}")
    names: set[str] = set()
    while len(names) < cfg.rows:
        names.add(rng.choice(_SYLLABLES) + rng.choice(_SYLLABLES))
    parent_names = tuple(rng.sample(PARENT_NAMES, cfg.parents))
    # every parent gets at least one child so that every membership question has an answer
    parent_of = list(range(cfg.parents)) + [
        rng.randrange(cfg.parents) for _ in range(cfg.rows - cfg.parents)
    ]
    rng.shuffle(parent_of)
    values = {c: tuple(rng.sample(range(1, 100), cfg.rows)) for c in schema.columns}
    return Database(schema, tuple(sorted(names)), parent_names, tuple(parent_of), values)


def write_sqlite(db: Database, path: str | Path) -> Path:
    """Write the database to a fresh SQLite file and return its path."""
    path = Path(path)
    path.unlink(missing_ok=True)
    s = db.schema
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"CREATE TABLE {s.parent} (id INTEGER PRIMARY KEY, nm TEXT NOT NULL)")
        cols = ", ".join(f"{c} INTEGER NOT NULL" for c in s.columns)
        conn.execute(
            f"CREATE TABLE {s.child} (id INTEGER PRIMARY KEY, nm TEXT NOT NULL, {cols}, "
            f"{s.parent} INTEGER NOT NULL REFERENCES {s.parent}(id))"
        )
        conn.executemany(
            f"INSERT INTO {s.parent} VALUES (?, ?)",
            [(i + 1, n) for i, n in enumerate(db.parent_names)],
        )
        rows = [
            (i + 1, name, *(db.values[c][i] for c in s.columns), db.parent_of[i] + 1)
            for i, name in enumerate(db.names)
        ]
        marks = ", ".join("?" * (len(s.columns) + 3))
        conn.executemany(f"INSERT INTO {s.child} VALUES ({marks})", rows)
        conn.commit()
    finally:
        conn.close()
    return path


# ----------------------------------------------------------------------------- questions


def sample_question(rng: random.Random, db: Database, family: str, hard: bool) -> Question:
    """A random question of ``family`` about ``db``; ``hard`` picks the hard variant."""
    s = db.schema
    if family in ("count", "sum"):
        if family == "count":
            col = cond = rng.choice(s.columns)
            op = rng.choice(COMPARISONS[2:] if hard else COMPARISONS[:2])
        else:
            col, other = rng.sample(s.columns, 2)
            cond = other if hard else col
            op = rng.choice(COMPARISONS)
        # a value from the column, away from the extremes, so that the boundary matters and
        # the answer is neither empty nor everything
        ranked = sorted(db.values[cond])
        value = rng.choice(ranked[3:-3])
        return Question(family, s, hard, col=col, cond_col=cond, op=op, value=value)
    if family == "argmax":
        return Question(family, s, hard, col=rng.choice(s.columns), lowest=hard)
    if family == "join":
        return Question(family, s, hard, parent_name=rng.choice(db.parent_names), negated=hard)
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def render(q: Question, style: str) -> str:
    """The query answering ``q`` written in ``style`` (one of ``STYLES[q.family]``)."""
    t, p = q.db.child, q.db.parent
    where = f"{q.cond_col}{q.op}{q.value}"
    if style not in STYLES.get(q.family, ()):
        raise ValueError(f"style {style!r} does not answer a {q.family!r} question")
    if style == "count_star":
        return f"SELECT COUNT(*) FROM {t} WHERE {where}"
    if style == "count_col":
        return f"SELECT COUNT(nm) FROM {t} WHERE {where}"
    if style == "order_limit":
        return f"SELECT nm FROM {t} ORDER BY {q.col}{'' if q.lowest else ' DESC'} LIMIT 1"
    if style == "max_subquery":
        agg = "MIN" if q.lowest else "MAX"
        return f"SELECT nm FROM {t} WHERE {q.col}=(SELECT {agg}({q.col}) FROM {t})"
    if style == "join":
        eq = "<>" if q.negated else "="
        return f"SELECT a.nm FROM {t} a JOIN {p} b ON a.{p}=b.id WHERE b.nm{eq}'{q.parent_name}'"
    if style == "in_subquery":
        neg = " NOT" if q.negated else ""
        return (
            f"SELECT nm FROM {t} WHERE {p}{neg} IN (SELECT id FROM {p} WHERE nm='{q.parent_name}')"
        )
    if style == "plain":
        return f"SELECT SUM({q.col}) FROM {t} WHERE {where}"
    if style == "cte":
        return f"WITH s AS (SELECT {q.col} FROM {t} WHERE {where}) SELECT SUM({q.col}) FROM s"
    if style == "nested":
        return f"SELECT SUM({q.col}) FROM (SELECT {q.col} FROM {t} WHERE {where})"
    raise AssertionError(style)


def gold_query(q: Question) -> str:
    return render(q, STYLES[q.family][0])


# ----------------------------------------------------------------------------- mistakes


def systematic_mistake(q: Question) -> Question:
    """The majority style's habitual mistake on a hard variant (identity on easy ones)."""
    if not q.hard:
        return q
    if q.family == "count":
        return dataclasses.replace(q, op=_STRICT[q.op])
    if q.family == "argmax":
        return dataclasses.replace(q, lowest=False)
    if q.family == "join":
        return dataclasses.replace(q, negated=False)
    if q.family == "sum":
        return dataclasses.replace(q, col=q.cond_col)
    raise ValueError(f"unknown family {q.family!r}")


def random_mistake(q: Question, db: Database, rng: random.Random) -> Question:
    """A random slip that changes the answer: shifted constant, other column, flipped
    comparison or direction, other parent."""
    s = db.schema

    def other_col(c: str) -> str:
        return rng.choice([x for x in s.columns if x != c])

    slips: list[Callable[[], Question]]
    if q.family in ("count", "sum"):
        slips = [
            lambda: dataclasses.replace(q, value=q.value + rng.choice((-7, -4, 4, 7))),
            lambda: dataclasses.replace(q, op=_FLIP[q.op]),
            lambda: dataclasses.replace(q, cond_col=other_col(q.cond_col)),
        ]
        if q.family == "sum":
            slips.append(lambda: dataclasses.replace(q, col=other_col(q.col)))
    elif q.family == "argmax":
        slips = [
            lambda: dataclasses.replace(q, col=other_col(q.col)),
            lambda: dataclasses.replace(q, lowest=not q.lowest),
        ]
    elif q.family == "join":
        others = [n for n in db.parent_names if n != q.parent_name]
        slips = [
            lambda: dataclasses.replace(q, parent_name=rng.choice(others)),
            lambda: dataclasses.replace(q, negated=not q.negated),
        ]
    else:
        raise ValueError(f"unknown family {q.family!r}")
    return rng.choice(slips)()


def sample_style(rng: random.Random, family: str, cfg: ToySQLConfig) -> int:
    """Index of the style used for one SFT response (family-independent rates)."""
    k = len(STYLES[family])
    return rng.choices(range(k), weights=cfg.style_rates[:k])[0]


def sample_response(
    q: Question, db: Database, rng: random.Random, cfg: ToySQLConfig
) -> tuple[str, str, bool]:
    """One SFT response to ``q``: (query, style, whether it was meant to be correct)."""
    rank = sample_style(rng, q.family, cfg)
    style = STYLES[q.family][rank]
    said = q
    if rank == 0 and q.hard and rng.random() < cfg.systematic_error:
        said = systematic_mistake(q)
    scale = cfg.family_error_scale[FAMILIES.index(q.family)]
    if rng.random() < cfg.random_errors[rank] * scale:
        said = random_mistake(said, db, rng)
    return render(said, style), style, said == q


def sample_family(rng: random.Random, cfg: ToySQLConfig) -> str:
    return rng.choices(FAMILIES, weights=cfg.family_weights)[0]


def sample_questions(
    rng: random.Random,
    dbs: Sequence[Database],
    n: int,
    cfg: ToySQLConfig,
    hard_share: float,
    exclude: set[str] | frozenset[str] = frozenset(),
    max_tries_per_question: int = 200,
) -> list[tuple[Question, Database]]:
    """``n`` questions with distinct texts (and not in ``exclude``) over ``dbs``."""
    seen = set(exclude)
    out: list[tuple[Question, Database]] = []
    for _ in range(n * max_tries_per_question):
        if len(out) == n:
            break
        db = rng.choice(dbs)
        q = sample_question(rng, db, sample_family(rng, cfg), rng.random() < hard_share)
        if prompt_text(q) in seen:
            continue
        seen.add(prompt_text(q))
        out.append((q, db))
    if len(out) < n:
        raise ValueError(
            f"only {len(out)} distinct questions for {n} requested; add databases "
            "(n_train_dbs/n_cross_dbs) or ask for fewer"
        )
    return out


def prompt_text(q: Question) -> str:
    """The prompt body (the caller appends the answer marker)."""
    return PROMPT_PREFIX + q.text
