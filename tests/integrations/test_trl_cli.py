"""TRL's conventions: the divrl fields parse with HfArgumentParser / TrlParser (flags and a
YAML config) and serialise with the config; the launch script in examples/trl/."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from divrl.algorithms import LpRegOptions
from divrl.integrations.trl import DivRLGRPOConfig

CPU = ["--use_cpu", "--bf16", "false", "--report_to", "none"]


def test_loss_options_parse_as_json_with_hf_argument_parser(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(DivRLGRPOConfig)
    flags = ["--output_dir", str(tmp_path), "--lp_reg", "--loss_options", '{"rho": 0.02}']
    (args,) = parser.parse_args_into_dataclasses([*flags, *CPU])
    assert args.lp_reg_options.rho == 0.02
    assert args.lp_reg_options.kappa == LpRegOptions.kappa  # unset ones keep the defaults
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
    assert (args.lp_reg_options.rho, args.lp_reg_options.beta) == (0.05, 0.5)
    assert args.epsilon_high == 9.0
    (args,) = TrlParser(DivRLGRPOConfig).parse_args_and_config(
        ["--config", str(config), "--loss_options", '{"rho": 0.1}']
    )
    assert (args.lp_reg_options.rho, args.lp_reg_options.beta) == (0.1, LpRegOptions.beta)


def test_the_config_serialises_the_lp_reg_options_it_runs_with(tmp_path):
    from transformers import HfArgumentParser

    args = DivRLGRPOConfig(
        output_dir=str(tmp_path), lp_reg=True, loss_options={"rho": 0.03}, use_cpu=True, bf16=False
    )
    saved = json.loads(args.to_json_string())
    expected = {"rho": 0.03, "beta": 1.0, "kappa": 0.02, "min_k": 2}
    assert saved["loss_options"] == expected  # the defaults the run used, written out
    assert saved["lp_reg"] is True
    # the saved options rebuild the same ones (TRL's own fields do not round-trip through
    # to_dict: generation_batch_size and steps_per_generation are both written out)
    flags = ["--output_dir", str(tmp_path), "--lp_reg", *CPU]
    (again,) = HfArgumentParser(DivRLGRPOConfig).parse_args_into_dataclasses(
        [*flags, "--loss_options", json.dumps(saved["loss_options"])]
    )
    assert again.lp_reg_options == args.lp_reg_options
    with pytest.raises(ValueError, match="JSON object"):
        DivRLGRPOConfig(
            output_dir=str(tmp_path), lp_reg=True, loss_options="rho=0.1", use_cpu=True, bf16=False
        )
