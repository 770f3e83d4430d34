"""Benchmark profiles (divrl/profiles.py): one registration, read by every lookup."""

from __future__ import annotations

import json
import sqlite3

import pytest

from divrl.data import load_examples
from divrl.data.loading import DataValidationError
from divrl.profiles import BenchmarkProfile, get_profile, register_profile, update_profile
from divrl.rewards import FunctionVerifier, get_verifier


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
