"""TRL's conventions: the divrl fields parse with HfArgumentParser / TrlParser (flags and a
YAML config) and serialise with the config; the launch script in examples/trl/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from trl_helpers import PROMPTS, tiny_model, tiny_tokenizer, write_store

pytest.importorskip("trl")

from divrl.algorithms import LpRegOptions
from divrl.integrations.trl import DivRLGRPOConfig

ROOT = Path(__file__).resolve().parents[2]
CPU = ["--use_cpu", "--bf16", "false", "--report_to", "none"]


def test_loss_options_parse_as_json_with_hf_argument_parser(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(DivRLGRPOConfig)
    flags = ["--output_dir", str(tmp_path), "--lp_reg", "--loss_options", '{"rho": 0.02}']
    (args,) = parser.parse_args_into_dataclasses([*flags, *CPU])
    assert args.policy_loss_options.rho == 0.02
    assert args.policy_loss_options.kappa == LpRegOptions.kappa  # unset ones keep the defaults
    with pytest.raises(ValueError, match=r"loss_options: .*kappa=2\.0 must be in"):
        parser.parse_args_into_dataclasses(
            [*flags[:-1], '{"kappa": 2.0}', *CPU]  # out of bounds: the bound's message
        )


def test_trl_parser_reads_divrl_fields_from_yaml_and_flags_override(tmp_path):
    from trl import TrlParser

    config = tmp_path / "run.yaml"
    config.write_text(
        f"output_dir: {tmp_path}\nlp_reg: true\nloss_options:\n  rho: 0.05\n  beta: 0.5\n"
        "epsilon_high: 9.0\nuse_cpu: true\nbf16: false\nreport_to: none\n"
    )
    (args,) = TrlParser(DivRLGRPOConfig).parse_args_and_config(["--config", str(config)])
    assert (args.policy_loss_options.rho, args.policy_loss_options.beta) == (0.05, 0.5)
    assert args.epsilon_high == 9.0
    (args,) = TrlParser(DivRLGRPOConfig).parse_args_and_config(
        ["--config", str(config), "--loss_options", '{"rho": 0.1}']
    )
    assert (args.policy_loss_options.rho, args.policy_loss_options.beta) == (0.1, LpRegOptions.beta)


def test_the_config_serialises_the_policy_loss_options_it_runs_with(tmp_path):
    from transformers import HfArgumentParser

    args = DivRLGRPOConfig(
        output_dir=str(tmp_path), lp_reg=True, loss_options={"rho": 0.03}, use_cpu=True, bf16=False
    )
    saved = json.loads(args.to_json_string())
    expected = {"rho": 0.03, "beta": 1.0, "kappa": 0.02, "min_k": 2, "full_vocab": False}
    assert saved["loss_options"] == expected  # the defaults the run used, written out
    assert saved["lp_reg"] is True and saved["policy_loss"] == "lp_reg"
    # the saved options rebuild the same ones (TRL's own fields do not round-trip through
    # to_dict: generation_batch_size and steps_per_generation are both written out)
    flags = ["--output_dir", str(tmp_path), "--lp_reg", *CPU]
    (again,) = HfArgumentParser(DivRLGRPOConfig).parse_args_into_dataclasses(
        [*flags, "--loss_options", json.dumps(saved["loss_options"])]
    )
    assert again.policy_loss_options == args.policy_loss_options
    with pytest.raises(ValueError, match="JSON object"):
        DivRLGRPOConfig(
            output_dir=str(tmp_path), lp_reg=True, loss_options="rho=0.1", use_cpu=True, bf16=False
        )


# ----------------------------------------------------------------------------- launch script

EXAMPLES = ROOT / "examples" / "trl"


def launch_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("grpo_divrl", EXAMPLES / "grpo_divrl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def data_file(path: Path) -> Path:
    """A divrl data file (verl schema) of the tiny prompts, ids p0, p1, ..."""
    rows = [
        {
            "data_source": "math",
            "prompt": prompt,
            "reward_model": {"style": "rule", "ground_truth": "1"},
            "extra_info": {"index": f"p{i}"},
        }
        for i, prompt in enumerate(PROMPTS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("config", ["dph_js.yaml", "lp_reg.yaml"])
def test_launch_script_trains_with_its_yaml(tmp_path, config):
    """The script TRL's way (TrlParser, --config YAML, flags override) on the tiny model:
    only the model, data, store and scale flags are given; the method comes from the YAML."""
    model_dir = tmp_path / "model"
    tiny_model(0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    store = write_store(tmp_path / "store", tiny_model(0), tiny_tokenizer(), exploration=2)
    flags = [
        *("--config", str(EXAMPLES / config)),
        *(
            "--model_name_or_path",
            str(model_dir),
            "--train_path",
            str(data_file(tmp_path / "d.jsonl")),
        ),
        *("--output_dir", str(tmp_path / "out"), "--max_prompt_length", "16"),
        *("--max_completion_length", "6", "--num_generations", "4"),
        *("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"),
        *("--max_steps", "1", "--save_strategy", "no", "--learning_rate", "1e-2", *CPU),
    ]
    if config == "dph_js.yaml":
        flags += ["--reference_store", str(store)]
    else:
        flags += ["--loss_options", '{"rho": 0.5}']
    trainer = launch_script().main(flags)
    assert trainer.state.global_step == 1
    (logged,) = [h for h in trainer.state.log_history if "loss" in h]
    if config == "dph_js.yaml":
        assert trainer.args.divergence == "js" and trainer.args.divergence_coef == 0.2
        assert trainer.train_dataset["prompt_id"] == ["p4", "p5"]  # the store's exploration
        assert "divrl/dph/divergence" in logged
    else:
        assert trainer.args.policy_loss_options.rho == 0.5  # the flag over the YAML's 0.01
        assert trainer.args.policy_loss_options.kappa == 0.02 and trainer.epsilon_high == 9.0
        assert "divrl/lp_reg/num_selected" in logged
    assert (tmp_path / "out" / "model.safetensors").is_file()  # saved by the script
