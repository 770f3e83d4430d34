"""DPH-RL or Lp-Reg with TRL's GRPOTrainer, launched the way TRL's own scripts are.

    accelerate launch examples/trl/grpo_divrl.py --config examples/trl/dph_js.yaml
    accelerate launch examples/trl/grpo_divrl.py --config examples/trl/lp_reg.yaml \\
        --loss_options '{"rho": 0.02}'

Every field of ``DivRLGRPOConfig`` (TRL's ``GRPOConfig`` plus divrl's) and of
``DivRLScriptArguments`` below is a command-line flag and a key of the ``--config`` YAML
(``TrlParser``); flags override the file. The prompts come from a divrl data file with
divrl's prompt ids (``trl_dataset``, the ``data.*`` settings of the presample config), the
rewards from divrl's verifiers (``verifier_reward``). docs/trl.md, "Launch scripts".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DivRLScriptArguments:
    """The model and the prompts (the ``model.path`` / ``data.*`` settings of divrl)."""

    model_name_or_path: str = field(
        metadata={
            "help": "Model folder or hub id: the initial policy the store was presampled from."
        }
    )
    train_path: str = field(
        metadata={"help": "divrl data file (verl schema) the store was presampled on."}
    )
    template: str = field(default="plain", metadata={"help": "data.template of the presample."})
    max_prompt_length: int = field(
        default=512, metadata={"help": "data.max_prompt_length of the presample."}
    )
    truncation: str = field(
        default="error",
        metadata={"help": "data.truncation of the presample: error, drop or left."},
    )
    limit: int | None = field(default=None, metadata={"help": "data.limit: the first N prompts."})
    db_dir: str | None = field(
        default=None, metadata={"help": "SQLite databases of SQL prompts (data.db_dir)."}
    )


def main(argv: list[str] | None = None):
    """Parse ``argv`` (the command line when None), train, save; returns the trainer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import TrlParser

    from divrl.integrations.trl import (
        DivRLGRPOConfig,
        DivRLGRPOTrainer,
        trl_dataset,
        verifier_reward,
    )

    parser = TrlParser((DivRLScriptArguments, DivRLGRPOConfig))
    script, args = parser.parse_args_and_config(args=argv)
    tokenizer = AutoTokenizer.from_pretrained(script.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(script.model_name_or_path)
    dataset = trl_dataset(
        script.train_path,
        tokenizer,
        template=script.template,
        max_prompt_length=script.max_prompt_length,
        truncation=script.truncation,
        limit=script.limit,
        db_dir=script.db_dir,
        context=model.config.max_position_embeddings,  # refuse prompts that fill it, now
    )
    trainer = DivRLGRPOTrainer(
        model=model,
        reward_funcs=verifier_reward,
        args=args,
        train_dataset=dataset,  # DPH-RL keeps the store's exploration prompts itself
        processing_class=tokenizer,
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)
    trainer.end()
    return trainer


if __name__ == "__main__":
    main()
