"""The batch keys divrl adds to verl's TensorDicts (one place, so a rename is one edit).

verl's old-log-prob pass writes ``old_log_probs`` and its reference pass ``ref_log_prob``;
divrl's keys carry the ``divrl_`` prefix so neither pass overwrites them.
"""

#: ``[B]`` bool: the row is a DPH-RL rehearsal row (a stored sample of the initial policy)
IS_REFERENCE = "divrl_is_reference"
#: ``[B, R]`` (nested like ``old_log_probs``): the stored log-probs of a rehearsal row's
#: response under the initial policy (0 on rollout rows)
REF_LOG_PROB = "divrl_ref_log_prob"
#: ``[B, 2]`` int64: per row, its mini-batch's rollout and reference (response) tokens, all
#: ranks together (the DPH stream weights)
STREAM = "divrl_stream"
#: ``[B]`` float64: DPH-RL's eta for this step, set by the rehearsal controller on every
#: joined row (absent: ``divrl.divergence_coef``)
ETA = "divrl_eta"
#: model outputs of the logits processor: Lp-Reg's proxy log-prob and log Z per token
PROXY_LOG_PROB = "divrl_proxy_log_prob"
LOG_NORMALIZER = "divrl_log_normalizer"

ALL = (IS_REFERENCE, REF_LOG_PROB, STREAM, ETA, PROXY_LOG_PROB, LOG_NORMALIZER)
