import random

import pytest

from divrl.evaluation.styles import solution_style, sql_shape
from divrl.rewards import compute_score
from divrl.toy import toy_math, toy_sql

CFG = toy_sql.ToySQLConfig(n_train_dbs=3, n_cross_dbs=1, rows=12, parents=3)


def _world(seed, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    train, cross = toy_sql.make_schemas(CFG, seed)
    dbs = [toy_sql.make_database(s, CFG, seed) for s in train + cross]
    paths = {
        db.schema.db_id: toy_sql.write_sqlite(db, tmp_path / f"{db.schema.db_id}.sqlite")
        for db in dbs
    }
    return dbs, paths


def _sql_score(query, q, paths):
    extra = {"db_path": str(paths[q.db.db_id])}
    return compute_score("toy_sql", query, toy_sql.gold_query(q), extra)


def test_sql_generator_is_deterministic_per_seed(tmp_path):
    a, paths_a = _world(1, tmp_path / "a")
    b, paths_b = _world(1, tmp_path / "b")
    c, _ = _world(2, tmp_path / "c")
    assert a == b
    assert a != c
    for db_id in paths_a:  # identical SQLite contents
        assert paths_a[db_id].read_bytes() == paths_b[db_id].read_bytes()
    qa = toy_sql.sample_questions(random.Random(5), a, 40, CFG, 0.5)
    qb = toy_sql.sample_questions(random.Random(5), b, 40, CFG, 0.5)
    assert [toy_sql.prompt_text(q) for q, _ in qa] == [toy_sql.prompt_text(q) for q, _ in qb]
    ra = [toy_sql.sample_response(q, db, random.Random(i), CFG) for i, (q, db) in enumerate(qa)]
    rb = [toy_sql.sample_response(q, db, random.Random(i), CFG) for i, (q, db) in enumerate(qb)]
    assert ra == rb


def test_train_and_cross_schemas_share_no_table_pair():
    train, cross = toy_sql.make_schemas(toy_sql.ToySQLConfig(), 0)
    assert {(s.child, s.parent) for s in train}.isdisjoint({(s.child, s.parent) for s in cross})


def test_every_style_of_every_question_scores_1_and_mistakes_score_0(tmp_path):
    dbs, paths = _world(0, tmp_path)
    rng = random.Random(0)
    questions = toy_sql.sample_questions(rng, dbs, 60, CFG, hard_share=0.5)
    assert {q.family for q, _ in questions} == set(toy_sql.FAMILIES)
    for q, _db in questions:
        for style in toy_sql.STYLES[q.family]:
            query = toy_sql.render(q, style)
            assert sql_shape(query) == toy_sql.STYLE_SHAPES[style]
            assert _sql_score(query, q, paths) == 1.0, (q, style)
        if q.hard:  # the majority style's habitual mistake changes the answer
            wrong = toy_sql.gold_query(toy_sql.systematic_mistake(q))
            assert _sql_score(wrong, q, paths) == 0.0, wrong
    assert _sql_score("SELECT nm FROM nosuchtable", questions[0][0], paths) == 0.0


def test_sft_responses_follow_the_style_rates_and_error_model(tmp_path):
    dbs, _ = _world(0, tmp_path)
    rng = random.Random(0)
    cfg = toy_sql.ToySQLConfig(n_train_dbs=3, n_cross_dbs=1, rows=12, parents=3)
    hard_ok, easy_ok, majority = [], [], []
    for _ in range(3000):
        db = rng.choice(dbs[:3])
        q = toy_sql.sample_question(rng, db, "count", rng.random() < 0.5)
        _query, style, ok = toy_sql.sample_response(q, db, rng, cfg)
        if style == "count_star":
            (hard_ok if q.hard else easy_ok).append(ok)
        majority.append(style == "count_star")
    # style rate is 0.6/0.25 renormalised over count's two styles
    assert sum(majority) / len(majority) == pytest.approx(0.6 / 0.85, abs=0.03)
    slip = cfg.random_errors[0] * cfg.family_error_scale[0]
    assert sum(easy_ok) / len(easy_ok) == pytest.approx(1 - slip, abs=0.03)
    assert sum(hard_ok) / len(hard_ok) < 0.3


def test_toy_sql_styles_are_distinct_under_the_one_sql_classifier():
    """Every family's styles get different sql_shape labels (what divrl eval counts)."""
    for family, styles in toy_sql.STYLES.items():
        shapes = [toy_sql.STYLE_SHAPES[s] for s in styles]
        assert len(set(shapes)) == len(shapes), family
    assert set(toy_sql.STYLE_SHAPES) == {s for styles in toy_sql.STYLES.values() for s in styles}
    # the toy world's style registry labels toy SQL by shape and toy math by method
    assert solution_style("toy_sql", "", "SELECT COUNT(nm) FROM item WHERE pr>3") == "count(col)"
    assert solution_style("toy_math", "4*9+5=41. \\boxed{41}", "41") == "expr"


def test_math_generator_is_deterministic_and_gold_scores_1():
    a = [toy_math.sample_problem(random.Random(f"m{i}")) for i in range(50)]
    b = [toy_math.sample_problem(random.Random(f"m{i}")) for i in range(50)]
    assert a == b
    assert {p.template for p in a} == set(toy_math.TEMPLATES)
    for p in a[:20]:
        for method in toy_math.METHODS:
            text = toy_math.render(p, method)
            assert toy_math.math_style(text) == method
            assert compute_score("toy_math", text, str(p.answer)) == 1.0, text
        slipped = toy_math.render(p, "steps", slip=2, slip_first=True)
        assert compute_score("toy_math", slipped, str(p.answer)) == 0.0, slipped


def test_math_answers_are_the_arithmetic():
    assert toy_math.MathProblem("mul_add", 4, 9, 5, "nuts").answer == 41
    assert toy_math.MathProblem("mul_sub", 4, 9, 5, "cups").answer == 31
    assert toy_math.MathProblem("sub_add", 40, 15, 8, "pens").answer == 33
    p = toy_math.MathProblem("mul_add", 4, 9, 5, "nuts")
    assert toy_math.render(p, "steps") == "4*9=36, 36+5=41. \\boxed{41}"
    assert toy_math.render(p, "expr") == "4*9+5=41. \\boxed{41}"
    assert toy_math.render(p, "direct", slip=-1) == "\\boxed{40}"
