import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from divrl.rewards import compute_score
from divrl.toy import SIZES, build_tokenizer, ensure_toy_world, read_rows
from divrl.toy.world import PRETRAINED_DIR, shipped_key, world_key


def test_shipped_model_matches_the_full_settings():
    # a change to any generator/model/training setting of the full world changes its key:
    # rebuild and re-ship (divrl toy build --retrain --ship) or the shipped copy goes unused
    assert shipped_key() == world_key(0, "full", SIZES["full"])
    shipped = json.loads((PRETRAINED_DIR / "tokenizer.json").read_text())
    assert shipped["model"]["vocab"] == build_tokenizer().backend_tokenizer.get_vocab()


@pytest.mark.slow
def test_full_world_uses_the_shipped_model(tmp_path):
    start = time.time()
    world = ensure_toy_world(tmp_path, size="full", progress=False)
    assert time.time() - start < 60  # data only: the model is copied, not trained
    assert world.manifest["model_source"] == f"shipped with divrl (divrl/toy/{PRETRAINED_DIR.name})"
    model = AutoModelForCausalLM.from_pretrained(world.model_dir).eval()
    tok = AutoTokenizer.from_pretrained(world.model_dir)
    rows = read_rows(world.splits["test"])[:32]
    enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small decode steps: a second thread only spin-waits
    try:
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=48)
    finally:
        torch.set_num_threads(threads)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = [
        compute_score(r["data_source"], t, r["reward_model"]["ground_truth"], r["extra_info"])
        for r, t in zip(rows, texts, strict=True)
    ]
    # greedy decoding picks the majority style, which is right on most easy prompts
    assert sum(scores) >= 10, texts


def test_a_shared_cache_names_the_shipped_model_not_another_checkout():
    from divrl.toy.world import model_source_label

    # what an older version recorded when another checkout built the shared cache
    old = "/home/someone/other-checkout/divrl/toy/pretrained_countdown"
    assert model_source_label(old) == "shipped with divrl (divrl/toy/pretrained_countdown)"
    assert model_source_label("trained") == "trained"
