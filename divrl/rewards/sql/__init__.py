"""SQL scoring parts: extraction (:mod:`.extract`), safe execution (:mod:`.database`),
result comparison profiles (:mod:`.compare`) and the byte-bounded gold cache
(:mod:`.gold_cache`). The verifier itself is :class:`divrl.rewards.sql_reward.SqlVerifier`.
"""
