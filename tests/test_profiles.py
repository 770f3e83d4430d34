"""Benchmark profiles (divrl/profiles.py): one registration, read by every lookup."""

from __future__ import annotations

import json
import sqlite3

import pytest

from divrl.data import load_examples
from divrl.data.converters import converter_names, get_converter
from divrl.data.loading import DataValidationError
from divrl.evaluation.equivalence import (
    ExactEquivalence,
    MathEquivalence,
    SqlResultEquivalence,
    get_equivalence,
)
from divrl.evaluation.styles import get_style_fn, sql_style
from divrl.profiles import BenchmarkProfile, get_profile, register_profile, update_profile
from divrl.rewards import (
    FunctionVerifier,
    MathVerifier,
    SqlVerifier,
    get_verifier,
    register_verifier,
)
from divrl.rewards.countdown_reward import CountdownVerifier
from divrl.toy.styles import countdown_style, toy_math_style


def test_a_profile_is_found_by_any_name_and_refuses_a_second_registration():
    verifier = FunctionVerifier(lambda s, gt, info: 1.0, isolate=False)
    profile = register_profile(BenchmarkProfile("prof_a", ("prof_alias",), verifier=verifier))
    assert get_profile("PROF_ALIAS") is profile and get_verifier("prof_alias")[0] == "prof_a"
    with pytest.raises(ValueError, match=r"\['prof_alias'\] already registered"):
        register_profile(BenchmarkProfile("prof_b", ("prof_alias",)))
    with pytest.raises(ValueError, match=r"\['math'\] already registered .*verifier"):
        register_profile(BenchmarkProfile("math", verifier=verifier))  # a built-in verifier
    replaced = register_profile(BenchmarkProfile("prof_a", style=str.upper), replace=True)
    assert get_profile("prof_a") is replaced


def test_update_profile_adds_one_hook_and_register_keeps_it():
    update_profile("prof_c", style=str.lower)
    verifier = FunctionVerifier(lambda s, gt, info: 0.0, isolate=False)
    profile = register_profile(BenchmarkProfile("prof_c", verifier=verifier))
    assert profile.style is str.lower
    with pytest.raises(ValueError, match="a verifier is registered with the profile"):
        update_profile("prof_c", verifier=verifier)


def test_needs_database_makes_loading_resolve_and_check_the_database(tmp_path):
    verifier = FunctionVerifier(lambda s, gt, info: 0.0, isolate=False)
    register_profile(BenchmarkProfile("prof_db", verifier=verifier, needs_database=True))
    row = {"data_source": "prof_db", "prompt": "q", "reward_model": {"ground_truth": "a"}}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataValidationError, match=r"need extra_info\.db_path or extra_info\.db_id"):
        load_examples(path)
    sqlite3.connect(tmp_path / "x.sqlite").execute("CREATE TABLE t (a INT)").connection.close()
    row["extra_info"] = {"db_id": "x"}
    path.write_text(json.dumps(row) + "\n")
    (example,) = load_examples(path, db_dir=tmp_path)
    assert example.extra_info["db_path"] == str(tmp_path / "x.sqlite")


