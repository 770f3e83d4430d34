"""The verl plugin logs Lp-Reg's regime diagnostics through its metric path: a micro-batch's
logged values equal a hand computation over the tokens the loss regularised."""

from __future__ import annotations

import math

import torch
from verl.workers.utils.padding import no_padding_2_padding

from divrl.algorithms import logit_stats, lp_reg_selection
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.settings import DivRLVerlSettings
from tests_verl.builders import micro_batches, rollout_rows
from tests_verl.test_losses import actor_config
from tests_verl.test_lp_reg import VOCAB, _response, engine_outputs


def test_the_logged_z_advantage_and_net_push_equal_a_hand_computation():
    kappa, beta = 0.5, 0.5
    settings = DivRLVerlSettings(
        policy_loss="lp_reg", loss_options={"kappa": kappa, "rho": 1.0, "beta": beta}
    )
    loss_fn = DivRLLoss(actor_config(clip_ratio_low=1.0, clip_ratio_high=9.0), settings)
    (micro,) = micro_batches(rollout_rows(6, seed=3), 6)
    nnz = micro["input_ids"].values().shape[0]
    logits = torch.randn(nnz, VOCAB, generator=torch.Generator().manual_seed(5)) * 0.5
    out = engine_outputs(loss_fn, micro, logits)
    _, metrics = loss_fn(model_output=out, data=micro)
    labels = torch.roll(micro["input_ids"].values(), -1)
    stats = logit_stats(logits, labels, 1.0, with_entropy=False, minp_kappa=kappa)
    proxy = _response(stats.proxy_log_prob, micro)
    log_z = _response(stats.log_normalizer, micro)
    lp = no_padding_2_padding(out["log_probs"], micro).detach()
    t = micro.select("old_log_probs", "advantages", "response_mask").to_padded_tensor()
    adv, old = t["advantages"], t["old_log_probs"]
    reg = lp_reg_selection(lp, proxy, adv, t["response_mask"], 1.0, 2).regularized
    nets, zs, advs = [], [], []
    for i, j in reg.nonzero().tolist():
        a = float(adv[i, j] if adv.dim() == 2 else adv[i])
        d = float(proxy[i, j] - lp[i, j])
        pull = math.expm1(d) if math.expm1(d) - d < 10 else 0.0
        nets.append(a * math.exp(float(lp[i, j] - old[i, j])) + beta * pull)
        zs.append(math.exp(float(log_z[i, j])))
        advs.append(abs(a))
    ups = sum(n > 0 for n in nets)
    assert 0 < ups < len(nets), (ups, len(nets))  # pushed up and down both

    def logged(name: str) -> float:
        return metrics[f"lp_reg/{name}"].aggregate()

    assert logged("num_net_up") == ups
    assert math.isclose(logged("net_up_share"), ups / len(nets), rel_tol=1e-9)
    assert math.isclose(logged("net_push_mean"), sum(nets) / len(nets), rel_tol=1e-4)
    assert math.isclose(logged("reg_z_mean"), sum(zs) / len(zs), rel_tol=1e-5)
    assert math.isclose(logged("reg_abs_adv_mean"), sum(advs) / len(advs), rel_tol=1e-5)
