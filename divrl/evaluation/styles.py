"""Solution styles: a coarse label of *how* a response solves its prompt.

The DPH-RL paper counts solution styles per query (reverse KL: one style for ~94% of
queries; forward KL: >= 3 styles for ~60%) but does not publish how it classified them.
The classification here is divrl's own.

**SQL** (:func:`sql_shape`): the query's syntactic shape, read from a ``sqlglot`` AST
(SQLite dialect). The label joins, in this order, the features present:

- ``cte``: a ``WITH`` clause;
- ``join``: any ``JOIN``;
- ``in-subquery`` / ``exists-subquery`` / ``from-subquery`` / ``scalar-subquery``: a nested
  ``SELECT`` inside ``IN (...)``, inside ``EXISTS (...)``, in ``FROM``/``JOIN`` (a derived
  table), or anywhere else (e.g. ``x = (SELECT MAX(x) ...)``); CTE bodies do not count;
- ``union`` / ``intersect`` / ``except``: a set operation at the top;
- the aggregate form of the outermost ``SELECT``'s columns: ``count(*)``, ``count(col)``,
  ``count(distinct)``, ``sum``, ``avg``, ``min``, ``max`` (each present one), then
  ``group-by`` and ``having``;
- the ordering form of the outermost query: ``order+limit``, ``order`` or ``limit``.

A query with none of them is ``plain``; one sqlglot cannot parse is ``unparsable``. Column
and table names, constants and comparison operators do not change the label, so
``SELECT COUNT(*) FROM t WHERE a>1`` and ``select count(*) from u where b<=7`` share one.

A data source's style classifier is its benchmark profile's ``style`` (:mod:`divrl.profiles`;
the built-in ones in :mod:`divrl.rewards.builtin_profiles`: SQL shape for bird, spider, sql
and toy SQL, the toy world's for toy math and countdown, ``divrl/toy/styles.py``). Other
data sources have no style (``None``) unless one is added with :func:`register_style`.
"""

from __future__ import annotations

from collections.abc import Callable

from divrl.profiles import profile_hook, update_profile

__all__ = ["get_style_fn", "register_style", "solution_style", "sql_shape", "sql_style"]

# (response text, extracted answer) -> style label or None
StyleFn = Callable[[str, "str | None"], "str | None"]

_AGGREGATES = ("sum", "avg", "min", "max")
_AGG_ORDER = ("count(*)", "count(col)", "count(distinct)", *_AGGREGATES)
_SET_OPS = ("union", "intersect", "except")


def sql_shape(sql: str | None) -> str | None:
    """The syntactic shape of one SQL query (see the module docstring); None for no query."""
    if sql is None or not sql.strip():
        return None
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError, RecursionError):
        return "unparsable"
    if tree is None:
        return "unparsable"

    features: list[str] = []
    if tree.args.get("with_") or tree.args.get("with") or tree.find(exp.With):
        features.append("cte")
    if tree.find(exp.Join):
        features.append("join")

    sub_kinds = set()
    for select in tree.find_all(exp.Select):
        if select is tree or select.find_ancestor(exp.CTE) is not None:
            continue
        if isinstance(tree, exp.SetOperation) and select.parent is tree:
            continue  # a branch of a top-level UNION is not nested
        sub_kinds.add(_subquery_kind(select, exp))
    features += [
        k
        for k in ("in-subquery", "exists-subquery", "from-subquery", "scalar-subquery")
        if k in sub_kinds
    ]

    main = tree
    if isinstance(tree, exp.SetOperation):
        features.append(type(tree).__name__.lower())
        main = tree.this if isinstance(tree.this, exp.Select) else tree
    if isinstance(main, exp.Select):
        features += _aggregate_form(main, exp)
    order, limit = tree.args.get("order"), tree.args.get("limit")
    if order is not None and limit is not None:
        features.append("order+limit")
    elif order is not None:
        features.append("order")
    elif limit is not None:
        features.append("limit")
    return "+".join(features) if features else "plain"


def _subquery_kind(select, exp) -> str:
    """Where a nested SELECT sits: IN, EXISTS, FROM/JOIN (derived table) or elsewhere."""
    node = select.parent
    while isinstance(node, exp.Subquery | exp.Paren):
        node = node.parent
    if isinstance(node, exp.In):
        return "in-subquery"
    if isinstance(node, exp.Exists):
        return "exists-subquery"
    if isinstance(node, exp.From | exp.Join):
        return "from-subquery"
    return "scalar-subquery"


def _aggregate_form(select, exp) -> list[str]:
    found: list[str] = []
    for projection in select.expressions:
        for fn in projection.find_all(exp.AggFunc):
            if fn.find_ancestor(exp.Select) is not select:
                continue  # an aggregate inside a sub-query of a column
            if isinstance(fn, exp.Count):
                arg = fn.this
                if isinstance(arg, exp.Star) or arg is None:
                    found.append("count(*)")
                elif isinstance(arg, exp.Distinct):
                    found.append("count(distinct)")
                else:
                    found.append("count(col)")
            else:
                name = type(fn).__name__.lower()
                if name in _AGGREGATES:
                    found.append(name)
    ordered = [f for f in _AGG_ORDER if f in found]
    if select.args.get("group"):
        ordered.append("group-by")
    if select.args.get("having"):
        ordered.append("having")
    return ordered


def sql_style(text: str, extracted: str | None) -> str | None:
    """The SQL sources' style classifier: the shape of the extracted query."""
    return sql_shape(extracted)


def register_style(data_source: str, fn: StyleFn) -> None:
    """Use ``fn(response_text, extracted_answer) -> label | None`` for ``data_source``: the
    ``style`` hook of its benchmark profile (:mod:`divrl.profiles`)."""
    update_profile(data_source, style=fn)


def get_style_fn(data_source: str) -> StyleFn | None:
    """The style function of ``data_source``: its benchmark profile's, else None (no style).
    ``ValueError`` for a data source with no verifier."""
    fn = profile_hook(data_source, "style")
    if fn is not None:
        return fn
    from divrl.rewards import get_verifier

    get_verifier(data_source)  # an unknown data source is an error, not "no style"
    return None


def solution_style(data_source: str, text: str, extracted: str | None) -> str | None:
    """The style label of one response (None when the data source has no style function)."""
    fn = get_style_fn(data_source)
    return None if fn is None else fn(text, extracted)