# every built-in data source (names and aliases) -> its verifier's class and rule, the
# equivalence that clusters its answers, its style classifier, its database need and the
# converter registered under its profile's name (None: no converter)
_MATH = (MathVerifier, "math", MathEquivalence, None, False)
_SQL = (SqlVerifier, "sql", SqlResultEquivalence, sql_style, True)
BUILTIN = {
    "math": (*_MATH, "divrl.data.converters.math"),
    "aime24": (*_MATH, "divrl.data.converters.math"),
    "HuggingFaceH4/MATH-500": (*_MATH, "divrl.data.converters.math"),
    "gsm8k": (MathVerifier, "gsm8k", MathEquivalence, None, False, "divrl.data.converters.gsm8k"),
    "openai/gsm8k": (MathVerifier, "gsm8k", MathEquivalence, None, False, None),
    "math_verify": (MathVerifier, "math_verify", MathEquivalence, None, False, None),
    "bird": (SqlVerifier, "bird", *_SQL[2:], "divrl.data.converters.bird"),
    "bird_dev": (SqlVerifier, "bird", *_SQL[2:], None),
    "spider": (SqlVerifier, "spider", *_SQL[2:], "divrl.data.converters.spider"),
    "spider_dev": (SqlVerifier, "spider", *_SQL[2:], None),
    "sql": (*_SQL, None),
    "text2sql": (*_SQL, None),
    "toy_sql": (*_SQL, None),
    "toy_math": (MathVerifier, "math", MathEquivalence, toy_math_style, False, None),
    "countdown": (CountdownVerifier, None, ExactEquivalence, countdown_style, False, None),
    "toy_countdown": (CountdownVerifier, None, ExactEquivalence, countdown_style, False, None),
}


@pytest.mark.parametrize("source", sorted(BUILTIN))
def test_every_builtin_data_source_resolves_through_its_profile(source):
    kind, rule, equivalence, style, needs_db, converter = BUILTIN[source]
    profile = get_profile(source)
    assert profile is not None, f"{source} has no benchmark profile"
    verifier = get_verifier(source)[1]
    assert isinstance(verifier, kind)
    if rule is not None:
        assert rule in (verifier.profile, getattr(verifier.profile, "name", None))
    assert type(get_equivalence(source)) is equivalence
    assert get_style_fn(source) is style
    assert profile.needs_database is needs_db
    if converter is not None:
        assert get_converter(profile.name).__name__ == converter


def test_the_toy_sources_share_the_verifier_objects_of_their_benchmarks():
    assert get_verifier("toy_math")[1] is get_verifier("math")[1]
    assert get_verifier("toy_sql")[1] is get_verifier("sql")[1]
    # other tests of the session may register profiles of their own with converters
    assert {"bird", "gsm8k", "math", "spider"} <= set(converter_names())
    assert not {"toy_math", "sql", "countdown"} & set(converter_names())


def test_a_verifier_without_a_profile_gets_no_hook_from_its_type(tmp_path):
    # the lookups read the profile registry only: an SQL verifier registered on its own is
    # clustered by exact equality, has no style and loads without a database
    register_verifier("prof_bare_sql")(SqlVerifier(profile="sql"))
    assert type(get_equivalence("prof_bare_sql")) is ExactEquivalence
    assert get_style_fn("prof_bare_sql") is None
    row = {"data_source": "prof_bare_sql", "prompt": "q", "reward_model": {"ground_truth": "a"}}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    assert "db_path" not in load_examples(tmp_path / "rows.jsonl")[0].extra_info
    with pytest.raises(ValueError, match="unknown data_source 'prof_nowhere'"):
        get_equivalence("prof_nowhere")


def test_math_trace_styles_follow_the_profile_not_the_verifier_type():
    from divrl.evaluation.summary import text_diversity

    assert {
        s
        for s in ("math", "gsm8k", "math_verify", "toy_math", "sql", "bird", "countdown")
        if get_profile(s).math_traces
    } == {"math", "gsm8k", "math_verify", "toy_math"}
    texts = ["x + 2 = 4 so x = 2", "2 + 2 = 4", "the answer is 2", "2"]
    row = {"texts": texts, "clusters": [0, 0, 0, 0]}
    assert "mean_math_trace_styles" in text_diversity([{**row, "data_source": "math"}])
    # a math verifier registered without a profile gets no math measure from its type
    register_verifier("prof_bare_math")(MathVerifier(profile="math"))
    assert "mean_math_trace_styles" not in text_diversity(
        [{**row, "data_source": "prof_bare_math"}]
    )
    register_profile(BenchmarkProfile("prof_proofs", math_traces=True))
    assert "mean_math_trace_styles" in text_diversity([{**row, "data_source": "prof_proofs"}])
