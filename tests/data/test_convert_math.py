"""`divrl data convert math|gsm8k` on tiny fixture trees in the official layouts."""

import json
import sys
from pathlib import Path

import pytest

from divrl.cli import main
from divrl.data import load_examples
from divrl.data.converters import LayoutError, get_converter
from divrl.rewards import compute_score

SOLUTION = "We add: $1+2=3$, so the sum is $\\boxed{3}$. Earlier we wrote \\boxed{5} by mistake."


def make_math_tree(root: Path) -> Path:
    """MATH's layout: <split>/<subject>/<n>.json with problem/level/type/solution."""
    problems = {
        ("algebra", "1"): ("1+2=", "\\boxed{5} was wrong; the answer is \\boxed{3}"),
        ("algebra", "10"): ("2+2=", "So $\\boxed{\\frac{8}{2}}$."),
        ("algebra", "2"): ("3+3=", "It is \\boxed{6}."),
        ("geometry", "4"): ("4+4=", "\\boxed{8}"),
    }
    for (subject, n), (problem, solution) in problems.items():
        folder = root / "MATH" / "train" / subject
        folder.mkdir(parents=True, exist_ok=True)
        row = {"problem": problem, "level": "Level 1", "type": subject, "solution": solution}
        (folder / f"{n}.json").write_text(json.dumps(row))
    return root / "MATH"


def make_math500(root: Path) -> Path:
    rows = [
        {
            "problem": "1+1=",
            "solution": "\\boxed{2}",
            "answer": "2",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        },
        {
            "problem": "5+5=",
            "solution": "so \\boxed{10}",
            "answer": "10",
            "subject": "Algebra",
            "level": 2,
            "unique_id": "test/algebra/2.json",
        },
    ]
    root.mkdir(parents=True, exist_ok=True)
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def make_gsm8k(root: Path) -> Path:
    rows = [
        {"question": "1+2=", "answer": "1+2=<<1+2=3>>3\n#### 3"},
        {"question": "Tom has 1,000 and 250 more.", "answer": "1000+250=1250\n#### 1,250"},
        {"question": "5+6=", "answer": "#### 11"},
    ]
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_math_layout_gold_is_the_last_box_of_the_solution(tmp_path):
    src = make_math_tree(tmp_path)
    examples = get_converter("math").convert(src, "train")
    assert [e.id for e in examples] == [
        "math-train-algebra-1",
        "math-train-algebra-2",
        "math-train-algebra-10",
        "math-train-geometry-4",
    ]
    assert [e.ground_truth for e in examples] == ["3", "6", "\\frac{8}{2}", "8"]
    first = examples[0]
    assert first.data_source == "math"
    assert first.prompt[0]["content"].startswith("1+2=\n\nPlease reason step by step")
    assert first.extra_info == {
        "index": "math-train-algebra-1",
        "split": "train",
        "level": "Level 1",
        "type": "algebra",
    }
    assert compute_score(first.data_source, "so \\boxed{3}", first.ground_truth) == 1.0


def test_math500_uses_the_answer_field(tmp_path):
    src = make_math500(tmp_path / "m500")
    examples = get_converter("math").convert(src, "test", template="Q: {problem}")
    assert [e.ground_truth for e in examples] == ["2", "10"]
    assert examples[0].id == "test/algebra/1.json"
    assert examples[1].prompt[0]["content"] == "Q: 5+5="


def test_gsm8k_gold_is_the_number_after_hashes(tmp_path):
    src = make_gsm8k(tmp_path / "gsm")
    examples = get_converter("gsm8k").convert(src, "train")
    assert [e.ground_truth for e in examples] == ["3", "1250", "11"]
    assert {e.data_source for e in examples} == {"gsm8k"}
    assert compute_score("gsm8k", "1000 + 250 = 1250\n#### 1,250", examples[1].ground_truth) == 1.0


def test_limit_and_seed_sample_in_source_order(tmp_path):
    src = make_math_tree(tmp_path)
    convert = get_converter("math").convert
    a = [e.id for e in convert(src, "train", limit=2, seed=1)]
    assert a == [e.id for e in convert(src, "train", limit=2, seed=1)]
    all_ids = [e.id for e in convert(src, "train")]
    assert len(a) == 2 and a == [i for i in all_ids if i in a]
    seeds = {tuple(e.id for e in convert(src, "train", limit=2, seed=s)) for s in range(10)}
    assert len(seeds) > 1


@pytest.mark.parametrize(
    "mutate, where, field",
    [
        (
            lambda p: p.write_text(json.dumps({"question": "x", "solution": "\\boxed{1}"})),
            "1.json",
            "problem",
        ),
        (
            lambda p: p.write_text(json.dumps({"problem": "x", "solution": "no box"})),
            "1.json",
            "solution",
        ),
        (lambda p: p.write_text("{oops"), "1.json", None),
    ],
)
def test_math_layout_errors_name_file_and_field(tmp_path, mutate, where, field):
    src = make_math_tree(tmp_path)
    mutate(src / "train" / "algebra" / "1.json")
    with pytest.raises(LayoutError) as info:
        get_converter("math").convert(src, "train")
    assert where in str(info.value)
    if field:
        assert info.value.field == field and repr(field) in str(info.value)


def test_wrong_split_or_layout_says_what_was_expected(tmp_path):
    with pytest.raises(LayoutError, match="MATH-500"):
        get_converter("math").convert(make_math_tree(tmp_path), "dev")
    src = make_gsm8k(tmp_path / "gsm")
    (src / "data" / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "7"}) + "\n")
    with pytest.raises(LayoutError, match=r"train.jsonl: line 1: field 'answer'"):
        get_converter("gsm8k").convert(src, "train")
    with pytest.raises(LayoutError, match=r"test\.jsonl"):
        get_converter("gsm8k").convert(src, "test")
    with pytest.raises(ValueError, match=r"available fields: \{problem\}"):
        get_converter("math").convert(make_math500(tmp_path / "m"), "test", template="{question}")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_cli_converts_to_loadable_files(tmp_path, capsys, suffix):
    out = tmp_path / f"gsm{suffix}"
    src = make_gsm8k(tmp_path / "gsm")
    argv = ["data", "convert", "gsm8k", "--src", str(src), "--split", "train", "--out", str(out)]
    assert main([*argv, "--limit", "2", "--seed", "3"]) == 0
    assert "wrote 2 examples (gsm8k)" in capsys.readouterr().out
    loaded = load_examples(out)
    assert len(loaded) == 2 and all(e.data_source == "gsm8k" for e in loaded)
    # a layout error is exit code 2 with the file named, and the old output is kept
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*argv[:4], str(empty), *argv[5:], "--overwrite"]) == 2
    assert "no GSM8K split 'train'" in capsys.readouterr().err
    assert len(load_examples(out)) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "make_tree", "template"),
    [("math", make_math_tree, "Q:{problem}"), ("gsm8k", make_gsm8k, "Q:{question}")],
)
def test_converted_math_trains_two_steps(tmp_path, kind, make_tree, template):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from train_helpers import build_tiny_lm, tiny_overrides

    src = make_tree(tmp_path / "src")
    data = tmp_path / "train.parquet"
    argv = ["data", "convert", kind, "--src", str(src), "--split", "train", "--out", str(data)]
    assert main([*argv, "--template", template]) == 0
    assert {e.data_source for e in load_examples(data)} == {kind}
    world = {"model": str(build_tiny_lm(tmp_path / "model")), "data": str(data)}
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(world, run_dir, **{"train.total_steps": 2})
    assert main(["train", *overrides]) == 0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r][-1] == 2
