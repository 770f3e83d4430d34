"""Test-only: every call of divrl's actor loss in a verl worker, dumped for recomputation.

With ``DIVRL_VERL_DUMP=<folder>`` set, :func:`install` (called by :mod:`tests_verl.cpu_verl`
when a worker joins its process group, after verl and the plugin are imported) wraps
``DivRLLoss.loss``: each update micro-batch's inputs are padded here, independently of the
plugin (``no_padding_2_padding`` and ``to_padded_tensor``, as verl's ``ppo_loss`` does), and
saved with the loss the plugin returned and the DPH term (``_reference_part``'s value) it
computed, one ``<pid>_<n>.pt`` file per call.
"""

from __future__ import annotations

import itertools
import os

import torch

ENV = "DIVRL_VERL_DUMP"
_COUNTER = itertools.count()


def _padded_inputs(model_output: dict, data) -> dict:
    from verl.workers.utils.padding import no_padding_2_padding

    from divrl.integrations.verl import keys

    out = {"log_prob": no_padding_2_padding(model_output["log_probs"], data).detach()}
    if keys.PROXY_LOG_PROB in model_output:
        out[keys.PROXY_LOG_PROB] = no_padding_2_padding(
            model_output[keys.PROXY_LOG_PROB], data
        ).detach()
    fields = ["response_mask", "old_log_probs", "advantages"]
    fields += [k for k in (*keys.ALL, "rollout_is_weights") if k in data and k not in out]
    out.update(data.select(*fields).to_padded_tensor().to_dict())
    for name in ("dp_size", "batch_num_tokens", "global_batch_size"):
        out[name] = data[name]
    return out


def install() -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    from divrl.integrations.verl import losses

    if getattr(losses.DivRLLoss.loss, "dumps", False):
        return
    loss_fn, reference_part = losses.DivRLLoss.loss, losses.DivRLLoss._reference_part

    def _reference(self, t, rows):
        value, metrics = reference_part(self, t, rows)
        if int(t["response_mask"].sum()) > 0:  # not the masked-out call for metric names
            self._dumped_reference = value.detach()
        return value, metrics

    def loss(self, model_output, data):
        self._dumped_reference = None
        value, metrics = loss_fn(self, model_output, data)
        if "advantages" in data.keys():  # noqa: SIM118 (TensorDict keys)
            record = _padded_inputs(model_output, data)
            record["loss"] = value.detach()
            record["reference_term"] = self._dumped_reference
            record["metrics"] = {
                k: float(m.values[0] if hasattr(m, "values") else m) for k, m in metrics.items()
            }
            os.makedirs(folder, exist_ok=True)
            torch.save(record, os.path.join(folder, f"{os.getpid()}_{next(_COUNTER)}.pt"))
        return value, metrics

    loss.dumps = True
    losses.DivRLLoss.loss = loss
    losses.DivRLLoss._reference_part = _reference
