"""``divrl eval``'s own parts: the summary table in logs, eval-set names, length default."""

import pytest

from divrl.cli import main
from divrl.commands.eval import (
    DEFAULT_MAX_NEW_TOKENS,
    check_set_name,
    default_max_new_tokens,
    print_summary_table,
)


def summary(acc):
    ks = [1, 2, 4, 8, 16, 32, 64, 128]
    return {
        "ks": ks,
        "n_prompts": 1000,
        "greedy_accuracy": 0.123456,
        "mean_accuracy": acc,
        "pass@k": {str(k): acc + k / 1000 for k in ks},
        "maj@k": {"128": 0.654321},
    }


def test_table_is_not_cut_when_stdout_is_not_a_terminal(capsys):
    name = "a_rather_long_eval_set_name_from_a_real_benchmark_suite"
    print_summary_table({name: summary(0.5), "test": summary(0.25)}, title="divrl eval: m")
    out = capsys.readouterr().out  # captured: not a terminal
    assert name in out and "…" not in out
    assert "0.628" in out and "0.654" in out  # P@128 and maj@128 of the first row, whole
    header = next(line for line in out.splitlines() if "P@1 " in line)
    assert "mean acc" not in out  # it always equalled P@1
    assert len(header) > 80  # wider than the 80 columns rich assumes without a terminal
    assert header.count("P@1 ") == 1


def test_table_shows_the_diversity_of_the_samples_and_explains_it(capsys):
    with_styles = summary(0.5) | {
        "diversity": {
            "mean_distinct_styles": 2.3456,
            "mean_trace_clusters": 1.8,
            "mean_answer_clusters": 3.125,
            "distinct_2": 0.4567,
            "self_bleu": 0.8123,
        }
    }
    no_classifier = summary(0.25) | {
        "diversity": {
            "mean_trace_clusters": 4.0,
            "mean_answer_clusters": 1.0,
            "distinct_2": 0.2,
            "self_bleu": 0.99,
        }
    }
    print_summary_table({"math": with_styles, "own": no_classifier})
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "P@1 " in line).split()
    for column in ("styles", "traces", "answers", "dist-2", "self-BLEU"):
        assert column in header
        assert any(line.startswith(f"  {column}: ") for line in lines)  # explained once
    rows = {cells[0]: cells for cells in map(_cells, lines) if cells}
    assert rows["math"][-5:] == ["2.35", "1.80", "3.12", "0.46", "0.81"]
    assert rows["own"][-5:] == ["-", "4.00", "1.00", "0.20", "0.99"]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("│") if c.strip()]


@pytest.mark.parametrize(
    "name", ["<img src=x onerror=alert(1)>", "../x", "a/b", "..", ".hidden", "", "a b", "x\\y"]
)
def test_unsafe_set_names_are_refused(name):
    with pytest.raises(ValueError, match="is not allowed"):
        check_set_name(name)


@pytest.mark.parametrize("name", ["test", "ood_math", "gsm8k-v1.2", "set+extra", "A1"])
def test_safe_set_names_pass(name):
    assert check_set_name(name) == name


def test_eval_refuses_a_path_like_set_name_before_writing_anything(tmp_path, capsys):
    data = tmp_path / "set.jsonl"
    data.write_text('{"prompt": "1+1?", "data_source": "math", "ground_truth": "2"}\n')
    out = tmp_path / "deep" / "out"
    for spec in (f"../x={data}", f"<img src=x onerror=alert(1)>={data}"):
        assert main(["eval", "--model", "toy", "--data", spec, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "is not allowed" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set.jsonl"]


class _Config:
    def __init__(self, context):
        self.max_position_embeddings = context


class _Model:
    def __init__(self, context):
        self.config = _Config(context)


def test_default_max_new_tokens_fits_the_context():
    assert default_max_new_tokens(_Model(128)) == 80  # the toy model: the presets' value
    assert default_max_new_tokens(_Model(32768)) == DEFAULT_MAX_NEW_TOKENS
    assert default_max_new_tokens(object()) == DEFAULT_MAX_NEW_TOKENS
