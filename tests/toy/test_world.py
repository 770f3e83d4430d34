import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from divrl.cli import main
from divrl.data import load_examples
from divrl.rewards import compute_score
from divrl.toy import ANSWER_MARKER, SPLITS, ensure_toy_world, read_rows
from divrl.toy.measure import MeasureConfig, check_targets, measure_base_model
from divrl.toy.sql_world import TARGETS
from divrl.toy.worlds import WORLDS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = tmp_path_factory.mktemp("toy")
    start = time.time()
    world = ensure_toy_world(cache, size="tiny", progress=False)
    return world, cache, time.time() - start


@pytest.mark.slow
def test_tiny_build_is_cached(tiny):
    world, cache, build_seconds = tiny
    start = time.time()
    again = ensure_toy_world(cache, size="tiny", progress=False)
    assert again.root == world.root
    assert time.time() - start < min(1.0, build_seconds / 5)
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # no leftovers
    other = ensure_toy_world(cache, size="tiny", seed=1, progress=False)
    assert other.root != world.root
    assert read_rows(other.splits["train"]) != read_rows(world.splits["train"])


@pytest.mark.slow
def test_tiny_splits_are_valid_and_gold_scores_1(tiny):
    world, _, _ = tiny
    assert set(world.splits) == set(SPLITS)
    prompts = {}
    for split, path in world.splits.items():
        examples = load_examples(path)  # validates the verl schema and the databases
        rows = read_rows(path)
        assert len(examples) == len(rows) == world.manifest["splits"][split] > 0
        assert all(r["prompt"].endswith(ANSWER_MARKER) for r in rows)
        prompts[split] = {r["prompt"] for r in rows}
        for row in rows[:8]:
            gold = row["reward_model"]["ground_truth"]
            assert compute_score(row["data_source"], gold, gold, row["extra_info"]) == 1.0
    assert prompts["train"].isdisjoint(prompts["test"])
    train_dbs = {r["extra_info"]["db_id"] for r in read_rows(world.splits["train"])}
    cross_dbs = {r["extra_info"]["db_id"] for r in read_rows(world.splits["cross_domain"])}
    assert train_dbs.isdisjoint(cross_dbs)


@pytest.mark.slow
def test_tiny_model_reloads_and_generates(tiny):
    world, _, _ = tiny
    model = AutoModelForCausalLM.from_pretrained(world.model_dir)
    tok = AutoTokenizer.from_pretrained(world.model_dir)
    assert model.config.model_type == "llama" and model.dtype == torch.float32
    prompt = read_rows(world.splits["test"])[0]["prompt"]
    enc = tok([prompt], return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**enc, do_sample=True, max_new_tokens=12, top_k=0)
    text = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert out.shape[1] > enc["input_ids"].shape[1] and isinstance(text, str)


@pytest.mark.slow
def test_measure_reports_every_split(tiny):
    world, _, _ = tiny
    m = measure_base_model(
        world, MeasureConfig(n_samples=4, n_train_samples=2, max_prompts=4), progress=False
    )
    assert set(m["splits"]) == set(SPLITS)
    test = m["splits"]["test"]
    assert 0.0 <= test["pass@1"] <= test["pass@2"] <= test["pass@4"] <= 1.0
    assert len(check_targets(m, TARGETS)) == 5
    assert (world.root / "measurements.json").exists()


@pytest.mark.slow
def test_divrl_toy_build_prints_world_and_measurements(tiny, capsys):
    world, cache, _ = tiny
    argv = ["toy", "build", "--size", "tiny", "--cache-dir", str(cache), "--quiet"]
    (world.root / "measurements.json").unlink(missing_ok=True)
    assert main(argv) == 0  # cached: no rebuild, no sampling
    out = capsys.readouterr().out
    assert str(world.root) in out and "cross_domain" in out and "pass@1" not in out
    assert "not measured" in out
    assert main([*argv, "--measure", "--max-prompts", "2", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "test pass@1" in out and "ood_math" in out  # the measured table and the checks


def test_divrl_toy_build_does_not_sample_unless_asked(tmp_path, capsys, monkeypatch):
    from divrl.toy import measure

    monkeypatch.setattr(measure, "measure_base_model", lambda *a, **k: pytest.fail("sampled"))
    argv = ["toy", "build", "--size", "tiny", "--cache-dir", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    assert "not measured: `divrl toy build --measure`" in capsys.readouterr().out


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_divrl_toy_input_errors_are_one_line_and_exit_2(world, tmp_path, capsys):
    argv = ["toy", "build", "--world", world, "--quiet"]
    assert main([*argv, "--size", "huge", "--cache-dir", str(tmp_path)]) == 2
    assert f"--world {world}: unknown {world} world size 'huge'" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("mine")
    for cache in (tmp_path / "a_file", tmp_path / "a_file" / "sub"):
        assert main([*argv, "--cache-dir", str(cache)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "is a file, not a folder" in err
    assert (tmp_path / "a_file").read_text() == "mine"


@pytest.mark.slow
def test_measure_counts_styles_like_divrl_eval(tiny, tmp_path):
    """``divrl toy measure`` and ``divrl eval`` sample the same responses and report the
    same Pass@k and distinct styles per prompt (one metric, one classifier)."""
    from divrl.evaluation.runner import evaluate

    world, _, _ = tiny
    cfg = MeasureConfig(n_samples=4, n_train_samples=2, max_prompts=6)
    m = measure_base_model(world, cfg, progress=False)["splits"]
    for split in ("test", "ood_math"):
        s = evaluate(world.model_dir, world.splits[split], tmp_path / split, cfg.eval_config(4))
        assert m[split]["pass@4"] == pytest.approx(s["pass@k"]["4"])
        styles = s["diversity"]["mean_distinct_styles"]
        assert m[split]["distinct_styles"] == pytest.approx(styles if styles is not None else 0.0)


@pytest.mark.slow
def test_world_registry(tiny, monkeypatch):
    from divrl.toy import worlds

    world, cache, _ = tiny
    assert worlds.get_world("sql", cache, size="tiny", progress=False).root == world.root
    assert worlds.load_world(world.root).root == world.root  # kind from world.json
    assert worlds.eval_splits(world) == ["test", "cross_domain", "ood_math"]
    with pytest.raises(ValueError, match="unknown world 'nope'"):
        worlds.get_world("nope", cache)
    # a new kind is one entry: its builder and loader by dotted path, imported on use
    kind = worlds.WorldKind("divrl.toy.world:ensure_toy_world", "divrl.toy.world:ToyWorld.load")
    monkeypatch.setitem(worlds.WORLDS, "sql_again", kind)
    again = worlds.get_world("sql_again", cache, size="tiny", progress=False)
    assert again.root == world.root
    assert worlds.load_world(world.root, "sql_again").splits == world.splits
